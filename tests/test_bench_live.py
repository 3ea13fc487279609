"""What the GPU bench scripts share (``bench/_live.py``), in its parts that need no GPU."""

from __future__ import annotations

from bench_scripts import load

from harness.points import make_spec


def test_a_shapes_configurations_put_the_given_first_once_then_a_seeded_draw_of_the_rest() -> None:
    live = load("_live")
    pool = [{"BLOCK": b, "WARPS": w} for b in (32, 64, 128) for w in (1, 2, 4, 8)]
    anchor, heuristic = {"BLOCK": 64, "WARPS": 4}, {"BLOCK": 128, "WARPS": 8}
    got = live.shape_configs("softmax/m16", pool, [anchor, anchor, heuristic], 5)
    specs = [make_spec(c) for c in got]
    assert got[:2] == [anchor, heuristic]
    assert len(got) == 7 and len(set(specs)) == 7
    assert all(c in pool for c in got)
    # the draw is the shape's: the same again, another shape's another
    assert live.shape_configs("softmax/m16", pool, [anchor, heuristic], 5) == got
    assert live.shape_configs("softmax/m512", pool, [anchor, heuristic], 5) != got
    # more asked for than the pool holds: each configuration once
    every = live.shape_configs("softmax/m16", pool, [anchor], 100)
    assert sorted(map(make_spec, every)) == sorted(map(make_spec, pool))
