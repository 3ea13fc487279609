"""The causal attention grid's program order (``head_group``, ``causal_order``): the heads in
groups whose K and V fill about 8 MiB, each group's programs longest rows first across its
heads.  The kernels run in the Triton interpreter, in a subprocess (Triton reads
``TRITON_INTERPRET`` when it is imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import goldens  # noqa: E402
from harness.cards import DEPLOYABLE  # noqa: E402
from harness.kinds.attention import attention_grid, head_group  # noqa: E402


def test_the_group_of_each_golden_shape() -> None:
    """A group's K and V fill 8 MiB: 4 heads at seq 4096 and head_dim 128 (2 MiB a head),
    8 at 2048 and 128, 16 at 2048 and 64; never more heads than the shape has; not causal,
    the 2-D grid."""
    groups = {(g.shape["seq"], g.shape["head_dim"], g.shape["causal"]): head_group(g.shape)
              for g in goldens.shapes(DEPLOYABLE, kinds=["attention"])}
    assert groups == {(4096, 128, True): 4, (2048, 128, True): 8, (2048, 64, True): 16,
                      (2048, 128, False): 0, (4096, 64, False): 0}
    tiny = {"batch": 1, "heads": 3, "seq": 64, "head_dim": 16, "causal": True, "dtype": "fp16"}
    assert head_group(tiny) == 3
    assert head_group({**tiny, "seq": 1 << 20, "head_dim": 256}) == 1
    assert attention_grid(tiny, 32, 3) == (6,)
    assert attention_grid({**tiny, "causal": False}, 32, 0) == (2, 3)


_RUN = """
import json, sys
import torch, triton, triton.language as tl
import harness.kinds.attention as attention
from harness import kinds as registry
from harness.box.bench import _mismatch
from harness.cards import INTERPRETER
from harness.kinds._attention_triton import causal_order

@triton.jit
def order_kernel(out_ptr, N_M, ZH, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    m, hz = causal_order(pid, N_M, ZH, GROUP)
    tl.store(out_ptr + 2 * pid, m)
    tl.store(out_ptr + 2 * pid + 1, hz)

order = {}
for n_m, zh, group in ((5, 7, 3), (4, 4, 4), (3, 5, 1), (6, 2, 8)):
    out = torch.full((2 * n_m * zh,), -1, dtype=torch.int32)
    order_kernel[(n_m * zh,)](out, n_m, zh, min(group, zh))
    order[f"{n_m},{zh},{group}"] = out.view(-1, 2).tolist()

# a group of 3 of the 4 heads (the last group has one): every output row written and right
kind = registry.get("attention")
shape = {"batch": 2, "heads": 2, "seq": 40, "head_dim": 16, "causal": True, "dtype": "fp32"}
attention.HEAD_GROUP_BYTES = 3 * 2 * 40 * 16 * 4
checked, wrong = 0, []
for knobs in kind.enumerate(shape, INTERPRETER):
    for tma in (0, 1):
        k = {**knobs, "TMA": tma}
        inputs = kind.make_inputs(shape, "cpu", 0)
        inputs["out"].fill_(float("nan"))
        kind.prepare(k, shape, inputs).run()
        checked += 1
        if _mismatch(inputs["out"], kind.reference(shape, inputs), *kind.tolerance("fp32")):
            wrong.append(k)
print(json.dumps({"order": order, "group": attention.head_group(shape), "checked": checked,
                  "wrong": wrong}))
"""


@pytest.mark.slow
def test_the_causal_order_runs_every_program_once_longest_first_in_the_interpreter() -> None:
    """``causal_order`` maps a 1-D grid onto every (query block, head) once, the heads in
    groups (the last one short), each group's programs longest rows first; a causal pool run
    with groups of 3 of 4 heads matches the reference on every output row, by pointers and by
    tensor descriptors."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _RUN], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for key, pairs in got["order"].items():
        n_m, zh, group = map(int, key.split(","))
        group = min(group, zh)
        assert sorted(map(tuple, pairs)) == [(m, h) for m in range(n_m) for h in range(zh)]
        for start in range(0, zh, group):  # a group's programs are contiguous in the grid
            size = min(group, zh - start)
            run = pairs[start * n_m:(start + size) * n_m]
            assert {h for _, h in run} == set(range(start, start + size))
            blocks = [m for m, _ in run]
            assert blocks == sorted(blocks, reverse=True), f"{key}: {blocks}"
            assert blocks[:size] == [n_m - 1] * size  # every head's longest block first
    assert got["group"] == 3
    assert got["checked"] >= 10 and not got["wrong"], got["wrong"][:5]


@pytest.mark.slow
def test_the_order_bench_checks_every_group_in_the_interpreter() -> None:
    """``bench/attention_order.py --check-only --tiny``: two configurations of each tiny
    causal shape (5 heads), each with groups of 1, 2, 4 and 5 heads (the short last groups
    included), every launch right."""
    r = subprocess.run([sys.executable, "bench/attention_order.py", "--check-only", "--tiny"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "wrong results: 0 of 16 launches checked" in r.stdout
    assert r.stdout.count("kind's group 5; 8 launches checked") == 2
