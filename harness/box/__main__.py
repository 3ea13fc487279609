"""The box CLI: ``python -m harness.box probe | plan | run | worker``.

Runs on the machine that owns the GPU (or on this machine for ``--gpu=local``), inside tmux,
so it can be resumed and debugged by hand.  Needs only the stdlib, torch and triton.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from harness.slices import SLICES


def _write_json(path: str | None, payload: object) -> None:
    text = json.dumps(payload, indent=1, sort_keys=True)
    if path in (None, "-"):
        print(text)
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, p)


def cmd_probe(args: argparse.Namespace) -> int:
    from harness.box.probe import probe

    _write_json(args.out, probe())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from harness import kinds as registry
    from harness import pools
    from harness.cards import by_alias
    from harness.ledger import Ledger

    if args.card:
        card = by_alias(args.card)
        info = {"card": card.name, "regime": card.regime, "cc": list(card.cc)}
    else:
        from harness.box.probe import card_from_probe, probe

        info = probe()
        card = card_from_probe(info)
    kinds = args.kind or registry.names()
    pool = pools.build(card, kinds=kinds, filter=args.filter, max_dist=args.max_dist,
                       tail_cap=args.tail_cap)
    ledger = Ledger.load(Path(args.ledger)) if args.ledger else Ledger()
    todo = [p.key for p in pool.points() if ledger.needs_run(p.key, card.regime, args.max_attempts)]
    payload = {
        "card": card.name, "regime": card.regime, "max_dist": args.max_dist,
        "tail_cap": args.tail_cap, "filter": args.filter,
        "remaining": pool.counts(todo), "total": pool.counts(),
        "enumerated": {sp.golden.shape_id: sp.enumerated for sp in pool.shapes},
        "skipped_anchors": [{"gpu": a.gpu, "shape_id": a.shape_id, "spec": a.spec}
                            for a in pool.skipped_anchors],
    }
    _write_json(args.out, payload)
    if args.out not in (None, "-"):
        _print_plan(payload)
    return 0


def _print_plan(payload: dict) -> None:
    print(f"[plan] card {payload['card']} ({payload['regime']}), max dist {payload['max_dist']}, "
          f"tail cap {payload['tail_cap']}")
    for s in SLICES:
        for kind, shapes in sorted(payload["remaining"][s].items()):
            tot = sum(payload["total"][s].get(kind, {}).values())
            print(f"[plan] {s:5} {kind:12} {sum(shapes.values()):6} to measure of {tot:6} "
                  f"over {len(shapes)} shapes")
    for a in payload["skipped_anchors"]:
        print(f"[plan] anchor skipped (does not realize here): {a['gpu']} {a['shape_id']} {a['spec']}")


def cmd_run(args: argparse.Namespace) -> int:
    from harness.box.runner import JobConfig, new_run_id, run_job

    cfg = JobConfig(slice=args.slice, kind=args.kind, budget_s=args.budget_s,
                    rows_path=Path(args.rows), ledger_path=Path(args.ledger),
                    summary_path=Path(args.summary) if args.summary else None,
                    batch=args.batch, seed=args.seed, max_dist=args.max_dist,
                    tail_cap=args.tail_cap, filter=args.filter, max_attempts=args.max_attempts,
                    point_timeout_s=args.point_timeout_s, warmup=args.warmup, iters=args.iters,
                    compile_workers=args.compile_workers, max_cv=args.max_cv,
                    remeasure=args.remeasure, run_id=args.run_id or new_run_id())
    # tmux kill-session hangs up the pane, a controller may terminate: either ends the job
    # through its clean-up, which keeps the marks of the rows already written
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    run_job(cfg)
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def cmd_worker(args: argparse.Namespace) -> int:
    from harness.box.bench import serve

    return serve(args.device, args.warmup, args.iters, args.seed, args.max_cv, args.remeasure)


def _pool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-dist", type=int, default=2)
    p.add_argument("--tail-cap", type=int, default=200)
    p.add_argument("--filter", default=None)
    p.add_argument("--max-attempts", type=int, default=2)


def _noise_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-cv", type=float, default=0.05,
                   help="time a point again when its timed calls' coefficient of variation is "
                        "above this (default 0.05)")
    p.add_argument("--remeasure", type=int, default=2,
                   help="at most this many more timings of a noisy point (default 2)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness.box", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="print the box's card, regime and versions as JSON")
    p.add_argument("--out", default=None)
    p.set_defaults(func=cmd_probe)
    p = sub.add_parser("plan", help="pool sizes per slice × kind × shape (ledger-aware)")
    p.add_argument("--card", default=None, help="plan for a catalog card instead of this box's")
    p.add_argument("--kind", action="append", default=None)
    p.add_argument("--ledger", default=None)
    p.add_argument("--out", default=None)
    _pool_args(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("run", help="bench one slice × kind until the budget or pool is spent")
    p.add_argument("--slice", required=True, choices=SLICES)
    p.add_argument("--kind", required=True)
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--summary", default=None)
    p.add_argument("--batch", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--point-timeout-s", type=float, default=300.0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--run-id", default=None)
    p.add_argument("--compile-workers", type=int, default=None,
                   help="processes compiling the coming points ahead (default: the spare CPU "
                        "cores; 0: the bench worker compiles each point itself)")
    _noise_args(p)
    _pool_args(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("worker", help="(internal) the bench worker: JSON lines on stdin/stdout")
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    _noise_args(p)
    p.set_defaults(func=cmd_worker)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "run" and (args.warmup < 5 or args.iters < 20):
        print("error: --warmup below 5 or --iters below 20 is under the measurement quality "
              "bar (the interpreter regime uses its own small counts)", file=sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
