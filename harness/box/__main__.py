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
import time
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
    from harness import pools, shipped
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
                       tail_cap=args.tail_cap, baselines=shipped.parse_baselines(args.baselines))
    ledger = Ledger.load(Path(args.ledger)) if args.ledger else Ledger()
    todo = [p for p in pool.points() if ledger.needs_run(p.key, card.regime, args.max_attempts)]
    payload = {
        "card": card.name, "regime": card.regime, "max_dist": args.max_dist,
        "tail_cap": args.tail_cap, "filter": args.filter,
        "remaining": pool.counts(p.key for p in todo), "total": pool.counts(),
        # of them, torch.compile's baselines: seconds each, where a configuration takes ms
        "compile_baselines": pool.counts(p.key for p in todo if p.spec == shipped.COMPILE_SPEC),
        "enumerated": {sp.golden.shape_id: sp.enumerated for sp in pool.shapes},
        "skipped_anchors": [{"gpu": a.gpu, "shape_id": a.shape_id, "spec": a.spec}
                            for a in pool.skipped_anchors],
    }
    if args.out not in (None, "-"):  # the controller's call: the pool file, and a log of it
        _write_json(args.out, payload)
        _print_plan(payload)
        return 0
    preview = budget_preview(payload, args.budget_s, args.s_per_point, args.shares)
    if args.json:
        _write_json(None, {**payload, "budget": preview})
    else:
        print("\n".join(format_preview(preview)))
    return 0


# Seconds a point takes in a sweep, where nothing better is known: an H200 sweep of 300 s
# measured 3348 points in 302 s of jobs; the interpreter on a 2-core machine about 0.5 s.
DEFAULT_S_PER_POINT = {"deployable": 0.09, "interpret": 0.5}
MIN_JOB_S = 10.0  # as harness.collection: a job allotted less is skipped


def budget_preview(payload: dict, budget_s: float, s_per_point: float | None,
                   shares: dict[str, float]) -> dict:
    """What ``budget_s`` buys on this card: the planner's allotments, each job spending
    ``s_per_point`` a point until its points or its allotment run out."""
    from harness import shipped
    from harness.planner import BudgetPlan, Job

    spp = s_per_point or DEFAULT_S_PER_POINT[payload["regime"]]
    counts = {Job(s, k): sum(shapes.values()) for s in SLICES
              for k, shapes in payload["remaining"][s].items()}
    heavy = {j: sum(payload.get("compile_baselines", {}).get(j.slice, {}).get(j.kind, {}).values())
             for j in counts}
    extra = {j: n * shipped.COMPILE_BASELINE_S for j, n in heavy.items() if n}
    plan = BudgetPlan(budget_s, shares, counts, s_per_point=spp, extra_s=extra)
    jobs = []
    for job in plan.order:
        allot = plan.allotment(job)
        n = counts[job]
        if allot < MIN_JOB_S:
            plan.skip(job)
            jobs.append({"slice": job.slice, "kind": job.kind, "points": n, "allotment_s": allot,
                         "measures": 0, "seconds": 0.0, "state": "skipped (under 10 s)"})
            continue
        # torch.compile's baselines first (as the job measures them), then the rest
        n_heavy = heavy[job]
        heavy_fit = min(n_heavy, int(allot / shipped.COMPILE_BASELINE_S))
        measures = heavy_fit + min(n - n_heavy, int(
            (allot - heavy_fit * shipped.COMPILE_BASELINE_S) / spp))
        spent = min(allot, (n - n_heavy) * spp + extra.get(job, 0.0))
        plan.record(job, spent)
        jobs.append({"slice": job.slice, "kind": job.kind, "points": n,
                     "allotment_s": round(allot, 1), "measures": measures,
                     "seconds": round(spent, 1),
                     "state": "all of its points" if measures == n else "budget spent"})
    total = sum(counts.values())
    bought = sum(j["measures"] for j in jobs)
    return {"card": payload["card"], "regime": payload["regime"], "budget_s": budget_s,
            "s_per_point": spp, "shares": plan.shares, "jobs": jobs, "points": total,
            "measures": bought, "unspent_s": round(budget_s - plan.spent_s, 1)}


def format_preview(p: dict) -> list[str]:
    shares = " ".join(f"{s} {v:.0%}" for s, v in p["shares"].items())
    lines = [f"what {p['budget_s']:.0f}s buys on {p['card']} ({p['regime']}), shares {shares}, "
             f"at about {p['s_per_point']:g}s a point (--s-per-point to change):",
             f"{'slice':5} {'kind':12} {'points':>7} {'allotted s':>10} {'measures':>8}  state"]
    for j in p["jobs"]:
        lines.append(f"{j['slice']:5} {j['kind']:12} {j['points']:>7} {j['allotment_s']:>10.0f} "
                     f"{j['measures']:>8}  {j['state']}")
    pct = p["measures"] / p["points"] if p["points"] else 1.0
    lines.append(f"total: about {p['measures']} of {p['points']} points ({pct:.0%}); "
                 f"{p['unspent_s']:.0f}s of the budget left unspent")
    return lines


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
                    remeasure=args.remeasure, baselines=args.baselines,
                    box_gpus=args.box_gpus, run_id=args.run_id or new_run_id())
    # tmux kill-session hangs up the pane, a controller may terminate: either ends the job
    # through its clean-up, which keeps the marks of the rows already written
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    from harness.box import process_age_s
    from harness.box.probe import LaneError

    try:  # the job's time counts from its process's start: imports, probe and pool build too
        run_job(cfg, started=time.monotonic() - process_age_s())
    except LaneError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class _Ended(BaseException):
    """The service was told to end by a signal (not one job's failure)."""


def cmd_serve(args: argparse.Namespace) -> int:
    from harness.box.runner import JobConfig
    from harness.box.service import Service

    run_dir = Path(args.run_dir)
    defaults = JobConfig(slice="own", kind="matmul", budget_s=0, rows_path=run_dir / "none.jsonl",
                         ledger_path=run_dir / "ledger.json", seed=args.seed,
                         warmup=args.warmup, iters=args.iters,
                         compile_workers=args.compile_workers, max_cv=args.max_cv,
                         remeasure=args.remeasure, box_gpus=args.box_gpus)

    def ended(signum: int, frame: object) -> None:
        raise _Ended(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, ended)
    from harness.box.probe import LaneError

    try:
        return Service(run_dir, defaults, idle_s=args.idle_s,
                       service_dir=Path(args.service_dir) if args.service_dir else None).serve()
    except _Ended as exc:
        return 128 + int(exc.args[0])
    except LaneError as exc:  # the GPUs asked for are not this box's to give
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


def cmd_worker(args: argparse.Namespace) -> int:
    from harness.box.bench import serve

    return serve(args.device, args.warmup, args.iters, args.seed, args.max_cv, args.remeasure)


def _pool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-dist", type=int, default=2)
    p.add_argument("--tail-cap", type=int, default=200)
    p.add_argument("--filter", default=None)
    p.add_argument("--baselines", default="torch,compile")
    p.add_argument("--max-attempts", type=int, default=2)


def _lane_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--box-gpus", default="1",
                   help="measure on these GPUs of the box, one lane (a pinned bench worker) "
                        "each: all, N (the first N) or indices 0,2,3 (default 1); on a box "
                        "without a GPU, N interpreter lanes")


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
    p.add_argument("--out", default=None, help="write the pool counts as JSON to this file")
    p.add_argument("--budget-s", type=float, default=3600.0,
                   help="the budget to preview (default 3600)")
    p.add_argument("--s-per-point", type=float, default=None,
                   help="seconds a point takes (default 0.09 on a GPU, 0.5 on the interpreter)")
    for name, share in (("own", 60.0), ("cross", 25.0), ("tail", 15.0)):
        p.add_argument(f"--share-{name}", type=float, default=share, dest=f"share_{name}")
    p.add_argument("--json", action="store_true", help="print the pools and the preview as JSON")
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
    _lane_args(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("serve", help="the session's box service: runs the jobs the controller "
                                      "asks for, its compile pool and bench worker kept warm")
    p.add_argument("--run-dir", required=True, help="BOX_DIR/rows/<run_id>")
    p.add_argument("--service-dir", default=None,
                   help="where requests and answers are exchanged (default RUN_DIR/service)")
    p.add_argument("--idle-s", type=float, default=600.0,
                   help="end when the controller has been silent this long (default 600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--compile-workers", type=int, default=None)
    _noise_args(p)
    _lane_args(p)
    p.set_defaults(func=cmd_serve)
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
    if args.cmd == "plan":
        args.shares = {s: getattr(args, f"share_{s}") for s in SLICES}
    if args.cmd in ("run", "serve") and (args.warmup < 5 or args.iters < 20):
        print("error: --warmup below 5 or --iters below 20 is under the measurement quality "
              "bar (the interpreter regime uses its own small counts)", file=sys.stderr)
        return 2
    if args.cmd in ("run", "serve"):
        from harness.box.probe import LaneError, parse_box_gpus

        try:
            parse_box_gpus(args.box_gpus)
        except LaneError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
