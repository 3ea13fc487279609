"""attention's Gluon kernel (``GLUON=1``, harness/kinds/_attention_gluon.py).

Without a GPU: which configurations realize where, and the kernel compiled for compute
capability 9.0 by the ptxas and nvdisasm Triton ships: no spills, and the softmax's
exponentials sit between the wait for the scores and the wait for ``P V``, i.e. they overlap
the tensor cores (the point of the kernel; ptxas undoes it when P is given in registers).
On the device (``-m gpu``): every Gluon configuration of every golden attention shape, and of
small shapes whose sequence is a multiple of 64 only, checked against the fp32 reference.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import goldens  # noqa: E402
from harness import kinds as registry  # noqa: E402
from harness.cards import DEPLOYABLE, INTERPRETER, by_alias  # noqa: E402
from tests.sm90 import ops as sass_ops  # noqa: E402
from tests.sm90 import sass_of  # noqa: E402

KIND = registry.get("attention")
SHAPE = {"batch": 1, "heads": 2, "seq": 2048, "head_dim": 128, "causal": True, "dtype": "bf16"}
GLUON = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "TMA": 1, "GLUON": 1}
# sequences a multiple of 64 (and of 128 or not: the warp-specialized kernels' 128-row tiles),
# causal and not, every head dim, both 16-bit types; seq 128 gives a program one K/V block
SMALL = [{"batch": 2, "heads": 3, "seq": seq, "head_dim": d, "causal": causal, "dtype": dt}
         for seq, d, causal, dt in ((192, 64, True, "bf16"), (192, 64, False, "fp16"),
                                    (384, 128, True, "bf16"), (256, 128, False, "bf16"),
                                    (256, 32, True, "fp16"), (384, 16, False, "bf16"),
                                    (256, 256, True, "fp16"), (128, 64, True, "fp16"))]


@pytest.fixture
def gluon_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(KIND), "gluon_pool", (1, 2, 3, 4))


def test_the_pools_take_the_warp_specialized_kernels_with_p_in_registers() -> None:
    """As shipped, a Hopper pool takes ``GLUON`` 3 and 4 (the fastest on the H100, with the
    Triton kernel at head_dim 64); 1 and 2 stay bench variants, and no other card's pool
    has the knob."""
    pool = KIND.enumerate(SHAPE, by_alias("h100"))
    assert {k.get("GLUON", 0) for k in pool} == {0, 3, 4}
    for alias in ("a100", "l40s", "b200", "rtx5090"):
        assert not any("GLUON" in k for k in KIND.enumerate(SHAPE, by_alias(alias)))


def test_the_gluon_kernel_realizes_only_where_it_can_run(gluon_pool: None) -> None:
    h100 = by_alias("h100")
    assert KIND.unrealizable(GLUON, SHAPE, h100) is None
    pool = KIND.enumerate(SHAPE, h100)
    gluon = [k for k in pool if k.get("GLUON")]
    assert gluon and len(gluon) < len(pool)
    assert all(k["TMA"] == 1 and k["BLOCK_M"] == 16 * k["num_warps"] and k["num_stages"] >= 2
               for k in gluon)
    ws = [k for k in gluon if k["GLUON"] >= 2]
    assert {k["GLUON"] for k in ws} == {2, 3, 4}
    # two consumer warpgroups or three
    assert {(k["num_warps"], k["BLOCK_M"]) for k in ws} == {(8, 128), (12, 192)}
    # not causal, every tiling of the warp-specialized kernel a program a tile and persistent,
    # the others a program a tile; causal, a program a tile (no knob: the keys as they were)
    assert not any("PERSISTENT" in k for k in pool)
    flat = KIND.enumerate({**SHAPE, "causal": False}, h100)
    flat_ws = [k for k in flat if k.get("GLUON", 0) >= 2]
    assert {k["PERSISTENT"] for k in flat_ws} == {0, 1}
    assert all({**k, "PERSISTENT": 1 - k["PERSISTENT"]} in flat for k in flat_ws)
    assert not any(k["PERSISTENT"] for k in flat if k["GLUON"] < 2)
    assert [{**k, "PERSISTENT": 0} for k in pool] == [k for k in flat if not k["PERSISTENT"]]
    # P through shared memory: the plain Gluon kernel's tiles; in registers, more stages fit
    assert all({**k, "GLUON": 1} in pool for k in ws if k["GLUON"] == 2 and k["num_warps"] == 8)
    assert {**GLUON, "GLUON": 3, "BLOCK_M": 128, "num_warps": 8, "num_stages": 3} in pool
    assert {**GLUON, "GLUON": 2, "BLOCK_M": 128, "num_warps": 8, "num_stages": 3} not in pool
    # the same tiles run by the Triton kernel stay in the pool; three consumers' are the
    # Gluon kernel's alone
    assert all({**k, "GLUON": 0} in pool for k in gluon if k["num_warps"] != 12)
    three = [k for k in gluon if k["num_warps"] == 12]
    assert three and all(k["GLUON"] >= 2 for k in three)
    assert not any(k["BLOCK_M"] == 192 or k["num_warps"] == 12 for k in pool
                   if k["GLUON"] < 2)
    for alias in ("a100", "l40s", "b200", "rtx5090"):
        assert not any(k.get("GLUON") for k in KIND.enumerate(SHAPE, by_alias(alias)))
    why = {
        "cc": KIND.unrealizable(GLUON, SHAPE, by_alias("a100")),
        "blackwell": KIND.unrealizable(GLUON, SHAPE, by_alias("b200")),
        "interpreter": KIND.unrealizable(GLUON, SHAPE, INTERPRETER),
        "pointers": KIND.unrealizable({**GLUON, "TMA": 0}, SHAPE, h100),
        "fp32": KIND.unrealizable(GLUON, {**SHAPE, "dtype": "fp32"}, h100),
        "rows": KIND.unrealizable({**GLUON, "BLOCK_M": 128}, SHAPE, h100),
        "warps": KIND.unrealizable({**GLUON, "BLOCK_M": 32, "num_warps": 2}, SHAPE, h100),
        "ragged": KIND.unrealizable(GLUON, {**SHAPE, "seq": 2000}, h100),
        "ring": KIND.unrealizable({**GLUON, "num_stages": 1}, SHAPE, h100),
        "consumers": KIND.unrealizable({**GLUON, "GLUON": 2}, SHAPE, h100),
        "value": KIND.unrealizable({**GLUON, "GLUON": 5}, SHAPE, h100),
        "persistent": KIND.unrealizable({**GLUON, "PERSISTENT": 1}, SHAPE, h100),
        "smem": KIND.unrealizable({**GLUON, "num_stages": 3}, SHAPE, h100),
    }
    assert "Hopper's (compute capability 9.x)" in why["cc"] and "(8, 0)" in why["cc"]
    # TMA runs on a Blackwell card; the Hopper warpgroup MMAs do not
    assert KIND.unrealizable({**GLUON, "GLUON": 0}, SHAPE, by_alias("b200")) is None
    assert "9.x" in why["blackwell"] and "(10, 0)" in why["blackwell"]
    assert "interpreter" in why["interpreter"]
    assert "TMA=1" in why["pointers"]
    assert "fp32" in why["fp32"]
    assert "BLOCK_M 128 with 4 warps" in why["rows"]
    assert "4 warps, not 2" in why["warps"]
    assert "seq 2000" in why["ragged"] and "(64, 128)" in why["ragged"]
    assert "2 stages" in why["ring"]
    assert "GLUON=2" in why["consumers"] and "8 or 12 warps, not 4" in why["consumers"]
    # three consumers: 192 rows, the Gluon kernel's alone; a last block past the sequence
    # by whole consumers' rows; registers for three warpgroups of 160
    three = {**GLUON, "GLUON": 4, "BLOCK_M": 192, "num_warps": 12, "num_stages": 3}
    d64 = {**SHAPE, "head_dim": 64}
    assert KIND.unrealizable({**three, "BLOCK_N": 64}, d64, h100) is None
    assert KIND.unrealizable({**three, "BLOCK_N": 128}, {**d64, "causal": False}, h100) is None
    assert "three consumer warpgroups" in KIND.unrealizable({**three, "GLUON": 0}, d64, h100)
    assert "room for 112" in KIND.unrealizable({**three, "BLOCK_N": 128}, d64, h100)
    assert "room for 128" in KIND.unrealizable({**three, "num_stages": 2}, {**SHAPE, "causal": False},
                                               h100)
    assert "(64, 128)" in KIND.unrealizable(three, {**d64, "seq": 2000}, h100)
    assert KIND.unrealizable({**three, "BLOCK_N": 64}, {**d64, "seq": 2048 + 64}, h100) is None
    assert "not 5" in why["value"]
    assert "PERSISTENT" in why["persistent"] and "GLUON 2, 3 or 4" in why["persistent"]
    assert KIND.unrealizable({**GLUON, "GLUON": 0, "PERSISTENT": 1}, SHAPE, h100)
    assert KIND.unrealizable({**GLUON, "GLUON": 2, "BLOCK_M": 128, "num_warps": 8}, SHAPE,
                             h100) is None
    # P in registers counts against them: 128x256 spills at head_dim 64 (ptxas, sm_90)
    wide = {**GLUON, "BLOCK_M": 128, "BLOCK_N": 256, "num_warps": 8, "num_stages": 3}
    d64 = {**SHAPE, "head_dim": 64}
    assert KIND.unrealizable({**wide, "GLUON": 0}, d64, h100) is None
    assert "registers" in KIND.unrealizable({**wide, "GLUON": 3}, d64, h100)
    # Q 16 KiB + 3 stages of K and V 192 KiB + two P tiles 32 KiB: past the 227 KiB opt-in
    assert "shared memory" in why["smem"]


def test_the_pool_is_the_realizable_part_of_the_knob_product(gluon_pool: None) -> None:
    """Every configuration of the knob product that realizes, in its order: three consumer
    warpgroups (192 rows, 12 warps) realize where no Triton configuration of those tiles
    does, so no knob of the kind is enumerated lazily."""
    import itertools

    h100 = by_alias("h100")
    assert not KIND.monotone
    for g in goldens.shapes(DEPLOYABLE, kinds=["attention"]):
        space = KIND.knob_space(g.shape, h100)
        assert "GLUON" in space and 192 in space["BLOCK_M"] and 12 in space["num_warps"]
        keys = list(space)
        product = [dict(zip(keys, values, strict=True))
                   for values in itertools.product(*(space[k] for k in keys))]
        pool = KIND.enumerate(g.shape, h100)
        assert pool == [k for k in product if KIND.realizable(k, g.shape, h100)]
        assert any(k["BLOCK_M"] == 192 for k in pool)


def _sass(knobs: dict[str, Any], shape: dict[str, Any], cache: Path) -> tuple[str, str]:
    """(nvdisasm's SASS, cuobjdump's resource usage) of one configuration, compiled for
    compute capability 9.0, launched as ``prepare`` launches it (``gluon_launch``)."""
    return sass_of(f"""
from harness.kinds import _attention_gluon
from harness.kinds.attention import gluon_launch
knobs, shape = {knobs!r}, {shape!r}
name, q_rows, launch = gluon_launch(knobs, shape)
d, bn = shape["head_dim"], knobs["BLOCK_N"]
t = torch.empty(4096, d, dtype=torch.bfloat16, device="meta")
sig = {{}}
for arg, rows in (("q_desc", q_rows), ("k_desc", bn), ("v_desc", bn), ("o_desc", q_rows)):
    layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)
    sig[arg] = mangle_type(TensorDescriptor.from_tensor(t, [rows, d], layout))
sig.update(qk_scale="fp32", SEQ="i32")
attrs = {{}}
if name == "gluon_attention_ws_kernel":  # the output as a launch passes it: 16-byte aligned
    sig.update(out="*bf16", ZH="i32")
    attrs[(list(sig).index("out"),)] = [["tt.divisibility", 16]]
const = {{k: v for k, v in launch.items() if k != "maxnreg"}}
sig.update({{k: "constexpr" for k in const}})
options = {{k: launch[k] for k in ("num_warps", "maxnreg") if k in launch}}
ck = triton.compile(GluonASTSource(getattr(_attention_gluon, name), sig, const, attrs),
                    target=GPUTarget("cuda", 90, 32), options=options)
""", cache)


def _point(gluon: int, bm: int, bn: int, d: int, warps: int, stages: int, causal: bool,
           persistent: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    knobs = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "TMA": 1,
             "GLUON": gluon, "PERSISTENT": persistent}
    return knobs, {"batch": 1, "heads": 1, "seq": 4096, "head_dim": d, "causal": causal,
                   "dtype": "bf16"}


def _waits(ops: list[tuple[str, str]], outstanding: str) -> list[int]:
    return [i for i, (op, args) in enumerate(ops)
            if op == "WARPGROUP.DEPBAR.LE" and args.strip().endswith(outstanding)]


@pytest.mark.slow
@pytest.mark.parametrize("config", [(1, 64, 128, 128, 4, 2, True), (1, 128, 128, 128, 8, 2, False),
                                    (1, 64, 64, 64, 4, 3, False)])
def test_the_softmax_overlaps_p_v_on_the_tensor_cores(config: tuple[Any, ...],
                                                      tmp_path: Path) -> None:
    pytest.importorskip("torch")
    knobs, shape = _point(*config)
    sass, usage = _sass(knobs, shape, tmp_path)
    assert re.search(r"STACK:0 ", usage) and "LOCAL:0" in usage, usage
    ops = sass_ops(sass)
    # the loop's wait for the scores (one MMA group still in flight: P V), then for P V
    first = _waits(ops, "0x1")[0]
    second = next(i for i in _waits(ops, "0x0") if i > first)
    exps = sum(op == "MUFU.EX2" for op, _ in ops[first:second])
    # the scores one thread exponentiates per block
    per_thread = knobs["BLOCK_M"] * knobs["BLOCK_N"] // (32 * knobs["num_warps"])
    assert exps >= per_thread, (
        f"{exps} of the block's {per_thread} exponentials per thread run while P V is on the "
        f"tensor cores")


@pytest.mark.slow
@pytest.mark.parametrize("config", [(2, 128, 128, 128, 8, 2, False), (3, 128, 128, 128, 8, 3, True),
                                    (4, 128, 64, 64, 8, 2, True), (3, 128, 128, 64, 8, 5, True),
                                    (4, 128, 64, 256, 8, 2, False), (4, 192, 128, 64, 12, 4, False),
                                    (3, 192, 64, 64, 12, 3, True), (4, 192, 64, 128, 12, 3, True),
                                    (3, 128, 128, 128, 8, 3, False, 1),
                                    (4, 128, 64, 64, 8, 4, True, 1),
                                    (4, 192, 64, 64, 12, 3, True, 1)])
def test_the_warp_specialized_consumers_meet_at_no_block_wide_barrier(config: tuple[Any, ...],
                                                                      tmp_path: Path) -> None:
    """``GLUON=2``, ``3`` and ``4`` (the fourth and fifth configurations: the pools' largest
    tiles of two consumers at head_dim 64 and 256; the last three, three consumers): no
    spill, and the warpgroup MMAs pipelined (ptxas waits after every one of them when it
    spills or cannot pipeline); every barrier in a consumer warpgroup's loop is of its 128
    threads alone (the loader refills a stage when every consumer has arrived on its
    barrier); the loader warp keeps 24 registers, two consumers 240 each, three 160.  With P
    through shared memory (``GLUON=2``) each loop also overlaps its softmax with its own
    ``P V``; with P in registers ptxas waits for ``P V`` first, and only the other warpgroup
    overlaps it.  ``GLUON=4`` passes the turn right after issuing its MMAs.  The last three
    are persistent (``PERSISTENT=1``): the same loops inside the tile loop, and the output
    stored from registers, not by TMA."""
    pytest.importorskip("torch")
    knobs, shape = _point(*config)
    assert KIND.realizable(knobs, shape, by_alias("h100"))
    sass, usage = _sass(knobs, shape, tmp_path)
    assert re.search(r"STACK:0 ", usage) and "LOCAL:0" in usage, usage
    ops = sass_ops(sass)
    mmas = sum(op.startswith("HGMMA") for op, _ in ops)
    waits = sum(op == "WARPGROUP.DEPBAR.LE" for op, _ in ops)
    assert 4 * waits <= mmas, f"{waits} waits for {mmas} warpgroup MMAs: serialized"
    loops = _waits(ops, "0x1")
    consumers = knobs["num_warps"] // 4
    assert len(loops) == consumers, f"{len(loops)} consumer loops"  # one a consumer warpgroup
    per_thread = 64 * knobs["BLOCK_N"] // 128
    for first in loops:
        second = next(i for i in _waits(ops, "0x0") if i > first)
        # from the first block's wait (before the loop) to the arrival that lets a K/V stage
        # go and the barrier after it
        start = max(i for i in _waits(ops, "0x0") if i < first)
        end = next(i for i, (op, _) in enumerate(ops[second:], second)
                   if op.startswith("SYNCS.ARRIVE"))
        exps = sum(op == "MUFU.EX2" for op, _ in ops[first:second])
        if knobs["GLUON"] == 2:
            assert exps >= per_thread, f"{exps} of {per_thread} exponentials overlap P V"
        bars = [args for op, args in ops[start:end + 2] if op.startswith("BAR.SYNC")]
        assert bars and all(a.strip().endswith(", 0x80") for a in bars), bars
        issued = max(i for i in range(first) if ops[i][0].startswith("HGMMA"))
        passes = any(op.startswith("SYNCS.ARRIVE") for op, _ in ops[issued:first])
        assert passes == (knobs["GLUON"] == 4), ops[issued:first]
    tma_stores = sum(op.startswith("UTMASTG") for op, _ in ops)
    stores = sum(op.startswith("STG") for op, _ in ops)
    if knobs["PERSISTENT"]:
        assert tma_stores == 0 and stores == consumers * 64 * shape["head_dim"] // 256, stores
    else:
        assert tma_stores == consumers and stores == 0, (tma_stores, stores)
    regs = {args.strip() for op, args in ops if op.startswith("USETMAXREG")}
    consumer_regs = "0xf0" if consumers == 2 else "0xa0"  # 240 or 160
    assert {"0x18", consumer_regs} <= {r.split(",")[-1].strip() for r in regs}, regs


@pytest.mark.gpu
def test_every_gluon_configuration_matches_the_reference(
        gluon_pool: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Every Gluon configuration of every golden attention shape, and a seeded four of each
    ``GLUON`` value of each small shape's, compiled ahead on the box's cores and checked by the
    bench worker (the check every sweep point passes before it is timed)."""
    from tests.live_gpu import check_points, hopper_card

    card = hopper_card("cannot run the Gluon kernel")
    if card.cc[0] != 9:
        pytest.skip(f"{card.name} (compute capability {card.cc}): the Gluon kernel's warpgroup "
                    f"MMAs are Hopper's")
    points: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = []
    for g in goldens.shapes(DEPLOYABLE, kinds=["attention"]):
        gluon = [k for k in KIND.enumerate(g.shape, card) if k.get("GLUON")]
        assert gluon, f"{g.shape_id}: no Gluon configuration on {card.name}"
        points += [(g.shape_id, g.shape, "gluon", k) for k in gluon]
    for i, shape in enumerate(SMALL):
        pool = KIND.enumerate(shape, card)
        assert any(k.get("GLUON") for k in pool), f"small{i}: no Gluon configuration"
        for value in (1, 2, 3, 4):  # a seeded four of each kernel form
            gluon = [k for k in pool if k.get("GLUON") == value]
            points += [(f"small{i}", shape, "gluon", k)
                       for k in random.Random(i).sample(gluon, min(4, len(gluon)))]
        # and of three consumer warpgroups (192 rows: seq 256 and 128 end in a block that
        # has only one consumer's rows in the sequence)
        three = [k for k in pool if k["num_warps"] == 12]
        points += [(f"small{i}", shape, "gluon", k)
                   for k in random.Random(i).sample(three, min(4, len(three)))]
    lines, failures = check_points("attention", points, card)
    with capsys.disabled():
        print(f"\n{card.name}: {len(points)} Gluon configurations\n" + "\n".join(lines))
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [GLUON, {**GLUON, "GLUON": 3, "BLOCK_M": 128, "num_warps": 8}],
                         ids=["gluon1", "gluon3"])
def test_the_box_compiles_gluon_points_ahead_without_a_gpu(knobs: dict[str, Any],
                                                           tmp_path: Path) -> None:
    """The box's compile pool (``compile_point`` on ``meta`` inputs, the target given) builds
    a Gluon point as it does a Triton one, so a sweep's Gluon points are compiled ahead too."""
    pytest.importorskip("torch")
    import json
    import os

    code = """
import json, sys
from harness.box.compiler import _warm, compile_point
_warm(("cuda", 90, 32))
shape, knobs = json.loads(sys.argv[1])
print(json.dumps(compile_point("attention", shape, knobs)))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([SHAPE, knobs])], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in answer, answer
    from harness.kinds.attention import gluon_launch

    name = gluon_launch(knobs, SHAPE)[0]
    assert any((tmp_path / "cache").rglob(f"{name}.cubin"))


def test_the_persistent_bench_plans_both_forms_of_each_tiling() -> None:
    """``bench/attention_persistent.py --list``: every golden attention shape, each planned
    configuration one tile a program, its persistent twin realizable on the card."""
    r = subprocess.run([sys.executable, "bench/attention_persistent.py", "--list", "--gpu",
                        "h100"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    from harness.points import parse_spec

    h100 = by_alias("h100")
    shapes = {g.shape_id: g.shape for g in goldens.shapes(DEPLOYABLE, kinds=["attention"])}
    planned: dict[str, list[dict[str, int]]] = {}
    for line in r.stdout.splitlines():
        if not line.startswith(" "):
            current = planned.setdefault(line.split(":")[0], [])
        else:
            current.append({k: int(v) for k, v in parse_spec(line.strip()).items()})
    assert set(planned) == set(shapes)
    for shape_id, configs in planned.items():
        assert configs, shape_id
        pool = KIND.enumerate(shapes[shape_id], h100)
        for k in configs:
            assert k["PERSISTENT"] == 0 and k["GLUON"] >= 2
            assert KIND.realizable({**k, "PERSISTENT": 1}, shapes[shape_id], h100)
            if shapes[shape_id]["causal"]:  # measured by the bench, not pooled
                assert {k2: v for k2, v in k.items() if k2 != "PERSISTENT"} in pool
            else:
                assert k in pool and {**k, "PERSISTENT": 1} in pool, (shape_id, k)
