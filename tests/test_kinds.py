"""Kinds: every kernel against its torch reference, the pools and the golden data behind them.

The kernels run under Triton's CPU interpreter in a subprocess per kind: Triton reads
``TRITON_INTERPRET`` when it is imported, and an xdist worker may already hold a Triton
imported without it.  The same subprocess is how the box imports kinds, so this module runs
itself as that subprocess (``python tests/test_kinds.py KIND [SHAPES_JSON]``).  The ``gpu``
test measures samples of every golden pool on a real card.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # run as the interpreter subprocess: the repo root is not on the path
    sys.path.insert(0, str(ROOT))

from harness import goldens, pools  # noqa: E402
from harness import kinds as registry  # noqa: E402
from harness.cards import DEPLOYABLE, INTERPRET, INTERPRETER, by_alias, by_name  # noqa: E402
from harness.kinds.base import GEMM_GLUON_POOL  # noqa: E402
from harness.points import make_spec, parse_spec  # noqa: E402
from harness.shipped import ROW_KINDS  # noqa: E402

ALL_KINDS = registry.names()
NEW_KINDS = ["reduce", "rms_norm", "attention", "norm_linear", "mlp_geglu", "linear_norm"]
# kinds whose big tiles are bounded by shared memory (the others stage nothing through it)
SMEM_BOUND = ["matmul", "attention", "norm_linear", "mlp_geglu", "linear_norm"]
SYNTHETIC_GPU = "synthetic reference"  # plays another card in the interpreter's anchors


# -- the interpreter subprocess ----------------------------------------------------------------
def _check_pools_interpreted(kind_name: str, shapes: list[dict[str, Any]],
                             force: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run every spec of the interpreter pool of each shape (with the knobs of ``force`` set
    on each, where given); one result per spec."""

    kind = registry.get(kind_name)
    results = []
    for shape in shapes:
        inputs = kind.make_inputs(shape, "cpu", 0)
        ref = kind.reference(shape, inputs).float()
        atol, rtol = kind.tolerance(shape["dtype"])
        for knobs in kind.enumerate(shape, INTERPRETER):
            knobs = {**knobs, **(force or {})}
            inputs["out"].fill_(float("nan"))  # a kernel that skips outputs cannot pass
            launch = kind.prepare(knobs, shape, inputs)
            launch.run()
            out = launch.out.float()
            err = None
            if out.shape != ref.shape:
                err = f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
            else:
                diff = (out - ref).abs()
                bad = ~(diff <= atol + rtol * ref.abs())  # NaN counts as bad
                if bool(bad.any()):
                    err = (f"{int(bad.sum())}/{bad.numel()} off, max err "
                           f"{float(diff.nan_to_num(math.inf).max()):.3g}")
            results.append({"shape_id": kind.shape_id(shape), "spec": make_spec(knobs),
                            "error": err})
    return results


def _run_interpreted(kind_name: str, shapes: list[dict[str, Any]] | None = None,
                     force: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), kind_name,
           json.dumps(shapes), json.dumps(force)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"interpreter run of {kind_name} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _interpret_shapes(kind_name: str) -> list[goldens.GoldenShape]:
    return goldens.shapes(INTERPRET, kinds=[kind_name])


@pytest.mark.parametrize("kind_name", ALL_KINDS)
def test_interpreter_pool_matches_reference(kind_name: str) -> None:
    tiny = _interpret_shapes(kind_name)
    assert 1 <= len(tiny) <= 2, f"{kind_name}: keep 1-2 tiny interpreter shapes"
    results = _run_interpreted(kind_name)
    for g in tiny:
        ran = [r for r in results if r["shape_id"] == g.shape_id]
        pool = registry.get(kind_name).enumerate(g.shape, INTERPRETER)
        assert len(ran) == len(pool) >= 5, f"{g.shape_id}: ran {len(ran)} of {len(pool)} specs"
    failures = [r for r in results if r["error"]]
    assert not failures, f"{len(failures)} specs differ from the reference: {failures[:5]}"


# tiny ragged shapes (no tile divides them) that the copy-engine paths must read and write
# within their bounds
RAGGED_TINY = {
    "attention": [{"batch": 2, "heads": 2, "seq": seq, "head_dim": 16, "causal": causal,
                   "dtype": "fp32"} for seq, causal in ((40, True), (23, False))],
    "matmul": [{"M": 40, "N": 24, "K": 40, "dtype": "fp32"}],
}


@pytest.mark.parametrize("kind_name", list(RAGGED_TINY))
def test_the_tma_path_matches_the_reference_in_the_interpreter(kind_name: str) -> None:
    """The tensor-descriptor path of a kind, run by the Triton interpreter over its whole tiny
    pool on ragged shapes: reads past the end are zeros, stores past it are dropped, every
    output element is written (the output starts as NaN)."""
    force = ({"TMA": 1} if kind_name == "attention"
             else {"TMA": 1, "PERSISTENT": 1, "SUBTILE": 1})
    results = _run_interpreted(kind_name, RAGGED_TINY[kind_name], force)
    assert len(results) >= 10
    failures = [r for r in results if r["error"]]
    assert not failures, f"{len(failures)} specs differ from the reference: {failures[:5]}"


@pytest.mark.parametrize("kind_name", ROW_KINDS)
def test_the_row_kinds_cache_hints_keep_every_result_in_the_interpreter(kind_name: str) -> None:
    """``EVICT=1`` (evict_first on a last read, evict_last on a first pass of two and on the
    weight) changes no result: the whole tiny pool, one and two passes, split reductions."""
    results = _run_interpreted(kind_name, force={"EVICT": 1})
    assert len(results) >= 5 and all("EVICT=1" in r["spec"] for r in results)
    failures = [r for r in results if r["error"]]
    assert not failures, f"{len(failures)} specs differ from the reference: {failures[:5]}"


_PTX_OF = """
import json, sys
from harness import kinds as registry
from harness.box.compiler import _compile_only, _warm
_warm(("cuda", 90, 32))
kind_name, shape, knobs = json.loads(sys.argv[1])
kind = registry.get(kind_name)
with _compile_only():
    inputs = kind.make_inputs(shape, "meta", 0)
    print(json.dumps(kind.prepare(knobs, shape, inputs).run().asm["ptx"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind_name", ROW_KINDS)
def test_the_row_kinds_cache_hints_reach_the_hopper_ptx(kind_name: str, tmp_path: Path) -> None:
    """Compiled for compute capability 9.0 (no GPU needed): with ``EVICT=1`` the loads carry
    the L2 policies, two-pass kernels both of them; with ``EVICT=0`` none does."""
    shape: dict[str, Any] = {"M": 64, "N": 8192, "dtype": "bf16"}
    knobs: dict[str, Any] = {"BLOCK_N": 2048, "ROWS": 1, "num_warps": 4, "num_stages": 2}
    if kind_name == "reduce":
        shape["op"] = "sum"
        knobs["SPLIT"] = 2
    else:
        knobs["ONE_PASS"] = 0
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    ptx = {}
    for evict in (0, 1):
        arg = json.dumps([kind_name, shape, {**knobs, "EVICT": evict}])
        proc = subprocess.run([sys.executable, "-c", _PTX_OF, arg], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ptx[evict] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "evict_first" not in ptx[0] and "evict_last" not in ptx[0]
    assert "evict_first" in ptx[1]
    assert ("evict_last" in ptx[1]) == (kind_name != "reduce")


def test_reduce_every_op_interpreted() -> None:
    from harness.kinds.reduce import OPS

    shapes = [{"M": 3, "N": 60, "op": op, "dtype": "fp32"} for op in OPS]
    results = _run_interpreted("reduce", shapes)
    assert {r["shape_id"] for r in results} == {f"reduce_M3_N60_op{op}_fp32" for op in OPS}
    assert not [r for r in results if r["error"]]


# -- shapes and ids ----------------------------------------------------------------------------
def test_shape_ids_are_stable() -> None:
    expect = {
        "matmul": ({"M": 16, "N": 6144, "K": 4096, "dtype": "bf16"},
                   "matmul_M16_N6144_K4096_bf16"),
        "softmax": ({"M": 32, "N": 8192, "dtype": "bf16"}, "softmax_M32_N8192_bf16"),
        "reduce": ({"M": 16, "N": 128256, "op": "max", "dtype": "fp32"},
                   "reduce_M16_N128256_opmax_fp32"),
        "rms_norm": ({"M": 4096, "N": 4096, "dtype": "bf16"}, "rms_norm_M4096_N4096_bf16"),
        "attention": ({"batch": 1, "heads": 32, "seq": 4096, "head_dim": 128, "causal": True,
                       "dtype": "bf16"},
                      "attention_batch1_heads32_seq4096_head_dim128_causal1_bf16"),
        "norm_linear": ({"M": 16, "N": 6144, "K": 4096, "dtype": "bf16"},
                        "norm_linear_M16_N6144_K4096_bf16"),
        "mlp_geglu": ({"M": 2048, "N": 14336, "K": 4096, "dtype": "bf16"},
                      "mlp_geglu_M2048_N14336_K4096_bf16"),
        "linear_norm": ({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"},
                        "linear_norm_M4096_N4096_K4096_bf16"),
    }
    assert sorted(expect) == ALL_KINDS
    for name, (shape, sid) in expect.items():
        kind = registry.get(name)
        assert kind.shape_id(shape) == sid
        assert kind.shape_id(dict(reversed(list(shape.items())))) == sid  # key order is moot


@pytest.mark.parametrize("regime", [DEPLOYABLE, INTERPRET])
def test_golden_shapes_are_well_formed(regime: str) -> None:
    shapes = goldens.shapes(regime)
    assert {g.kind for g in shapes} == set(ALL_KINDS), "every kind has golden shapes"
    names = [g.name for g in shapes]
    ids = [g.shape_id for g in shapes]
    assert len(set(names)) == len(names) and len(set(ids)) == len(ids)
    for g in shapes:
        kind = registry.get(g.kind)
        assert set(g.shape) == set(kind.fields), f"{g.name}: fields {sorted(g.shape)}"
        assert kind.flops(g.shape) > 0 and kind.bytes(g.shape) > 0
        atol, rtol = kind.tolerance(g.shape["dtype"])
        assert 0 < atol < 0.1 and 0 < rtol < 0.1
    if regime == DEPLOYABLE:
        for name in NEW_KINDS:
            n = sum(g.kind == name for g in shapes)
            assert 3 <= n <= 6, f"{name} has {n} golden shapes"


# -- pools -------------------------------------------------------------------------------------
@functools.cache
def _pool_specs(card_alias: str, kind_name: str, shape_id: str) -> frozenset[str]:
    g = next(g for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name]) if g.shape_id == shape_id)
    return frozenset(make_spec(k) for k in registry.get(kind_name).enumerate(g.shape,
                                                                            by_alias(card_alias)))


def test_golden_pools_are_sized_without_torch() -> None:
    """The controller sizes pools with no torch or triton: build them in a bare process."""
    code = (
        "import json, sys\n"
        "from harness import pools\n"
        "from harness.cards import by_alias\n"
        "sizes = {a: {f'{sp.golden.kind}|{sp.golden.shape_id}': sp.enumerated\n"
        "             for sp in pools.build(by_alias(a)).shapes} for a in ('h100', 'h200')}\n"
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "print(json.dumps({'sizes': sizes, 'imported': bad}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["imported"] == [], "pool building imported torch/triton"
    for alias, sizes in got["sizes"].items():
        assert {key.split("|")[0] for key in sizes} == set(ALL_KINDS)
        for key, n in sizes.items():
            assert n >= 100, f"{alias} {key}: only {n} specs"


def _knobs(spec: str) -> dict[str, int]:
    return {k: int(v) for k, v in parse_spec(spec).items()}


@pytest.mark.parametrize("kind_name", SMEM_BOUND)
def test_big_tiles_realize_on_h100_but_not_l40s(kind_name: str) -> None:
    kind = registry.get(kind_name)
    h100, l40s = by_alias("h100"), by_alias("l40s")
    found = []
    for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name]):
        big = _pool_specs("h100", kind_name, g.shape_id)
        # the L40S has no TMA knobs: its specs mean the H100's with those knobs at 0
        space = kind.knob_space(g.shape, h100)
        small = {make_spec(pools.completed(dict(parse_spec(s)), space))
                 for s in _pool_specs("l40s", kind_name, g.shape_id)}
        assert small < big, f"{g.shape_id}: the L40S pool must be a strict subset of the H100's"
        for spec in sorted(big - small):
            why = kind.unrealizable(_knobs(spec), g.shape, l40s)
            assert why, spec
            if "shared memory" in why:
                found.append((g, spec))
                break
    assert found, f"no {kind_name} spec realizes on {h100.name} and not for shared memory on L40S"
    # an H100 anchor with such a tile is skipped on the L40S, kept on the H200
    g, spec = found[0]
    anchor = goldens.Anchor(gpu=h100.name, kind=kind_name, shape_id=g.shape_id, spec=spec)
    on_l40s = pools.build(l40s, anchors=[anchor], shapes=[g])
    assert on_l40s.skipped_anchors == [anchor]
    on_h200 = pools.build(by_alias("h200"), anchors=[anchor], shapes=[g])
    assert on_h200.skipped_anchors == [] and on_h200.shapes[0].cross_anchors == [spec]


@pytest.mark.parametrize("kind_name", ["reduce", "rms_norm", "softmax"])
def test_row_kinds_realize_alike_on_h100_and_l40s(kind_name: str) -> None:
    for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name]):
        assert _pool_specs("h100", kind_name, g.shape_id) == _pool_specs("l40s", kind_name,
                                                                         g.shape_id)


def test_a_subtiled_store_split_across_warps_counts_its_layout_conversion() -> None:
    """On an H100 this configuration failed to compile asking for 253,992 B of shared memory
    (5 stages of 40 KiB, the half-tile staging buffer, and a whole tile converting the
    accumulator's layout, which 8 warps split along N when BLOCK_M is 64); with 4 warps, or
    BLOCK_M 128, no such conversion (its compiles stayed within 0.13 tiles of the rest)."""
    h100 = by_alias("h100")
    mm = registry.get("matmul")
    shape = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
    knobs = {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "TMA": 1,
             "PERSISTENT": 1, "SUBTILE": 1, "num_warps": 8, "num_stages": 5}
    assert "shared memory 253952 B" in mm.unrealizable(knobs, shape, h100)
    assert mm.unrealizable(dict(knobs, num_stages=4), shape, h100) is None  # 212,992 B
    assert mm.unrealizable(dict(knobs, num_warps=4), shape, h100) is None
    assert mm.unrealizable(dict(knobs, SUBTILE=0, num_stages=4), shape, h100) is None


def test_realizability_rules() -> None:
    h100, l40s = by_alias("h100"), by_alias("l40s")
    attn = registry.get("attention")
    prefill = {"batch": 1, "heads": 32, "seq": 4096, "head_dim": 128, "causal": True,
               "dtype": "bf16"}
    big = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
    assert attn.unrealizable(big, prefill, h100) is None
    assert "shared memory 229376 B" in attn.unrealizable(big, prefill, l40s)
    assert "registers" in attn.unrealizable(dict(big, num_warps=4), prefill, h100)

    ln = registry.get("linear_norm")
    decode = {"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"}
    rows = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "ROW_PROGRAM": 1,
            "num_warps": 4, "num_stages": 3}
    assert "row programs leave most of the 132 SMs idle" in ln.unrealizable(rows, decode, h100)
    assert ln.unrealizable(rows, dict(decode, M=4096), h100) is None
    assert "GROUP_M does not apply" in ln.unrealizable(dict(rows, GROUP_M=4),
                                                       dict(decode, M=4096), h100)

    red = registry.get("reduce")
    logits = {"M": 16, "N": 128256, "op": "max", "dtype": "fp32"}
    split = {"BLOCK_N": 16384, "ROWS": 1, "SPLIT": 16, "num_warps": 16, "num_stages": 1}
    # 128256 columns in whole blocks of 16384: 8 programs get columns, 8 none
    assert "SPLIT=16 leaves 8 of its programs no columns" in red.unrealizable(split, logits, h100)
    assert red.unrealizable(dict(split, SPLIT=8), logits, h100) is None
    assert "register" in red.unrealizable(dict(split, SPLIT=8, ROWS=4), logits, h100)

    sm = registry.get("softmax")
    vocab = {"M": 16, "N": 128256, "dtype": "fp32"}
    split = {"BLOCK_N": 8192, "ROWS": 1, "ONE_PASS": 0, "SPLIT": 16, "num_warps": 16,
             "num_stages": 1, "EVICT": 0}
    assert sm.unrealizable(split, vocab, h100) is None
    assert "whole row" in sm.unrealizable(dict(split, ONE_PASS=1), vocab, h100)
    assert "SPLIT=16 leaves 8 of its programs no columns" in sm.unrealizable(
        dict(split, BLOCK_N=16384), vocab, h100)
    assert "no loop to pipeline" in sm.unrealizable(dict(split, num_stages=2), vocab, h100)
    scores = {"M": 65536, "N": 2048, "dtype": "bf16"}
    assert "fill the 132 SMs" in sm.unrealizable(dict(split, BLOCK_N=128, SPLIT=2), scores, h100)

    rms = registry.get("rms_norm")
    one = {"BLOCK_N": 2048, "ROWS": 1, "ONE_PASS": 1, "num_warps": 8, "num_stages": 1}
    assert "whole row" in rms.unrealizable(one, {"M": 16, "N": 4096, "dtype": "bf16"}, h100)

    for name in NEW_KINDS:  # the interpreter's pools stay small
        kind = registry.get(name)
        for g in _interpret_shapes(name):
            assert 5 <= len(kind.enumerate(g.shape, INTERPRETER)) <= 40, g.shape_id


# -- anchors -----------------------------------------------------------------------------------
def _anchor_card(gpu: str) -> Any:
    return INTERPRETER if gpu in (INTERPRETER.name, SYNTHETIC_GPU) else by_name(gpu)


def test_every_anchor_names_a_golden_shape_and_realizes_on_its_card() -> None:
    anchors = goldens.anchors()
    assert anchors
    for a in anchors:
        card = _anchor_card(a.gpu)
        shape = {g.shape_id: g for g in goldens.shapes(card.regime, kinds=[a.kind])}.get(a.shape_id)
        assert shape is not None, f"{a}: no {card.regime} golden shape {a.shape_id}"
        assert make_spec(parse_spec(a.spec)) == a.spec, f"{a.spec!r} is not canonical"
        kind = registry.get(a.kind)
        specs = {make_spec(k) for k in kind.enumerate(shape.shape, card)}
        # an anchor recorded before a knob existed means that knob's first value
        spec = make_spec(pools.completed(dict(parse_spec(a.spec)),
                                         kind.knob_space(shape.shape, card)))
        assert spec in specs, f"{a}: does not realize on {card.name}"


def test_interpret_anchors_realize_and_fill_every_slice() -> None:
    built = pools.build(INTERPRETER)
    assert built.skipped_anchors == []
    for sp in built.shapes:
        if sp.golden.kind not in NEW_KINDS:
            continue
        assert len(sp.own_anchors) == 1 and len(sp.cross_anchors) == 1, sp.golden.shape_id
        slices = {p.slice for p in sp.points}
        assert slices == {"own", "cross", "tail"}, f"{sp.golden.shape_id}: {slices}"


# -- a real GPU --------------------------------------------------------------------------------
def _tile_volume(knobs: dict[str, Any]) -> int:
    v = 1
    for key, value in knobs.items():
        if key.startswith("BLOCK") or key == "ROWS":
            v *= value
    return v


@pytest.mark.gpu
@pytest.mark.parametrize("kind_name", ALL_KINDS)
def test_golden_pools_on_the_live_gpu(kind_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Sample ~5 specs of each golden pool on this card: correct, and each call under 50 ms.

    The sample is four seeded random specs plus the smallest tiles (the slowest sane spec).
    """
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False")
    from harness.box.bench import Bencher
    from harness.box.probe import probe
    from harness.cards import card_from_probe

    card = card_from_probe(probe())
    kind = registry.get(kind_name)
    bencher = Bencher("cuda", 5, 20)
    rows, failures = [], []
    for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name]):
        pool = kind.enumerate(g.shape, card)
        assert pool, f"{g.shape_id}: empty pool on {card.name}"
        sample = random.Random(g.shape_id).sample(pool, min(4, len(pool)))
        sample.append(min(pool, key=_tile_volume))
        ok, times = 0, []
        for knobs in sample:
            res = bencher.measure({"kind": kind_name, "shape": g.shape, "knobs": knobs})
            if res["status"] == "ok":
                ok += 1
                times.append(res["value_us"])
                if res["value_us"] > 50_000:
                    failures.append((g.shape_id, make_spec(knobs), f"{res['value_us']:.0f} us"))
            else:
                failures.append((g.shape_id, make_spec(knobs), res["status"], res["error"]))
        median = f"{statistics.median(times):.1f}" if times else "-"
        rows.append((kind_name, g.name, len(pool), f"{ok}/{len(sample) - ok}", median,
                     f"{max(times):.1f}" if times else "-"))
    with capsys.disabled():
        print(f"\n{card.name}: {kind_name}")
        print(f"{'kind':12} {'shape':40} {'pool':>6} {'ok/fail':>8} {'median_us':>10} {'max_us':>10}")
        for r in rows:
            print(f"{r[0]:12} {r[1]:40} {r[2]:6d} {r[3]:>8} {r[4]:>10} {r[5]:>10}")
    assert not failures, failures


GEMM_KINDS = ["matmul", "norm_linear", "mlp_geglu", "linear_norm"]


@pytest.mark.parametrize("kind_name", ["matmul", "norm_linear", "mlp_geglu", "linear_norm",
                                       "attention"])
@pytest.mark.parametrize("alias", ["h200", "l40s"])
def test_a_pool_is_the_realizable_part_of_the_knob_product(kind_name: str, alias: str) -> None:
    """Trying the TMA knobs only where the pointer path realizes loses no configuration and
    keeps the product's order; an L40S pool has no TMA knobs at all."""
    import itertools

    kind, card = registry.get(kind_name), by_alias(alias)
    for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name])[:2]:
        space = kind.knob_space(g.shape, card)
        keys = list(space)
        plain = [dict(zip(keys, values, strict=True))
                 for values in itertools.product(*(space[k] for k in keys))
                 if kind.realizable(dict(zip(keys, values, strict=True)), g.shape, card)]
        pool = kind.enumerate(g.shape, card)
        assert pool == plain
        has_tma = any("TMA" in k for k in pool)
        assert has_tma == (card.cc >= (9, 0)), f"{g.shape_id} on {card.name}"
        if has_tma and kind_name != "attention":
            assert any(k["TMA"] and k["PERSISTENT"] and k["SUBTILE"] for k in pool)
            assert not any(not k["TMA"] and (k["PERSISTENT"] or k["SUBTILE"]) for k in pool)


def test_an_anchor_recorded_before_the_tma_knobs_means_the_pointer_path() -> None:
    g = goldens.shapes(DEPLOYABLE, kinds=["matmul"])[0]
    old = "BLOCK_K=64,BLOCK_M=128,BLOCK_N=128,GROUP_M=8,num_stages=3,num_warps=4"
    anchor = goldens.Anchor(gpu=by_alias("h200").name, kind="matmul", shape_id=g.shape_id,
                            spec=old)
    built = pools.build(by_alias("h200"), anchors=[anchor], shapes=[g])
    assert built.skipped_anchors == []
    # the Gluon GEMM's knob too, where the Hopper pools take it (0: the Triton kernel)
    gluon = "GLUON=0," if GEMM_GLUON_POOL else ""
    assert built.shapes[0].own_anchors == [old.replace(
        "GROUP_M=8,", f"{gluon}GROUP_M=8,PERSISTENT=0,SUBTILE=0,TMA=0,")]
    # its TMA variants are one and two knob steps away: in the own slice
    own = {p.spec for p in built.shapes[0].points if p.slice == "own"}
    assert old.replace("GROUP_M=8,", f"{gluon}GROUP_M=8,PERSISTENT=1,SUBTILE=0,TMA=1,") in own
    on_l40s = pools.build(by_alias("l40s"), anchors=[anchor], shapes=[g])
    assert on_l40s.shapes[0].own_anchors == [] and on_l40s.shapes[0].cross_anchors == [old]
# the copy-engine paths of each kind that has them, as knob values
KIND_PATHS: dict[str, dict[str, dict[str, int]]] = {
    # the Triton template's paths (GLUON=0; tests/test_gemm_gluon.py checks the Gluon GEMM)
    **{kind_name: {"pointers": {"TMA": 0, "PERSISTENT": 0, "SUBTILE": 0, "GLUON": 0},
                   "tma": {"TMA": 1, "PERSISTENT": 0, "SUBTILE": 0, "GLUON": 0},
                   "tma+persistent": {"TMA": 1, "PERSISTENT": 1, "SUBTILE": 0, "GLUON": 0},
                   "tma+persistent+subtile": {"TMA": 1, "PERSISTENT": 1, "SUBTILE": 1,
                                              "GLUON": 0}}
       for kind_name in GEMM_KINDS},
    "attention": {"pointers": {"TMA": 0}, "tma": {"TMA": 1}},
}
# ragged sequences (not a multiple of any tile): the TMA path's zero-filled reads past the
# sequence and its clipped stores, causal and not
RAGGED_ATTENTION = [{"batch": 2, "heads": 3, "seq": seq, "head_dim": d, "causal": causal,
                     "dtype": "bf16"} for seq, d, causal in ((1000, 128, True), (1000, 128, False),
                                                             (333, 64, True), (77, 64, False))]


@pytest.mark.gpu
@pytest.mark.parametrize("kind_name", list(KIND_PATHS))
def test_every_copy_engine_path_matches_the_reference_on_every_golden_shape(
        kind_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each path of a kind (pointers, TMA and, for the GEMM template, persistent and a
    subtiled epilogue) on every golden shape: seeded specs of the path's pool, checked against
    the fp32 reference by the bench worker (the check every sweep point passes before it is
    timed).  Attention also runs ragged sequences."""
    from tests.live_gpu import check_points, hopper_card

    card = hopper_card("has no TMA paths")

    kind = registry.get(kind_name)
    shapes = [(g.shape_id, g.shape) for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name])]
    if kind_name == "attention":
        shapes += [(f"ragged{i}", shape) for i, shape in enumerate(RAGGED_ATTENTION)]
    per_path = 3 if kind_name == "attention" else 1
    points = []
    for shape_id, shape in shapes:
        pool = kind.enumerate(shape, card)
        for path, values in KIND_PATHS[kind_name].items():
            on_path = [k for k in pool if all(k.get(key, 0) == v for key, v in values.items())]
            assert on_path, f"{shape_id}: no {path} spec realizes on {card.name}"
            rng = random.Random(f"{shape_id}/{path}")
            points += [(shape_id, shape, path, knobs)
                       for knobs in rng.sample(on_path, min(per_path, len(on_path)))]
    # compiled ahead on the box's cores, as a sweep does
    lines, failures = check_points(kind_name, points, card)
    with capsys.disabled():
        print(f"\n{card.name}: {kind_name}\n" + "\n".join(lines))
    assert not failures, failures


if __name__ == "__main__":
    _kind = sys.argv[1]
    _shapes = json.loads(sys.argv[2]) or [g.shape for g in _interpret_shapes(_kind)]
    print(json.dumps(_check_pools_interpreted(_kind, _shapes, json.loads(sys.argv[3]))))
