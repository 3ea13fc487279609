"""The GEMM template's warp-specialized Gluon paths (``GLUON`` 1 ping-pong, 2 cooperative,
harness/kinds/_gemm_gluon.py).

Without a GPU: which pools take the knob and which configurations realize, that the knob is
monotone (the lazy enumeration loses nothing), and the kernel compiled for compute capability
9.0 by the ptxas and nvdisasm Triton ships: no spills, a loader warp and two consumer
warpgroups, and no barrier in a consumer's K loop wider than its own warpgroup.  On the device
(``-m gpu``): seeded Gluon configurations of every golden prefill shape of the three kinds,
and of ragged shapes (M, N and K not multiples of the tiles, one tile in all, one K step),
checked against the fp32 reference.
"""

from __future__ import annotations

import itertools
import random
import re
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

KINDS = ("matmul", "norm_linear", "linear_norm")
OWN = {"matmul": {}, "norm_linear": {"PROLOGUE": 2}, "linear_norm": {"ROW_PROGRAM": 0}}
SHAPE = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
GLUON = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "TMA": 1,
         "PERSISTENT": 1, "SUBTILE": 0, "GLUON": 1, "num_warps": 8, "num_stages": 4}
COOP = {**GLUON, "BLOCK_N": 256, "GLUON": 2, "num_stages": 3}
# M, N and K past a multiple of every tile; one output tile (the second consumer has none);
# one K step; more tiles than two a program on any card; fp16
RAGGED = [{"M": m, "N": n, "K": k, "dtype": dt}
          for m, n, k, dt in ((1000, 1000, 1000, "bf16"), (300, 2008, 520, "fp16"),
                              (128, 128, 4096, "bf16"), (4096, 256, 64, "bf16"),
                              (2048, 4096, 72, "fp16"), (4096, 4096, 256, "bf16"))]


@pytest.fixture
def every_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pools take both forms, whichever the project ships (GEMM_GLUON_POOL)."""
    from harness.kinds import base

    monkeypatch.setattr(base, "GEMM_GLUON_POOL", base.GEMM_GLUON_FORMS)


def test_the_shipped_pools_take_the_forms_named() -> None:
    """As shipped, a Hopper pool of the three kinds takes ``GLUON`` 0 and the forms of
    GEMM_GLUON_POOL (none: no ``GLUON`` key at all, the keys as they were)."""
    from harness.kinds.base import GEMM_GLUON_POOL

    for name in KINDS:
        pool = registry.get(name).enumerate(SHAPE, by_alias("h100"))
        if GEMM_GLUON_POOL:
            assert {k["GLUON"] for k in pool} == {0, *GEMM_GLUON_POOL}
        else:
            assert not any("GLUON" in k for k in pool)


def test_the_hopper_pools_of_three_gemm_kinds_take_the_gluon_gemm(every_form: None) -> None:
    """A 9.x card's pool of matmul, norm_linear and linear_norm takes ``GLUON`` 0, 1 and 2;
    mlp_geglu's does not (its second weight), nor does any other card's, so their keys are
    what they were."""
    for name in KINDS:
        kind = registry.get(name)
        for alias in ("h100", "h200"):
            pool = kind.enumerate(SHAPE, by_alias(alias))
            assert {k.get("GLUON") for k in pool} == {0, 1, 2}, (name, alias)
            assert {**GLUON, **OWN[name]} in pool and {**COOP, **OWN[name]} in pool
        for alias in ("a100", "l40s", "b200", "rtx5090"):
            assert not any("GLUON" in k for k in kind.enumerate(SHAPE, by_alias(alias)))
    geglu = registry.get("mlp_geglu").enumerate({**SHAPE, "M": 2048}, by_alias("h100"))
    assert geglu and not any("GLUON" in k for k in geglu)


def test_the_gluon_gemm_realizes_only_where_it_can_run(every_form: None) -> None:
    h100 = by_alias("h100")
    kind = registry.get("matmul")
    whole = kind.enumerate(SHAPE, h100)
    pool = [k for k in whole if k.get("GLUON")]
    assert all(k["TMA"] == k["PERSISTENT"] == 1 and k["SUBTILE"] == 0 and k["num_warps"] == 8
               for k in pool)
    # a consumer's rows: the whole tile's in ping-pong, half in the cooperative form
    assert all(k["BLOCK_M"] // k["GLUON"] >= 64
               and k["BLOCK_M"] // k["GLUON"] * k["BLOCK_N"] <= 128 * 128 for k in pool)
    assert {(k["BLOCK_M"], k["BLOCK_N"]) for k in pool if k["GLUON"] == 2} >= {(128, 256),
                                                                                (256, 128)}
    # the Triton kernel keeps the same configurations
    keys = {tuple(sorted(k.items())) for k in whole}
    assert all(tuple(sorted({**k, "GLUON": 0}.items())) in keys for k in pool)
    why = {
        "a100": kind.unrealizable(GLUON, SHAPE, by_alias("a100")),
        "b200": kind.unrealizable(GLUON, SHAPE, by_alias("b200")),
        "interpreter": kind.unrealizable(GLUON, SHAPE, INTERPRETER),
        "pointers": kind.unrealizable({**GLUON, "TMA": 0, "PERSISTENT": 0}, SHAPE, h100),
        "subtile": kind.unrealizable({**GLUON, "SUBTILE": 1}, SHAPE, h100),
        "fp32": kind.unrealizable(GLUON, {**SHAPE, "dtype": "fp32"}, h100),
        "warps": kind.unrealizable({**GLUON, "num_warps": 4}, SHAPE, h100),
        "rows": kind.unrealizable({**GLUON, "BLOCK_M": 32}, SHAPE, h100),
        "coop rows": kind.unrealizable({**COOP, "BLOCK_M": 64, "BLOCK_N": 128}, SHAPE, h100),
        "acc": kind.unrealizable({**GLUON, "BLOCK_N": 256}, SHAPE, h100),
        "coop acc": kind.unrealizable({**COOP, "BLOCK_M": 256}, SHAPE, h100),
        "value": kind.unrealizable({**GLUON, "GLUON": 3}, SHAPE, h100),
        "smem": kind.unrealizable({**GLUON, "BLOCK_K": 128, "num_stages": 3}, SHAPE, h100),
        "prologue": registry.get("norm_linear").unrealizable({**GLUON, "PROLOGUE": 1}, SHAPE,
                                                             h100),
        "row": registry.get("linear_norm").unrealizable({**GLUON, "ROW_PROGRAM": 1,
                                                          "GROUP_M": 1}, SHAPE, h100),
    }
    assert "9.x" in why["a100"] and "(8, 0)" in why["a100"]
    assert "9.x" in why["b200"] and "(10, 0)" in why["b200"]
    assert "interpreter" in why["interpreter"]
    assert "TMA=1, PERSISTENT=1, SUBTILE=0" in why["pointers"]
    assert "TMA=1, PERSISTENT=1, SUBTILE=0" in why["subtile"]
    assert "fp32" in why["fp32"]
    assert "num_warps 8, not 4" in why["warps"]
    assert "64 rows: GLUON=1 gives each consumer 32 rows" in why["rows"]
    assert "GLUON=2 gives each consumer 32 rows of BLOCK_M 64" in why["coop rows"]
    assert "128 x 256" in why["acc"] and "128 registers" in why["acc"]
    assert "128 x 256" in why["coop acc"]
    assert "not 3" in why["value"]
    assert kind.unrealizable(COOP, SHAPE, h100) is None
    # A and B 32 KiB a stage for 3 stages, and two 32 KiB output tiles: past the opt-in
    assert "shared memory" in why["smem"]
    assert "PROLOGUE=2" in why["prologue"]
    assert "pointers" in why["row"]
    # the Triton kernel runs where the Gluon one cannot
    assert kind.unrealizable({**GLUON, "GLUON": 0, "BLOCK_N": 256, "num_stages": 3}, SHAPE,
                             h100) is None


@pytest.mark.parametrize("name", KINDS)
def test_the_gluon_knob_is_monotone(name: str, every_form: None) -> None:
    """Trying ``GLUON=1`` only where ``GLUON=0`` realizes loses no configuration: the pool is
    the realizable part of the whole knob product, in its order (a prefill and a decode
    shape of each kind)."""
    kind = registry.get(name)
    h100 = by_alias("h100")
    golden = goldens.shapes(DEPLOYABLE, kinds=[name])
    for g in (next(g for g in golden if g.shape["M"] > 64), next(g for g in golden
                                                               if g.shape["M"] <= 64)):
        space = kind.knob_space(g.shape, h100)
        assert "GLUON" in kind.monotone and "GLUON" in space
        keys = list(space)
        product = [dict(zip(keys, values, strict=True))
                   for values in itertools.product(*(space[k] for k in keys))]
        assert kind.enumerate(g.shape, h100) == [k for k in product
                                                 if kind.realizable(k, g.shape, h100)]


def _sass(knobs: dict[str, Any], epilogue: int, cache: Path) -> tuple[str, str]:
    """(nvdisasm's SASS, cuobjdump's resource usage) of one configuration, compiled for
    compute capability 9.0, launched as ``gemm_launch`` launches it."""
    return sass_of(f"""
from harness.kinds import _gemm_gluon
knobs = {knobs!r}
bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
rows = bm // knobs["GLUON"]
t = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
sig = {{}}
for arg, block in (("a_desc", [bm, bk]), ("b_desc", [bn, bk]), ("c_desc", [rows, bn])):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    sig[arg] = mangle_type(TensorDescriptor.from_tensor(t, block, layout))
sig.update(ss_ptr="*fp32", M="i32", N="i32", K="i32", stride_sm="i32", num_progs="i32")
const = dict(GROUP_M=knobs["GROUP_M"], STAGES=knobs["num_stages"], EPILOGUE={epilogue},
             COOP=knobs["GLUON"] == 2, CONSUMER_REGS=240, num_warps=4)
sig.update({{k: "constexpr" for k in const}})
ck = triton.compile(GluonASTSource(_gemm_gluon.gluon_gemm_kernel, sig, const),
                    target=GPUTarget("cuda", 90, 32), options={{"num_warps": 4, "maxnreg": 168}})
""", cache)


@pytest.mark.slow
@pytest.mark.parametrize("tile,epilogue,gluon", [
    ((128, 128, 64, 4), 0, 1), ((128, 128, 64, 4), 2, 1), ((256, 64, 64, 4), 2, 1),
    ((64, 256, 64, 3), 0, 1), ((128, 256, 64, 3), 2, 2), ((256, 128, 64, 3), 0, 2)])
def test_the_gluon_gemm_compiles_to_a_loader_and_two_consumer_warpgroups(
        tile: tuple[int, ...], epilogue: int, gluon: int, tmp_path: Path) -> None:
    """The largest accumulators of the pool, with and without the sums' epilogue: no spill;
    the loader keeps 24 registers and each consumer warpgroup takes 240; the MMAs are
    Hopper's (``HGMMA``), one K step's worth in each consumer's loop; every barrier between
    a consumer's first wait for a stage and its release of the last is of 128 threads."""
    pytest.importorskip("torch")
    bm, bn, bk, stages = tile
    knobs = {**GLUON, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": stages,
             "GLUON": gluon}
    sass, usage = _sass(knobs, epilogue, tmp_path)
    assert re.search(r"STACK:0 SHARED:\d+ LOCAL:0", usage), usage
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in sass and "0xf0" in sass
    mmas = re.findall(r"HGMMA\.64x(\d+)x16", sass)
    # a warpgroup's MMA is 64 rows: a consumer's rows / 64 of them a k16 step, BLOCK_K / 16
    # steps, in each of the two consumers' loops
    assert len(mmas) == 2 * (bm // gluon // 64) * (bk // 16) and set(mmas) == {str(bn)}
    ops = sass_ops(sass)
    waits = [i for i, (op, _) in enumerate(ops) if op == "SYNCS.PHASECHK.TRANS64.TRYWAIT"]
    arrives = [i for i, (op, _) in enumerate(ops) if op.startswith("SYNCS.ARRIVE")]
    hgmma = [i for i, (op, _) in enumerate(ops) if op.startswith("HGMMA")]
    for first, last in ((hgmma[0], hgmma[len(hgmma) // 2 - 1]), (hgmma[len(hgmma) // 2],
                                                                  hgmma[-1])):
        start = max(i for i in waits if i < first)
        end = min(i for i in arrives if i > last)
        bars = [args for op, args in ops[start:end + 1] if op.startswith("BAR.")]
        assert all(b.strip().endswith("0x80") for b in bars), bars


def _points(shape_id: str, shape: dict[str, Any], name: str, card: Any, n: int, seed: str
            ) -> list[tuple[str, dict[str, Any], str, dict[str, Any]]]:
    kind = registry.get(name)
    gluon = [k for k in kind.enumerate(shape, card) if k.get("GLUON")]
    assert gluon, f"{name} {shape_id}: no Gluon configuration on {card.name}"
    picked = []
    for value in (1, 2):  # n of each form, and the bench's favourite tiles
        of_value = [k for k in gluon if k["GLUON"] == value]
        picked += random.Random(seed).sample(of_value, min(n, len(of_value)))
        favourite = {**(GLUON if value == 1 else COOP), **OWN[name]}
        if favourite in gluon and favourite not in picked:
            picked.append(favourite)
    return [(shape_id, shape, "gluon", k) for k in picked]


@pytest.mark.gpu
@pytest.mark.parametrize("name", KINDS)
def test_the_gluon_gemm_matches_the_reference(name: str, capsys: pytest.CaptureFixture[str],
                                              every_form: None) -> None:
    """Seeded configurations of each Gluon form of every golden prefill shape (and the
    bench's favourite tiles of each) and of the ragged shapes, compiled ahead and checked by
    the bench worker."""
    from tests.live_gpu import check_points, hopper_card

    card = hopper_card("has no TMA paths")
    if card.cc[0] != 9:
        pytest.skip(f"{card.name} (compute capability {card.cc}) has no Hopper warpgroup MMAs")
    points = []
    for g in goldens.shapes(DEPLOYABLE, kinds=[name]):
        if g.shape["M"] > 64:
            points += _points(g.shape_id, g.shape, name, card, 3, g.shape_id)
    for i, shape in enumerate(RAGGED):
        points += _points(f"ragged{i}", shape, name, card, 2, f"{name}/{i}")
    lines, failures = check_points(name, points, card)
    with capsys.disabled():
        print(f"\n{card.name}: {name}, {len(points)} Gluon configurations\n" + "\n".join(lines))
    assert not failures, failures


def test_a_sweep_measures_the_gluon_gemm_nearest_each_anchor_early(every_form: None) -> None:
    """An anchor on the Triton kernel (128x256 tiles at 4 stages: too large for the ping-pong
    form's accumulator, and for the cooperative form's shared memory at 4 stages) brings the
    Gluon configurations nearest it into the own slice with its neighbours (tier 2), so a
    short sweep times the new kernel where the old one was best."""
    from harness import pools
    from harness.kinds.base import completed
    from harness.points import knob_distance, make_spec

    h200 = by_alias("h200")
    kind = registry.get("matmul")
    g = next(g for g in goldens.shapes(DEPLOYABLE, kinds=["matmul"]) if g.shape == SHAPE)
    anchor = {**GLUON, "BLOCK_N": 256, "SUBTILE": 1, "GLUON": 0}
    built = pools.build(h200, shapes=[g], anchors=[goldens.Anchor(
        gpu=h200.name, kind="matmul", shape_id=g.shape_id, spec=make_spec(anchor))])
    points = built.shapes[0].points
    twins = [p for p in points if p.knobs.get("GLUON")]
    early = [p for p in twins if p.tier == 2]
    assert early and all(p.slice == "own" for p in early)
    gluon = [k for k in kind.enumerate(SHAPE, h200) if k.get("GLUON")]
    nearest = min(knob_distance(k, anchor) for k in gluon)
    # ping-pong: BLOCK_N (or BLOCK_M), SUBTILE, GLUON; cooperative: stages, SUBTILE, GLUON
    assert nearest == 3
    assert all(knob_distance(p.knobs, anchor) == nearest for p in early)
    assert {**GLUON, "num_stages": 4} in [p.knobs for p in early]
    assert COOP in [p.knobs for p in early]
    # every other Gluon configuration is where the slicing put it, drawn at random
    assert all(p.tier == 3 for p in twins if p not in early)
    assert completed(anchor, kind.knob_space(SHAPE, h200)) in [p.knobs for p in points
                                                               if p.tier == 0]
