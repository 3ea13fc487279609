"""What the GPU bench scripts share (``bench/_live.py``), in its parts that need no GPU."""

from __future__ import annotations

from bench_scripts import load

from harness.points import make_spec


def test_a_shapes_configurations_put_the_given_first_once_then_a_seeded_draw_of_the_rest() -> None:
    live = load("_live")
    space = {"BLOCK": [32, 64, 128], "WARPS": [1, 2, 4, 8], "EVICT": [0, 1]}
    pool = [{"BLOCK": b, "WARPS": w, "EVICT": e} for b in (32, 64, 128) for w in (1, 2, 4, 8)
            for e in (0, 1)]
    anchor, heuristic = {"BLOCK": 64, "WARPS": 4, "EVICT": 0}, {"BLOCK": 128, "WARPS": 8, "EVICT": 1}
    # an anchor recorded before EVICT existed is the same configuration as its EVICT=0 twin
    got = live.shape_configs("softmax/m16", pool, [anchor, {"BLOCK": 64, "WARPS": 4}, heuristic],
                             5, space)
    specs = [make_spec(c) for c in got]
    assert got[:2] == [anchor, heuristic]
    assert len(got) == 7 and len(set(specs)) == 7  # the old anchor is not measured twice
    assert all(c in pool for c in got)
    # the draw is the shape's: the same again, another shape's another
    assert live.shape_configs("softmax/m16", pool, [anchor, heuristic], 5, space) == got
    assert live.shape_configs("softmax/m512", pool, [anchor, heuristic], 5, space) != got
    # more asked for than the pool holds: each configuration once
    every = live.shape_configs("softmax/m16", pool, [anchor], 100, space)
    assert sorted(map(make_spec, every)) == sorted(map(make_spec, pool))


def test_a_cards_anchor_is_its_measured_one_where_vllms_config_is_there_too() -> None:
    live = load("_live")
    from harness.goldens import Anchor

    measured = Anchor("NVIDIA H100 80GB", "matmul", "m", "BLOCK_M=128,TMA=1", 12.5, "bench-1")
    vllm = Anchor("NVIDIA H100 80GB", "matmul", "m", "BLOCK_M=64", None, "github.com/vllm")
    other = Anchor("NVIDIA H200 141GB", "matmul", "m", "BLOCK_M=32", 9.0, "bench-2")
    only_vllm = Anchor("NVIDIA H100 80GB", "matmul", "n", "BLOCK_M=16", None, "github.com/vllm")
    for order in ([measured, vllm, other, only_vllm], [vllm, other, only_vllm, measured]):
        assert live.card_anchors("NVIDIA H100 80GB", order) == {
            "m": {"BLOCK_M": 128, "TMA": 1}, "n": {"BLOCK_M": 16}}
