"""linear_norm's second launch (fold a row's partial sums of squares, rescale the row) at
several block sizes and warp counts, each inside the whole tiled-scheme launch.

    python bench/linear_norm_fold.py [--n 2] [--rounds 3] [--parts]

For every golden linear_norm shape: the card's anchor, the shipped heuristic and ``--n``
seeded random tiled configurations (``ROW_PROGRAM=0``) of the pool, each measured the
harness's way (``Bencher.measure``: checked against the reference, then timed interleaved
with it, L2 flushed) with each fold variant, in ``--rounds`` rounds (the variants' order
reversed every other round), and ``torch.compile``'s kernel the same way once a round.
Times are taken at the shape's reference clock (harness/steady.py's ratio: a time over its
interleaved reference's, times the shape's median reference).  Prints each variant over the
current fold per configuration, and per shape ``torch.compile`` over the best configuration
with each variant.  A failed check is printed and counted.

``--parts``: for the card's anchor of each shape, where the whole launch's time goes, by
``triton.testing.do_bench`` (median, L2 flushed) of the plain GEMM (the matmul kind's launch
with the same tile knobs), the GEMM with the sum-of-squares epilogue alone, and the whole
launch (that GEMM and the fold) with the current fold and with the earlier one (1024
columns a block, 4 warps), beside ``torch.compile``'s kernel and torch's two ops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def variants(next_pow2) -> dict[str, object]:
    """(BLOCK_N, num_warps) of the fold by name; ``current`` is the kind's own (whole rows
    at 8 warps on every golden shape), ``1k/4w`` the one before it."""
    return {
        "current": None,
        "1k/4w": lambda m, n: (min(max(16, next_pow2(n)), 1024), 4),
        "row/4w": lambda m, n: (max(16, next_pow2(n)), 4),
        "row/16w": lambda m, n: (max(16, next_pow2(n)), 16),
        "2k/8w": lambda m, n: (min(max(16, next_pow2(n)), 2048), 8),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2, help="random tiled configurations per shape")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", action="store_true",
                    help="only the anchors' time by part (do_bench), no fold variants")
    args = ap.parse_args(argv)
    if args.parts:
        return parts()

    from _live import live_setup, shape_configs

    from harness import goldens, shipped
    from harness import kinds as registry
    from harness.cards import DEPLOYABLE
    from harness.kinds import linear_norm
    from harness.kinds.base import next_pow2
    from harness.points import make_spec

    live = live_setup()
    if live is None:
        return 2
    card, bencher, anchors = live
    print(f"card: {card.name}")
    shipped_fold = linear_norm.fold_config
    vs = {k: (v or shipped_fold) for k, v in variants(next_pow2).items()}
    wrong = 0
    over_current: dict[str, list[float]] = {k: [] for k in vs}
    for g in goldens.shapes(DEPLOYABLE, kinds=["linear_norm"]):
        kind = registry.get(g.kind)
        pool = [c for c in kind.enumerate(g.shape, card) if not c.get("ROW_PROGRAM")]
        first = [anchors[g.shape_id]] if g.shape_id in anchors else []
        if (h := shipped.heuristic(g.kind, g.shape, card)) is not None:
            first.append(h)
        first = [c for c in first if not c.get("ROW_PROGRAM")]
        configs = shape_configs(g.shape_id, pool, first, args.n, kind.knob_space(g.shape, card))
        m, n = g.shape["M"], g.shape["N"]
        print(f"{g.shape_id}: folds " + ", ".join(f"{k}={f(m, n)}" for k, f in vs.items()))
        raw: dict[tuple[str, str], list[tuple[float, float]]] = {}
        comp: list[tuple[float, float]] = []
        for rnd in range(args.rounds):
            for knobs in configs:
                # the variants in turn, the order reversed every other round
                for name, fold in list(vs.items())[::(-1 if rnd % 2 else 1)]:
                    linear_norm.fold_config = fold
                    try:
                        res = bencher.measure({"kind": g.kind, "shape": g.shape, "knobs": knobs})
                    finally:
                        linear_norm.fold_config = shipped_fold
                    if res["status"] != "ok":
                        wrong += str(res.get("error") or "").startswith("wrong result")
                        print(f"  {name} {make_spec(knobs)}: {res['status']}: {res['error']}")
                        continue
                    raw.setdefault((make_spec(knobs), name), []).append(
                        (res["value_us"], res["ref_us"]))
            res = bencher.measure({"kind": g.kind, "shape": g.shape,
                                   "knobs": {shipped.BASELINE_KNOB: "compile"}})
            if res["status"] == "ok":
                comp.append((res["value_us"], res["ref_us"]))
        refs = [r for v in raw.values() for _, r in v] + [r for _, r in comp]
        if not refs:
            continue
        ref_med = statistics.median(refs)

        def steady(samples: list[tuple[float, float]], ref_med: float = ref_med) -> float:
            return statistics.median(t / r for t, r in samples) * ref_med

        best = {name: float("inf") for name in vs}
        for knobs in configs:
            spec = make_spec(knobs)
            if (spec, "current") not in raw:
                continue
            cur = steady(raw[(spec, "current")])
            cells = []
            for name in vs:
                if (spec, name) in raw:
                    t = steady(raw[(spec, name)])
                    best[name] = min(best[name], t)
                    over_current[name].append(t / cur)
                    cells.append(f"{name} {t:.1f}")
            print(f"  {spec}\n    " + ", ".join(cells))
        if comp:
            c = steady(comp)
            print(f"  torch.compile {c:.1f} us; over the best: "
                  + ", ".join(f"{k} {c / b:.3f}" for k, b in best.items() if b < float("inf")))
    for name, r in over_current.items():
        if r:
            print(f"{name}: over current median {statistics.median(r):.3f} "
                  f"({min(r):.3f}-{max(r):.3f}, {len(r)} configurations)")
    print(f"wrong results: {wrong}")
    return 1 if wrong else 0


def parts() -> int:
    import torch
    import triton.testing
    from _live import live_setup

    from harness import goldens
    from harness import kinds as registry
    from harness.cards import DEPLOYABLE
    from harness.kinds import linear_norm
    from harness.kinds.base import cdiv, gemm_launch, next_pow2

    live = live_setup()
    if live is None:
        return 2
    card, _bencher, anchors = live
    print(f"card: {card.name}")
    print(f"{'shape':36} {'gemm':>7} {'+ss':>7} {'whole':>7} {'1k/4w':>7} {'compile':>7} "
          f"{'torch':>7}  (us, do_bench medians)")

    def med(fn: object) -> float:
        return 1e3 * triton.testing.do_bench(fn, return_mode="median")

    for g in goldens.shapes(DEPLOYABLE, kinds=["linear_norm"]):
        knobs = anchors.get(g.shape_id)
        if knobs is None or knobs.get("ROW_PROGRAM"):
            print(f"{g.shape_id:36} no tiled anchor")
            continue
        kind = registry.get("linear_norm")
        inputs = kind.make_inputs(g.shape, "cuda", 0)
        x, w, out = inputs["x"], inputs["w"], inputs["out"]
        ss = torch.empty(x.shape[0], cdiv(w.shape[0], knobs["BLOCK_N"]), device="cuda",
                         dtype=torch.float32)
        plain = gemm_launch(knobs, x, w, out)
        with_ss = gemm_launch(knobs, x, w, out, ss=ss, epilogue=2)
        whole = kind.prepare(knobs, g.shape, inputs)
        shipped_fold = linear_norm.fold_config
        linear_norm.fold_config = variants(next_pow2)["1k/4w"]
        try:
            earlier = kind.prepare(knobs, g.shape, inputs)
        finally:
            linear_norm.fold_config = shipped_fold
        atol, rtol = kind.tolerance(g.shape["dtype"])
        ref = kind.reference(g.shape, inputs).float()
        ok = True
        for launch in (whole, earlier):
            out.fill_(float("nan"))
            launch.run()
            ok = ok and torch.allclose(out.float(), ref, rtol=rtol, atol=atol)
        comp = kind.baseline("compile", g.shape, inputs)
        tor = kind.baseline("torch", g.shape, inputs)
        t = [med(plain), med(with_ss), med(whole.run), med(earlier.run), med(comp.run),
             med(tor.run)]
        print(f"{g.shape_id:36} " + " ".join(f"{v:7.1f}" for v in t)
              + ("" if ok else "  WRONG RESULT"))
        del inputs, ss
    return 0


if __name__ == "__main__":
    sys.exit(main())
