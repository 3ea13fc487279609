"""Causal attention's program order, side by side, on the kind's own launches.

    python bench/attention_order.py [--gpu h100] [--shapes TEXT] [--rounds 3]    # GPU
    TRITON_INTERPRET=1 python bench/attention_order.py --check-only --tiny      # on the CPU

A causal query block's work grows with its index. The kind's grids (harness/kinds/attention.py,
``head_group``) run the heads in groups whose K and V fill about 8 MiB of L2, each group's
programs longest rows first across its heads. Here each causal golden shape's anchor of
``--gpu`` (and ``--spec``, repeated, for more configurations) runs with groups of 1 head (one
head at a time, longest first: the order of a 2-D grid of query blocks by heads), the kind's
group, other powers of two and every head at once (one group); each launch is checked against
the fp32 reference, then timed with ``triton.testing.do_bench`` (median, L2 flushed between
calls), the rounds interleaved, beside SDPA. ``--check-only`` checks without timing; ``--tiny``
takes small shapes, the interpreter's pool and every group size, the last group short.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.kinds.base import DTYPE_BYTES  # noqa: E402

TINY_SHAPES = [{"batch": 1, "heads": 5, "seq": seq, "head_dim": 16, "causal": True,
                "dtype": "fp32"} for seq in (40, 64)]


def groups_of(shape: dict[str, Any], rule: int) -> list[int]:
    """The group sizes to run: 1, the powers of two below every head, the kind's, every head."""
    zh = shape["batch"] * shape["heads"]
    return sorted({1, rule, zh} | {g for g in (2, 4, 8, 16, 32) if g < zh})


def launch_with(kind: Any, knobs: dict[str, Any], shape: dict[str, Any],
                inputs: dict[str, Any], group: int) -> Any:
    """The kind's launch of ``knobs`` with the heads in groups of ``group``."""
    import harness.kinds.attention as attention

    kv = 2 * shape["seq"] * shape["head_dim"] * DTYPE_BYTES[shape["dtype"]]
    kept = attention.HEAD_GROUP_BYTES
    attention.HEAD_GROUP_BYTES = group * kv
    try:
        assert attention.head_group(shape) == group
        return kind.prepare(knobs, shape, inputs).run
    finally:
        attention.HEAD_GROUP_BYTES = kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h100", help="whose anchors (a card alias)")
    ap.add_argument("--spec", action="append", default=[],
                    help="another configuration to run on every shape, e.g. "
                         "BLOCK_M=128,BLOCK_N=128,GLUON=3,TMA=1,num_stages=3,num_warps=8")
    ap.add_argument("--shapes", default="", help="only golden shape ids containing this text")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check-only", action="store_true", help="check every launch, time none")
    ap.add_argument("--tiny", action="store_true",
                    help="small shapes and the interpreter's pool (the CPU interpreter runs them)")
    args = ap.parse_args(argv)

    import torch

    from harness import goldens
    from harness import kinds as registry
    from harness.box.bench import _mismatch
    from harness.cards import DEPLOYABLE, INTERPRETER, by_alias
    from harness.kinds.attention import head_group
    from harness.points import parse_spec

    kind = registry.get("attention")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    extra = [{k: int(v) for k, v in parse_spec(s).items()} for s in args.spec]
    if args.tiny:
        cases = [(f"tiny_seq{s['seq']}", s, kind.enumerate(s, INTERPRETER)[:2] + extra)
                 for s in TINY_SHAPES]
    else:
        from _live import card_anchors

        anchors = card_anchors(by_alias(args.gpu).name, goldens.anchors())
        cases = [(g.shape_id, g.shape, [anchors[g.shape_id]] * (g.shape_id in anchors) + extra)
                 for g in goldens.shapes(DEPLOYABLE, kinds=["attention"])
                 if g.shape["causal"] and args.shapes in g.shape_id]
    wrong = checked = 0
    ratios = []
    for shape_id, shape, configs in cases:
        inputs = kind.make_inputs(shape, device, 0)
        ref = kind.reference(shape, inputs)
        tol = kind.tolerance(shape["dtype"])
        rule = head_group(shape)
        runs: dict[tuple[str, int], Any] = {}
        for knobs in configs:
            spec = ",".join(f"{k}={v}" for k, v in sorted(knobs.items()))
            for group in groups_of(shape, rule):
                run = launch_with(kind, knobs, shape, inputs, group)
                inputs["out"].fill_(float("nan"))
                run()
                checked += 1
                if _mismatch(inputs["out"], ref, *tol):
                    wrong += 1
                    print(f"{shape_id} {spec} group {group}: WRONG")
                    continue
                runs[(spec, group)] = run
        if args.check_only:
            print(f"{shape_id}: kind's group {rule}; {len(runs)} launches checked")
            continue
        from triton.testing import do_bench

        sdpa = functools.partial(kind.reference, shape, inputs)
        times: dict[Any, list[float]] = {key: [] for key in [*runs, "sdpa"]}
        for _ in range(args.rounds):
            for key in times:
                fn = sdpa if key == "sdpa" else runs[key]
                times[key].append(1e3 * do_bench(fn, return_mode="median"))
        sdpa_us = statistics.median(times.pop("sdpa"))
        print(f"\n{shape_id}: SDPA {sdpa_us:.1f} us; kind's group {rule} of "
              f"{shape['batch'] * shape['heads']} heads")
        print(f"  {'group':>5} {'us':>8} {'over 1':>7} {'over SDPA':>9}  configuration")
        for spec in dict.fromkeys(s for s, _ in runs):
            one = statistics.median(times[(spec, 1)]) if (spec, 1) in times else None
            for group in groups_of(shape, rule):
                if (spec, group) not in times:
                    continue
                us = statistics.median(times[(spec, group)])
                mark = " <- kind's" if group == rule else ""
                over = f"{us / one:7.3f}" if one else f"{'-':>7}"
                print(f"  {group:5d} {us:8.1f} {over} {us / sdpa_us:9.3f}  {spec}{mark}")
                if group == rule and one:
                    ratios.append(us / one)
    if ratios:
        print(f"\nkind's group over one head at a time: median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} configurations")
    print(f"wrong results: {wrong} of {checked} launches checked")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
