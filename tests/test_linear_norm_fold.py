"""linear_norm's fold launch (the tiled scheme's second kernel) over rows of several blocks:
a masked last block, and the shipped fold on a row wider than its 8192-column cap.

The kernels run under Triton's CPU interpreter in a subprocess (Triton reads
``TRITON_INTERPRET`` when it is imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import json, torch
from harness import kinds
from harness.kinds import linear_norm
kind = kinds.get("linear_norm")
shipped = linear_norm.fold_config
knobs = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "ROW_PROGRAM": 0,
         "num_warps": 1, "num_stages": 1}
cases = [({"M": 5, "N": 40, "K": 32, "dtype": "fp32"}, (16, 4)),  # blocks of 16, 8 masked
         ({"M": 3, "N": 48, "K": 16, "dtype": "fp32"}, (16, 1)),  # three whole blocks
         ({"M": 2, "N": 8200, "K": 16, "dtype": "fp32"}, None)]  # the shipped fold: 2 blocks
got = []
for shape, fold in cases:
    linear_norm.fold_config = (lambda m, n, f=fold: f) if fold else shipped
    used = linear_norm.fold_config(shape["M"], shape["N"])
    inputs = kind.make_inputs(shape, "cpu", 0)
    inputs["out"].fill_(float("nan"))
    k = dict(knobs, BLOCK_N=64) if shape["N"] > 1000 else knobs
    kind.prepare(k, shape, inputs).run()
    ref = kind.reference(shape, inputs)
    got.append({"N": shape["N"], "fold": list(used),
                "ok": bool(torch.allclose(inputs["out"], ref, atol=1e-4, rtol=1e-4))})
print(json.dumps(got))
"""


def test_the_fold_is_right_over_rows_of_several_blocks() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [g["fold"] for g in got] == [[16, 4], [16, 1], [8192, 8]]
    assert [g["ok"] for g in got] == [True, True, True], got
