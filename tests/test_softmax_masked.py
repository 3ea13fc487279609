"""softmax over masked logits (whole blocks of -inf, as a vocabulary or causal mask leaves
them): every path gives torch's result, however the row is dealt to blocks and programs.

The kernels run in a subprocess: under Triton's CPU interpreter (Triton reads
``TRITON_INTERPRET`` when it is imported), and compiled for the live card in the ``gpu`` test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import json, sys, torch
from harness import kinds
dev = sys.argv[1]
kind = kinds.get("softmax")
shape = {"M": 3, "N": 256, "dtype": "fp32"}
x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0)) * 3
x[0, :64] = float("-inf")      # the first block of the row
x[1, 64:192] = float("-inf")   # two middle blocks: the middle splits of four
x[2, 128:] = float("-inf")     # the last half: the second split of two
x = x.to(dev)
ref = torch.softmax(x, dim=-1)
base = {"BLOCK_N": 64, "ROWS": 1, "ONE_PASS": 0, "SPLIT": 1, "num_warps": 1,
        "num_stages": 1, "EVICT": 0}
cases = [{}, {"ROWS": 2}, {"SPLIT": 2}, {"SPLIT": 4}, {"SPLIT": 2, "ROWS": 4},
         {"BLOCK_N": 256, "ONE_PASS": 1}, {"EVICT": 1, "SPLIT": 2}]
bad = []
for c in cases:
    knobs = {**base, **c}
    out = torch.full_like(x, float("nan"))
    kind.prepare(knobs, shape, {"x": x, "out": out}).run()
    ok = bool(torch.allclose(out, ref, atol=1e-6, rtol=1e-5))
    if not ok:
        bad.append({"knobs": c, "nan_rows": [i for i in range(3) if out[i].isnan().any()],
                    "max_err": float((out - ref).abs().nan_to_num(float("inf")).max())})
print(json.dumps({"cases": len(cases), "bad": bad}))
"""


def _run(device: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, device], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_masked_blocks_of_a_row_give_torchs_softmax_on_every_path() -> None:
    got = _run("cpu", dict(os.environ, TRITON_INTERPRET="1"))
    assert got["cases"] == 7
    assert got["bad"] == []


@pytest.mark.gpu
def test_masked_blocks_on_the_live_gpu() -> None:
    """The same rows and knob sets, compiled for the card (the interpreter does not round
    exp and max the way the GPU's code does)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    got = _run("cuda", env)
    assert got["cases"] == 7
    assert got["bad"] == []
