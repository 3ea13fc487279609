"""What people ship (harness/shipped.py): the rules' values, the tutorial lists as this
project's knobs, the baselines' option, and where the pools put them."""

from __future__ import annotations

import pytest

from harness import cards, pools, shipped
from harness.kinds.base import GEMM_GLUON_POOL
from harness.points import make_spec


@pytest.mark.parametrize(("n", "want"), [(1, (1, 4)), (2047, (2048, 8)), (2048, (2048, 8)),
                                         (4096, (4096, 8)), (8192, (8192, 16)),
                                         (32000, (32768, 32)), (65536, (65536, 32)),
                                         (65537, None)])
def test_calculate_settings_is_the_shipped_rule(n: int, want: tuple[int, int] | None) -> None:
    assert shipped.calculate_settings(n) == want
# the Gluon GEMM's knob, where the Hopper pools take any of its forms: 0 is the Triton kernel
GLUON_0 = {"GLUON": 0} if GEMM_GLUON_POOL else {}


def test_the_tutorial_lists_as_published() -> None:
    assert len(shipped.MATMUL_TUTORIAL) == 16
    assert shipped.MATMUL_TUTORIAL[0] == (128, 256, 64, 8, 3, 8)
    # keep() drops every 8-warp config: no BLOCK_M * BLOCK_N of the list reaches 128 * 128
    assert len(shipped.ATTENTION_TUTORIAL) == 12
    assert {c[3] for c in shipped.ATTENTION_TUTORIAL} == {4}
    assert all(src.get("commit") or src.get("rule") for src in shipped.SOURCES.values())


H200 = cards.by_alias("h200")


def test_the_heuristic_for_a_row_kind_is_one_row_one_pass() -> None:
    knobs = shipped.heuristic("softmax", {"M": 4096, "N": 32000, "dtype": "bf16"}, H200)
    # the tutorial's kernel loads with the default cache policy (EVICT=0), a row a program
    assert knobs == {"BLOCK_N": 32768, "ROWS": 1, "ONE_PASS": 1, "num_warps": 32,
                     "num_stages": 1, "EVICT": 0, "SPLIT": 1}
    assert shipped.heuristic("reduce", {"M": 8, "N": 4096, "op": "sum", "dtype": "bf16"},
                             H200)["SPLIT"] == 1
    assert shipped.autotune_list("softmax", {"M": 4096, "N": 32000, "dtype": "bf16"}, H200) == []


def test_tiles_are_clamped_to_the_problem_and_the_list_keeps_what_the_card_can_run() -> None:
    small = {"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"}
    listed = shipped.autotune_list("matmul", small, H200)
    assert listed and all(k["BLOCK_M"] == 16 and k["GROUP_M"] == 1 for k in listed)
    assert len({make_spec(k) for k in listed}) == len(listed)  # clamping merged duplicates
    big = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
    # a knob the pool has and the rule does not (TMA, the Gluon GEMM) takes its first value
    assert shipped.heuristic("matmul", big, H200) == {
        "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
        "num_stages": 3, "TMA": 0, "PERSISTENT": 0, "SUBTILE": 0, **GLUON_0}
    # mlp_geglu holds two weight tiles: the tutorial's first config does not fit its shared
    # memory, so the heuristic is the first that does, as a user would take the next one
    h = shipped.heuristic("mlp_geglu", {"M": 2048, "N": 14336, "K": 4096, "dtype": "bf16"},
                          H200)
    assert h is not None and (h["BLOCK_M"], h["BLOCK_N"]) != (128, 256)


@pytest.mark.parametrize(("value", "want"), [(None, ("torch", "compile")),
                                             ("compile,torch", ("torch", "compile")),
                                             ("torch", ("torch",)), ("none", ())])
def test_the_baselines_option(value: str | None, want: tuple[str, ...]) -> None:
    assert shipped.parse_baselines(value) == want


@pytest.mark.parametrize("bad", ["", "inductor", "torch,none", "eager"])
def test_a_bad_baselines_value_names_the_choices(bad: str) -> None:
    with pytest.raises(ValueError, match="torch, compile"):
        shipped.parse_baselines(bad)


def test_a_shipped_gemm_config_on_a_hopper_card_is_the_pointer_path() -> None:
    """The tutorials' lists predate the TMA knobs: on an H200 they mean TMA=0, on an L40S
    (no such knobs) they are as published."""
    shape = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
    on_h200 = shipped.autotune_list("matmul", shape, H200)
    assert on_h200 and all((k["TMA"], k["PERSISTENT"], k["SUBTILE"]) == (0, 0, 0)
                           for k in on_h200)
    assert all("TMA" not in k for k in shipped.autotune_list("matmul", shape,
                                                              cards.by_alias("l40s")))


def test_the_descriptor_lists_as_published_on_the_descriptor_paths_of_hopper_cards_only() -> None:
    """The persistent matmul tutorial's list (48 configurations) and the fused-attention
    tutorial's descriptor list (28 after keep_tma) run on the TMA paths; an L40S or A100 has
    none of those paths and measures neither list."""
    assert len(shipped.PERSISTENT_MATMUL_TUTORIAL) == 48
    assert len(shipped.ATTENTION_TUTORIAL_TMA) == 28
    big = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
    listed = shipped.descriptor_list("matmul", big, H200)
    assert all((k["TMA"], k["PERSISTENT"]) == (1, 1) for k in listed)
    assert {k["SUBTILE"] for k in listed} == {0, 1}
    # what the card cannot run is left out: 128x256x128 tiles need 4 stages of 96 KiB
    assert not any((k["BLOCK_N"], k["BLOCK_K"], k["num_stages"]) == (256, 128, 4)
                   for k in listed)
    assert {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
            "num_stages": 3, "TMA": 1, "PERSISTENT": 1, "SUBTILE": 1, **GLUON_0} in listed
    assert {k["PROLOGUE"] for k in shipped.descriptor_list("norm_linear", big, H200)} == {2}
    attn = {"batch": 1, "heads": 32, "seq": 4096, "head_dim": 128, "causal": 1,
            "dtype": "bf16"}
    on_h200 = shipped.descriptor_list("attention", attn, H200)
    assert on_h200 and all(k["TMA"] == 1 for k in on_h200)
    assert shipped.descriptor_list("softmax", {"M": 4096, "N": 32000, "dtype": "bf16"},
                                   H200) == []
    for older in ("l40s", "a100-80"):
        card = cards.by_alias(older)
        assert shipped.descriptor_list("matmul", big, card) == []
        assert shipped.descriptor_list("attention", attn, card) == []
    # the autotune_list prior is the pointer-path list alone, as before
    assert all(k["TMA"] == 0 for k in shipped.autotune_list("matmul", big, H200))


def test_the_pools_measure_shipped_configs_first_in_the_own_slice_only() -> None:
    pool = pools.build(H200, kinds=["matmul", "softmax"])
    for sp in pool.shapes:
        want = {make_spec(k) for ks in shipped.configs(sp.golden.kind, sp.golden.shape,
                                                       H200).values() for k in ks}
        first = [p for p in sp.points if p.first]
        assert {p.spec for p in first} == want
        assert all(p.slice == "own" for p in first)
        specs = [p.spec for p in sp.points]
        assert len(specs) == len(set(specs))  # moved, never measured twice
        assert {"baseline=torch", "baseline=compile"} <= want
    none = pools.build(H200, kinds=["softmax"], baselines=())
    assert not any(shipped.is_baseline(p.spec) for p in none.points())


def test_the_interpreter_measures_nothing_shipped() -> None:
    pool = pools.build(cards.by_alias("interpret"), kinds=["matmul"])
    assert not any(p.first for p in pool.points())


SHAPES = {"rms_norm": {"M": 8, "N": 64, "dtype": "fp32"},
          "softmax": {"M": 8, "N": 64, "dtype": "fp32"},
          "reduce": {"M": 8, "N": 64, "op": "sumsq", "dtype": "fp32"},
          "matmul": {"M": 16, "N": 32, "K": 32, "dtype": "fp32"},
          "mlp_geglu": {"M": 16, "N": 32, "K": 32, "dtype": "fp32"},
          "norm_linear": {"M": 16, "N": 32, "K": 32, "dtype": "fp32"},
          "linear_norm": {"M": 16, "N": 32, "K": 32, "dtype": "fp32"},
          "attention": {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16, "causal": True,
                        "dtype": "fp32"}}


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_torchs_own_op_agrees_with_the_reference_and_is_timed(kind: str) -> None:
    """On the CPU: the worker times torch's op of every kind and checks it as a kernel."""
    pytest.importorskip("torch")
    from harness.box.bench import Bencher

    res = Bencher("cpu", 1, 3).measure({"kind": kind, "shape": SHAPES[kind],
                                        "knobs": {"baseline": "torch"}})
    assert res["status"] == "ok", res
    assert res["value_us"] > 0 and res["n_samples"] == 3


def test_an_unknown_baseline_is_a_failed_row_not_a_crash() -> None:
    pytest.importorskip("torch")
    from harness.box.bench import Bencher

    res = Bencher("cpu", 1, 3).measure({"kind": "softmax", "shape": SHAPES["softmax"],
                                        "knobs": {"baseline": "eager"}})
    assert res["status"] != "ok" and "unknown baseline" in (res["error"] or "")
