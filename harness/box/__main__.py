"""The box CLI: ``python -m harness.box probe | plan | serve | run | worker``.

Runs on the machine that owns the GPU (or on this machine for ``--gpu=local``), inside tmux,
so it can be resumed and debugged by hand.  Needs only the stdlib, torch and triton.  Its
options are generated from the contract (:mod:`harness.contract`), as the controller's are:
one default each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from harness.contract import (
    SLICES,
    WRONG_CARD_RC,
    OptionError,
    SweepOptions,
    ToolsSpec,
    add_options,
    new_run_id,
    parse_baselines,
)


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
    from harness.cards import card_from_probe

    info = probe()
    _write_json(args.out, info)
    if args.expect_card is not None:
        have = card_from_probe(info).name
        if have != args.expect_card:
            print(f"error: this box ({info.get('host')}) has {have}, and the session asks for "
                  f"{args.expect_card}: refused, nothing is measured here", file=sys.stderr,
                  flush=True)
            return WRONG_CARD_RC
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Count the pools of this box's card (or a catalog card): per slice, kind and shape, the
    points and those still to measure by a ledger.  What a budget buys: ``python -m harness
    plan`` on the controller."""
    from harness import kinds as registry
    from harness import pools, shipped
    from harness.cards import by_alias, card_from_probe
    from harness.ledger import Ledger

    sweep = SweepOptions.from_namespace(args)
    if args.card:
        card = by_alias(args.card)
    else:
        from harness.box.probe import probe

        card = card_from_probe(probe())
    kinds = args.kind or registry.names()
    pool = pools.build(card, kinds=kinds, filter=sweep.filter, max_dist=sweep.max_dist,
                       tail_cap=sweep.tail_cap, baselines=parse_baselines(sweep.baselines))
    ledger = Ledger.load(Path(args.ledger)) if args.ledger else Ledger()
    todo = [p for p in pool.points()
            if ledger.needs_run(p.key, card.regime, sweep.max_attempts)]
    payload = {
        "card": card.name, "regime": card.regime, "max_dist": sweep.max_dist,
        "tail_cap": sweep.tail_cap, "filter": sweep.filter,
        "remaining": pool.counts(p.key for p in todo), "total": pool.counts(),
        # of them, torch.compile's baselines: seconds each, where a configuration takes ms
        "compile_baselines": pool.counts(p.key for p in todo if p.spec == shipped.COMPILE_SPEC),
        "enumerated": {sp.golden.shape_id: sp.enumerated for sp in pool.shapes},
        "skipped_anchors": [{"gpu": a.gpu, "shape_id": a.shape_id, "spec": a.spec}
                            for a in pool.skipped_anchors],
    }
    if args.json or args.out not in (None, "-"):
        _write_json(args.out, payload)
    if not args.json:
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
    print("[plan] what a budget buys: python -m harness plan --card CARD --budget-s S [--db DB]")


def cmd_run(args: argparse.Namespace) -> int:
    """One job by hand, with tools of its own (a session's jobs run in ``serve``)."""
    from harness.box import process_age_s
    from harness.box.runner import JobConfig, run_job

    cfg = JobConfig(slice=args.slice, kind=args.kind, budget_s=args.budget_s,
                    rows_path=Path(args.rows), ledger_path=Path(args.ledger),
                    summary_path=Path(args.summary) if args.summary else None,
                    sweep=SweepOptions.from_namespace(args), tools=ToolsSpec.from_namespace(args),
                    run_id=args.run_id or new_run_id())
    # tmux kill-session hangs up the pane, a controller may terminate: either ends the job
    # through its clean-up, which keeps the marks of the rows already written
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    # the job's time counts from its process's start: imports, probe and pool build too
    run_job(cfg, started=time.monotonic() - process_age_s())
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def cmd_serve(args: argparse.Namespace) -> int:
    from harness.box.service import Ended, Service

    def ended(signum: int, frame: object) -> None:
        raise Ended(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, ended)
    return Service(Path(args.session)).serve()


def cmd_worker(args: argparse.Namespace) -> int:
    from harness.box.bench import serve

    return serve(args.device, args.warmup, args.iters, args.seed, args.max_cv, args.remeasure)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness.box", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="print the box's card, regime and versions as JSON")
    p.add_argument("--out", default=None)
    p.add_argument("--expect-card", default=None, metavar="NAME",
                   help=f"exit with status {WRONG_CARD_RC} unless the box's card is this one "
                        "(its canonical name, e.g. 'NVIDIA H100 80GB')")
    p.set_defaults(func=cmd_probe)
    p = sub.add_parser("plan", help="pool sizes per slice × kind × shape (ledger-aware)")
    p.add_argument("--card", default=None, help="count for a catalog card instead of this box's")
    p.add_argument("--kind", action="append", default=None,
                   help="count this kind only (again for more kinds; default every kind)")
    p.add_argument("--ledger", default=None, help="leave out the points this ledger calls done")
    p.add_argument("--out", default=None, help="also write the counts as JSON to this file")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    add_options(p.add_argument, SweepOptions)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("serve", help="the session's box service: runs every job of the session "
                                      "request on this box's clock")
    p.add_argument("--session", required=True,
                   help="BOX_DIR/service/<session_id>/session.json, the controller's request")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("run", help="bench one slice × kind until the budget or pool is spent")
    p.add_argument("--slice", required=True, choices=SLICES)
    p.add_argument("--kind", required=True)
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--summary", default=None)
    p.add_argument("--run-id", default=None)
    add_options(p.add_argument, SweepOptions, ToolsSpec)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("worker", help="(internal) the bench worker: JSON lines on stdin/stdout; "
                                      "its counts are the tools' (the interpreter lowers them)")
    p.add_argument("--device", required=True)
    for name, kind in (("--warmup", int), ("--iters", int), ("--seed", int),
                       ("--max-cv", float), ("--remeasure", int)):
        p.add_argument(name, type=kind, required=True)
    p.set_defaults(func=cmd_worker)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd in ("run", "plan"):  # checked before anything starts
            SweepOptions.from_namespace(args)
        if args.cmd == "run":
            ToolsSpec.from_namespace(args)
        return args.func(args)
    except OptionError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except BrokenPipeError:  # `plan | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
