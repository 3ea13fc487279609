"""bench/attention_variants.py: its reordered attention kernels compute what SDPA does.

The interpreter runs them on small ragged shapes, causal and not (Triton reads
``TRITON_INTERPRET`` when it is imported, so the script runs in a subprocess of its own)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.bench_scripts import ROOT


def test_the_attention_variants_match_the_reference_in_the_interpreter() -> None:
    r = subprocess.run([sys.executable, "bench/attention_variants.py", "--check-only", "--tiny"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "wrong results: 0 of 12 configurations checked" in r.stdout
    for variant in ("kernel", "ahead", "halves"):
        assert r.stdout.count(f" {variant} ") == 2  # each tiny shape, causal and not
    # the Gluon kernels do not run in the interpreter: said, not counted as checked
    assert "gluon: skipped (it runs on a GPU of compute capability 9.x)" in r.stdout
    for variant in ("gluon_ws", "gluon_ws_regs", "gluon_pingpong"):
        assert f"{variant}: skipped (it runs on a GPU of compute capability 9.x)" in r.stdout
