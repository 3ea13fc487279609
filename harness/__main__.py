"""Command line of collect-node-data: ``python -m harness <subcommand>`` (merge, goldens, …)."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.store import (
    NodeStore,
    StoreError,
    default_db_path,
    format_receipt,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A user-facing failure: printed as ``error: <message>``, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- merge


def _add_merge(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "merge",
        help="merge box rows files (JSON lines) into the node DB in one transaction",
        description="Merge measured rows into the node table in one transaction, back the DB "
        "up, and print how many node rows each card now has.  A line that cannot become a row "
        "is set aside with its reason in a rejected-rows file and the others merge; the exit "
        "status is then 1.",
    )
    p.add_argument("rows_files", nargs="+", type=Path, metavar="ROWS.jsonl",
                   help="rows files a run fetched (one JSON row a line), e.g. "
                        "~/.cache/emmy/node-collect/rows/*/*.jsonl")
    p.add_argument(
        "--db",
        type=Path,
        default=None,
        help="node DB to merge into (default: $EMMY_TUNE_DB, else ~/.cache/emmy/autotune.db)",
    )
    p.add_argument(
        "--no-backup", action="store_true", help="skip the VACUUM INTO backup after the merge"
    )
    p.add_argument(
        "--rejected",
        type=Path,
        default=None,
        metavar="FILE",
        help="where rows that cannot be merged are set aside with their reasons (default: "
        "$EMMY_STATE_DIR/rejected/rejected-<time>.jsonl, ~/.cache/emmy/node-collect by default)",
    )
    p.add_argument(
        "--from-other-table", action="store_true",
        help="also merge rows files whose run's owner.json names another node table (by "
        "default they are skipped: that run belongs to the table it names)")
    p.set_defaults(func=_cmd_merge)


def default_rejected_path() -> Path:
    import os
    import time

    state = Path(os.environ.get("EMMY_STATE_DIR", "~/.cache/emmy/node-collect")).expanduser()
    return state / "rejected" / f"rejected-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"


def _cmd_merge(args: argparse.Namespace) -> int:
    from harness.intake import source_of
    from harness.rows import RejectedRows
    from harness.store import RowsFile

    for path in args.rows_files:
        if not path.exists():
            raise CommandError(f"rows file not found: {path}", EXIT_USAGE)
        if not path.is_file():
            raise CommandError(f"rows file is not a file: {path}", EXIT_USAGE)
    if args.rejected is not None and args.rejected.is_dir():
        raise CommandError(f"--rejected {args.rejected}: is a directory; give a file", EXIT_USAGE)
    db_path = args.db if args.db is not None else default_db_path()
    rejected = RejectedRows(args.rejected or default_rejected_path())
    with NodeStore(db_path) as store:
        paths, skipped = list(args.rows_files), []
        if not args.from_other_table:
            others = {p: _other_table(p, store.db_id) for p in paths}
            skipped = [(p, named) for p, named in others.items() if named is not None]
            paths = [p for p in paths if others[p] is None]
        for p, named in skipped:
            print(f"skipped {p}: its run belongs to another node table ({named}; its "
                  "owner.json says so); merge it there, or here with --from-other-table",
                  file=sys.stderr)
        files = [RowsFile(p, source_of(p.resolve())) for p in paths]
        try:
            receipt = store.merge_files(files, rejected)
        except (sqlite3.Error, OSError) as e:
            raise CommandError(f"node DB {store.path}: {e}; nothing was merged") from e
        print(format_receipt(receipt))
        print(f"db: {store.path}")
        if args.no_backup:
            print("backup: skipped (--no-backup)")
        elif not receipt.changed:
            print("backup: skipped (nothing changed)")
        else:
            # Best-effort, as in the original: the merge has committed either way.
            try:
                print(f"backup: {store.backup()}")
            except (OSError, sqlite3.Error, StoreError) as e:
                print(f"warning: backup failed: {e}", file=sys.stderr)
    if skipped:
        print(f"error: skipped {len(skipped)} of {len(args.rows_files)} rows file(s) that belong "
              "to another node table (--from-other-table merges them)", file=sys.stderr)
    if receipt.rejected:
        print(f"error: {rejected_line(receipt)}", file=sys.stderr)
    return EXIT_FAILED if receipt.rejected or skipped else EXIT_OK


def _other_table(rows_file: Path, db_id: str) -> str | None:
    """The node table a rows file's run belongs to, where its ``owner.json`` (beside it) names
    one other than ``db_id``; None when it names this one, none (a ``--no-merge`` run, a run
    made before owner records) or there is no readable record."""
    import json

    try:
        owner = json.loads((rows_file.parent / "owner.json").read_text())
    except (OSError, ValueError):
        return None
    named = owner.get("db_id") if isinstance(owner, dict) else None
    if not isinstance(named, str) or named == db_id:
        return None
    return str(owner.get("db") or named)


def rejected_line(receipt: Any) -> str:
    """The one line that says rows were set aside, where, and the first reason."""
    return (f"rejected {receipt.rejected} row(s) that cannot be merged; they are set aside with "
            f"their reasons in {receipt.rejected_file} (first: {receipt.first_rejected})")


# ---------------------------------------------------------------- dispatch

# Each entry registers one subcommand on the subparsers object and sets ``func``.
# ---------------------------------------------------------------- goldens


def _add_goldens(subparsers: Any) -> None:
    p = subparsers.add_parser("goldens", help="golden shapes and per-card anchors")
    sub = p.add_subparsers(dest="goldens_command", required=True, metavar="ACTION",
                           help="record: write a card's anchors from the node table")
    r = sub.add_parser("record", help="write a card's anchors: its best deployable ok spec per "
                       "shape in the node table (ties: lower variance; never interpret rows)")
    r.add_argument("--db", type=Path, default=None, help="node table (default $EMMY_TUNE_DB or "
                   "~/.cache/emmy/autotune.db)")
    r.add_argument("--gpu", required=True, help="card alias, e.g. h200")
    r.add_argument("--out", type=Path, default=None,
                   help="anchors file (default harness/goldens/anchors/<alias>.json)")
    r.add_argument("--keep-faster", action="store_true",
                   help="a shape whose anchor in the file is faster than this table's best keeps "
                   "it (a short sweep does not undo a longer one); an --out file that does not "
                   "exist yet starts from the card's anchors")
    r.add_argument("--as-measured", action="store_true",
                   help="pick by the times as measured; by default each row's time is taken at "
                   "its shape's reference clock (harness/steady.py)")
    r.set_defaults(func=_cmd_goldens_record)


def _print_kernel_rev_notes(rows: Any) -> None:
    """On stderr: the kinds whose rows were measured with other kernel code than this."""
    from harness.kinds import kernel_rev_notes

    for line in kernel_rev_notes(rows):
        print(f"note: {line}", file=sys.stderr)


def _cmd_goldens_record(args: argparse.Namespace) -> int:
    from harness.cards import UnknownCardError, by_alias
    from harness.goldens.record import record

    try:
        card = by_alias(args.gpu)
    except UnknownCardError as exc:
        raise CommandError(f"--gpu: {exc}", EXIT_USAGE) from None
    db = args.db or default_db_path()
    if not db.is_file():
        raise CommandError(f"no node table at {db}", EXIT_USAGE)
    with NodeStore(db) as store:
        rows = store.rows(gpu=card.name, regime="deployable", status="ok")
    if not args.as_measured:
        from harness.steady import steadied

        rows = steadied(rows)
    if not rows:
        raise CommandError(f"{db} has no deployable ok rows of {card.name}; nothing recorded")
    _print_kernel_rev_notes(rows)
    done = record(rows, card, args.out, keep_faster=args.keep_faster)
    print(f"anchors of {card.name}: {done.written} shapes in {done.path} ({done.changed} new or "
          f"another configuration, {done.retimed} the same at a new time; from {len(rows)} ok "
          "rows)")
    return EXIT_OK


# ---------------------------------------------------------------- eval and report


def _eval_options(p: Any) -> None:
    p.add_argument("--db", type=Path, default=None,
                   help="node table (default $EMMY_TUNE_DB, else ~/.cache/emmy/autotune.db)")
    p.add_argument("--gpu", default=None, metavar="ALIAS|NAME",
                   help="evaluate only this card (an alias such as h200, or the gpu column's name)")
    p.add_argument("--kind", action="append", default=None, metavar="K",
                   help="evaluate only this kind (repeatable)")
    p.add_argument("--regime", choices=("deployable", "interpret"), default=None,
                   help="which rows to evaluate (default: deployable where the table has any, "
                   "else the regime it holds; interpret rows are inert)")
    p.add_argument("--prior", nargs="+", action="extend", default=None, metavar="NAME",
                   help="priors to evaluate: registered names or module:attr specs "
                   "(default: oracle random transfer roofline learned)")
    p.add_argument("--anchors", type=Path, default=None, metavar="DIR",
                   help="anchor files for the transfer prior (default harness/goldens/anchors)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prior and the trees")
    p.add_argument("--min-rows", type=int, default=3,
                   help="ok rows a shape needs to be evaluated (default 3)")
    p.add_argument("--folds", type=int, default=None, metavar="N",
                   help="fits of a learning prior per card: the shapes are dealt to N folds "
                   "kind by kind and each fold is scored by the fit that did not see it (default "
                   "6; 0: one fit per shape, leave-one-shape-out)")
    p.add_argument("--as-measured", action="store_true",
                   help="rank by the times as measured; by default each row's time is taken at "
                   "its shape's reference clock (its time over the reference timed beside it, "
                   "times the shape's median reference time: a card that slows under sustained "
                   "load does not favour the rows timed while it was cool)")


class _FitProgress:
    """The evaluation's fits on stderr (stdout stays the tables): one line rewritten in place
    on a terminal, a line per fit otherwise."""

    def __init__(self, stream: Any = None) -> None:
        import time

        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = time.monotonic
        self.start = self.clock()
        self.open = False

    def __call__(self, what: str, done: int, total: int) -> None:
        if done == 0 and not self.tty:
            return
        line = f"eval: {what}: {done}/{total} fits, {self.clock() - self.start:.0f} s"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + ("\n" if done == total else ""))
            self.open = done != total
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False


def _run_eval(args: argparse.Namespace, allow_empty: bool = False) -> Any:
    from harness.evaluate import FOLDS, EvalError, EvalRequest, RequestError, run_request
    from harness.priors import PriorError

    if args.min_rows < 2:
        raise CommandError(f"--min-rows {args.min_rows}: a shape needs at least 2 ok rows to "
                           "rank (the default is 3)", EXIT_USAGE)
    req = EvalRequest(db=args.db or default_db_path(), gpu=args.gpu, kinds=args.kind,
                      regime=args.regime, priors=args.prior or [], anchors_dir=args.anchors,
                      seed=args.seed, min_rows=args.min_rows,
                      folds=FOLDS if args.folds is None else args.folds,
                      as_measured=args.as_measured)
    progress = _FitProgress()
    try:
        return run_request(req, allow_empty=allow_empty, progress=progress)
    except (RequestError, PriorError) as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    except EvalError as e:
        raise CommandError(str(e)) from e
    except ImportError as e:
        raise CommandError(f"{e}; install the eval extra: pip install -e '.[eval]'") from None
    finally:
        progress.close()


def _add_eval(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate priors on the node table (Spearman, top-1 regret per shape)",
        description="Per card and regime, score every shape with >= 3 ok rows by each prior "
        "(lower = predicted faster): median Spearman against the measured times, and the "
        "regret of the prior's pick (its time over the best); a prior that scores every row "
        "of a shape alike abstains there (no pick, left out of its figures).  Learning priors "
        "are fitted per fold of shapes (--folds), and also leave-one-card-out when the table "
        "holds two or more cards; the fits go by on stderr.  Where the table holds shipped "
        "configurations or baselines, a second table sets the learned and transfer priors' "
        "picks beside the shipped heuristic, the autotune list, torch and torch.compile.")
    _eval_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON dict instead of tables")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also list the picks over 1.2x the best, the shapes each prior abstains "
                   "on and the shapes skipped")
    p.set_defaults(func=_cmd_eval)


def _cmd_eval(args: argparse.Namespace) -> int:
    import json

    from harness.evaluate import compare_shipped, format_eval, to_json

    run = _run_eval(args)
    _print_kernel_rev_notes(run.rows)
    versus = [e for e in compare_shipped(run.rows, run.blocks) if e.has_shipped]
    if args.json:
        print(json.dumps(to_json(run.blocks, db=str(args.db or default_db_path()),
                                 regime=run.regime, shipped=[e.to_json() for e in versus]),
                         indent=1))
    else:
        print(format_eval(run.blocks, versus, verbose=args.verbose))
    return EXIT_OK


def _add_report(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report", help="plots (PNG) and an index.html of the node table and the eval tables",
        description="Write coverage, distance-to-anchor and predicted-vs-measured plots and "
        "DIR/index.html gathering them with the eval tables (no external assets).")
    _eval_options(p)
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write into")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from harness import goldens
    from harness.evaluate import EvalError
    from harness.report import write_report

    run = _run_eval(args, allow_empty=True)
    try:
        anchors = goldens.anchors(args.anchors)
        index = write_report(args.out, run.rows, run.blocks, anchors, regime=run.regime,
                             db=str(args.db or default_db_path()))
    except (OSError, EvalError) as e:
        raise CommandError(f"report: {e}") from None
    print(f"report: {index}")
    return EXIT_OK


def _add_plan(subparsers: Any) -> None:
    from harness.contract import SweepOptions, add_options

    p = subparsers.add_parser(
        "plan", help="what a budget buys on a card, before anything is rented",
        description="Counts the card's pools here, leaves out the points the node table holds "
        "already, and runs the run's own planner (water-filled allotments, then top-ups) on "
        "jobs simulated at the node table's paces of the card (or the defaults): which jobs "
        "run, their allotments and about how many points each measures.")
    p.add_argument("--card", required=True, help="the card: an alias (l40s, h100, h200, …)")
    p.add_argument("--budget-s", type=float, required=True, help="the budget, seconds")
    p.add_argument("--db", type=Path, default=None,
                   help="the node table whose points and paces count (default $EMMY_TUNE_DB or "
                        "~/.cache/emmy/autotune.db, if it exists)")
    p.add_argument("--kind", action="append", default=None,
                   help="plan this kind only (again for more; default every kind)")
    p.add_argument("--slice", action="append", default=None, choices=("own", "cross", "tail"),
                   help="plan this slice only (again for more; default every slice)")
    p.add_argument("--lanes", type=int, default=1,
                   help="GPUs the box measures on at once (--box-gpus), default 1")
    for name, share in (("own", 60.0), ("cross", 25.0), ("tail", 15.0)):
        p.add_argument(f"--share-{name}", type=float, default=share, dest=f"share_{name}",
                       help=f"share of the budget for the {name} slice (default {share:g})")
    add_options(p.add_argument, SweepOptions)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    import json

    from harness import cards
    from harness import kinds as registry
    from harness.contract import OptionError, SweepOptions, ToolsSpec, new_run_id
    from harness.ledger import Ledger
    from harness.planner import Job, ShareError, normalize_shares
    from harness.sessions import estimate_order, format_preview, make_spec, preview
    from harness.slices import SLICES

    try:
        card = cards.by_alias(args.card)
        sweep = SweepOptions.from_namespace(args)
        shares = normalize_shares({s: getattr(args, f"share_{s}") for s in SLICES})
    except (cards.UnknownCardError, OptionError, ShareError) as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    if not (args.budget_s > 0) or args.lanes < 1:
        raise CommandError(f"--budget-s={args.budget_s:g} and --lanes={args.lanes}: give a "
                           "positive budget and at least one lane", EXIT_USAGE)
    unknown = sorted(set(args.kind or ()) - set(registry.names()))
    if unknown:
        raise CommandError(f"--kind {', '.join(unknown)}: unknown; valid kinds: "
                           f"{', '.join(registry.names())}", EXIT_USAGE)
    db = args.db or default_db_path()
    ledger = Ledger()
    if db.is_file():
        with NodeStore(db) as store:
            ledger = Ledger.from_records(store.ledger_records([card.name]))
    jobs = [(args.card, Job(s, k)) for s in (args.slice or SLICES)
            for k in (args.kind or registry.names())]
    run = new_run_id()
    spec = make_spec(run_id=run, session_id=run, budget_s=args.budget_s, shares=shares,
                     jobs=[j for _, j in estimate_order(jobs)], card=card.name,
                     regime=card.regime, db=db if db.is_file() else None, sweep=sweep,
                     tools=ToolsSpec())
    out = preview(spec, card, ledger, lanes=args.lanes)
    if args.json:
        print(json.dumps({**out, "jobs": out["jobs"], "db": str(db) if db.is_file() else None},
                         indent=1, default=str))
    else:
        print("\n".join(format_preview(out)))
    return EXIT_OK


def _add_status(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status", help="the box's session: running or not, its jobs, the log's last lines",
        description="Reads a box folder (this machine's, or --remote's over SSH) and says what "
        "its session is doing or did: who holds the box, the session's state and budget, each "
        "job's run, whether its tmux session is alive, and the last lines of sweep.log.  For a "
        "--provider slurm run (give its --gpu card and --box-dir): the Slurm job's id, its "
        "state and node, and while it waits in the queue the reason squeue gives.  It touches "
        "nothing.")
    p.add_argument("--box-dir", default=None,
                   help="the box folder, as the run was given it (default "
                        "~/.local/share/emmy/node-collect on the box; with --gpu "
                        "~/.local/share/emmy/node-collect-slurm)")
    p.add_argument("--gpu", default=None, metavar="ALIAS",
                   help="a --provider slurm run's card: read its box folder BOX_DIR/ALIAS on the "
                        "login node (this machine or --remote), where squeue answers")
    p.add_argument("--remote", default=None,
                   help="the server: user@host[:port] or an ~/.ssh/config alias (default: "
                        "this machine)")
    p.add_argument("--ssh-key", default=None, help="private key for --remote")
    p.add_argument("--known-hosts", default=None,
                   help="the file that verifies --remote's host key (default ~/.ssh/known_hosts)")
    p.add_argument("--tmux-socket", default=None, help="the run's --tmux-socket, if it had one")
    p.add_argument("--lines", type=int, default=10, help="lines of sweep.log to show (default 10)")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(func=_cmd_status)


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from harness.boxctl import DEFAULT_BASE, BoxDriver
    from harness.remote.tmux import Tmux
    from harness.remote.transport import LocalTransport
    from harness.status import box_status, format_status

    if args.remote is None:
        transport: Any = LocalTransport()
    else:
        from harness.remote.ssh import SSHTransport, parse_remote

        try:
            target = parse_remote(args.remote)
        except ValueError as e:
            raise CommandError(f"--remote={args.remote}: {e}", EXIT_USAGE) from None
        transport = SSHTransport(
            target, key_filename=Path(args.ssh_key).expanduser() if args.ssh_key else None,
            known_hosts=Path(args.known_hosts).expanduser() if args.known_hosts else None)
        try:
            transport.connect()
        except (ConnectionError, OSError) as e:
            raise CommandError(f"cannot reach --remote={args.remote}: {e}") from None
    if args.gpu is not None:
        from harness.cards import UnknownCardError, by_alias
        from harness.slurmbox import slurm_base

        if "," in args.gpu:
            raise CommandError(f"--gpu={args.gpu}: one card's alias, as the run's --gpu named "
                               "it (e.g. h100); run status once per card", EXIT_USAGE)
        try:
            by_alias(args.gpu)
        except UnknownCardError as e:
            raise CommandError(f"--gpu={args.gpu}: {e}", EXIT_USAGE) from None
        base = slurm_base(args.box_dir, args.gpu)
    else:  # as the run was given it: its tmux names come from it
        base = args.box_dir or DEFAULT_BASE
    driver = BoxDriver(transport=transport, tmux=Tmux(transport, args.tmux_socket), base=base)
    try:
        st = box_status(driver, max(0, args.lines))
    finally:
        transport.close()
    print(json.dumps(st, indent=1) if args.json else "\n".join(format_status(st)))
    return EXIT_FAILED if st.get("error") else EXIT_OK


SUBCOMMANDS: list[Callable[[Any], None]] = [_add_merge, _add_goldens, _add_eval, _add_report,
                                            _add_plan, _add_status]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness", description="collect-node-data: the node table and its tools."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                       help="what to do (each command has its own --help)")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except (StoreError, sqlite3.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted: a merge not committed is rolled back; nothing was merged by it",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
