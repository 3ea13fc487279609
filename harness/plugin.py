"""The pytest plugin: options, the sweep jobs as parametrized tests, merge at session end.

``conftest.py`` at the repository root loads this module.  Every option is declared here; the
collection session (:class:`harness.collection.Collection`) is created in
``pytest_configure`` only when sweep jobs are collected, and does the box work.
"""

from __future__ import annotations

import math
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness import cards
from harness import kinds as registry
from harness.contract import OptionError, SlurmOptions, SweepOptions, ToolsSpec, add_options
from harness.interrupts import Interrupted
from harness.options import RunOptions, default_state_dir
from harness.planner import Job, ShareError, normalize_shares
from harness.slices import SLICES

if TYPE_CHECKING:
    from harness.progress import Progress

COLLECTION_KEY = pytest.StashKey["Collection"]()
CHECKED_KEY = pytest.StashKey[RunOptions]()
HARVEST_KEY = pytest.StashKey["Harvest"]()
INTERRUPTS_KEY = pytest.StashKey["Interrupts"]()
SESSION_KEY = pytest.StashKey[str]()
PROGRESS_KEY = pytest.StashKey["Progress"]()
SWEEP_IDS_KEY = pytest.StashKey[set]()
JOB_FIXTURE = "sweep_job"
REFUSED_OUTPUT = "emmy_refused"  # an xdist worker's cards refused for another card on the box


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("collect-node-data", "collect-node-data: measure kernels on a GPU box")
    g.addoption("--gpu", default=cards.LOCAL,
                help="card alias the box must have (l40s, h100, h200, a100-80, rtx4090, …; a comma "
                     "list for several cards), 'auto' to accept the box's card, or 'local' to use "
                     "this machine as the box; a box with another card is a usage error (exit "
                     "status 4) and none of its card's jobs runs (default: local)")
    g.addoption("--budget-s", type=float, default=3600.0,
                help="wall-clock seconds of each card's sweep, shared by its jobs; setup is not "
                     "counted (default 3600)")
    g.addoption("--db", default=None,
                help="node table to merge into (default $EMMY_TUNE_DB or ~/.cache/emmy/autotune.db)")
    g.addoption("--ledger", default=None,
                help="resume state (default ~/.cache/emmy/node-collect/ledger.json)")
    for s, d in (("own", 60.0), ("cross", 25.0), ("tail", 15.0)):
        g.addoption(f"--share-{s}", type=float, default=d,
                    help=f"share of the budget for the {s} slice (default {d:g}; 0 skips it)")
    # what reaches the box: declared once, in the contract both sides import
    add_options(g.addoption, SweepOptions, ToolsSpec, user_only=True)
    g.addoption("--remote", default=None,
                help="an existing GPU server: user@host[:port] or an ~/.ssh/config alias (never "
                     "torn down; only our folder and tmux sessions are touched)")
    g.addoption("--ssh-key", default=None, help="private key for --remote (default: ssh config/agent)")
    g.addoption("--known-hosts", default=None,
                help="known_hosts file that verifies the box's host key (default ~/.ssh/known_hosts)")
    g.addoption("--accept-new-host-key", action="store_true", default=False,
                help="trust and save the host key of a box not yet in known_hosts (a changed key "
                     "is always refused)")
    g.addoption("--provider", default=None, choices=["command", "skypilot", "slurm"],
                help="rent a 1-GPU server per card for this run and release it at the end; "
                     "slurm: submit one batch job per card from the login node (this machine, "
                     "or --remote)")
    g.addoption("--up-cmd", default=None,
                help="with --provider command: the command that makes a server and prints a JSON "
                     "object (ssh_target or ssh_host/ssh_port/ssh_user, and a handle) or a "
                     "user@host:port line; {gpu} and {gpu_name} are filled in")
    g.addoption("--down-cmd", default=None,
                help="with --provider command: the command that releases it; {handle}, {target}, "
                     "{gpu} and {gpu_name} are filled in")
    g.addoption("--sky-cloud", default=None, help="with --provider skypilot: the cloud to use")
    add_options(g.addoption, SlurmOptions)
    g.addoption("--keep-server", action="store_true", default=False,
                help="do not release a rented server; print it and the command that releases it")
    g.addoption("--box-python", default=None,
                help="the box's Python with torch and triton, used as it is (a venv, conda env or "
                     "system Python; default python3, local: this python)")
    g.addoption("--box-install", action="store_true", default=False,
                help="when --box-python cannot import torch and triton, make BOX_DIR/venv with "
                     "the pinned versions (downloads them); without it nothing is installed")
    g.addoption("--box-dir", default=None,
                help="the harness folder on the box (default ~/.local/share/emmy/node-collect)")
    g.addoption("--rows-dir", default=None,
                help="where fetched rows files are kept (default ~/.cache/emmy/node-collect/rows)")
    g.addoption("--poll-s", type=float, default=None,
                help="seconds between the controller's looks at the box's session (default 1 "
                     "local, 60 remote); the box never waits for them")
    from harness.contract import SLACK_PER_JOB_S
    from harness.slurmbox import QUEUE_ALLOWANCE_S

    g.addoption("--timeout-s", type=float, default=None,
                help=f"stop and harvest the sweep this many seconds after setup (default: the "
                     f"budget plus {SLACK_PER_JOB_S:g} s per job and {SLACK_PER_JOB_S:g} s more); "
                     "with --provider slurm, this many seconds after the job's submission, its "
                     "wait in the queue included (default: that, --slurm-setup-s and "
                     f"{QUEUE_ALLOWANCE_S / 3600:g} h in the queue); a job still waiting then is "
                     "cancelled")
    g.addoption("--tmux-socket", default=None,
                help="tmux server socket name on the box (tmux -L); default: the user's server")
    g.addoption("--no-merge", action="store_true", default=False,
                help="keep the fetched rows but do not merge them (prints the merge command)")
    g.addoption("--report-json", default=None, metavar="PATH",
                help="at the end, also write the run as JSON to this file: options, jobs, "
                     "totals, the merge and the exit status (written also when jobs or the "
                     "merge failed)")


def _validate(config: pytest.Config) -> RunOptions:
    o = config.option
    try:
        gpus = cards.parse_gpu_option(o.gpu)
    except cards.UnknownCardError as exc:
        raise pytest.UsageError(f"--gpu: {exc}") from None
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        raise pytest.UsageError(f"--gpu={o.gpu} names {', '.join(twice)} more than once; name "
                                "each card once (one box per card)")
    if not math.isfinite(o.budget_s) or o.budget_s <= 0:
        raise pytest.UsageError(f"--budget-s={o.budget_s:g}: the budget must be a positive number of seconds")
    try:
        shares = normalize_shares({"own": o.share_own, "cross": o.share_cross, "tail": o.share_tail})
    except ShareError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:  # what reaches the box: checked by the contract, as the box checks it
        sweep = SweepOptions.from_namespace(o)
        tools = ToolsSpec.from_namespace(o)
        slurm = SlurmOptions.from_namespace(o)
    except OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    if o.provider != "slurm":
        given = [f"{flag}={getattr(o, name)}" for name, flag in SlurmOptions.flags().items()
                 if getattr(o, name, None) != SlurmOptions.__dataclass_fields__[name].default]
        if given:
            raise pytest.UsageError(f"{given[0]} is only used with --provider=slurm "
                                    f"(--provider is {o.provider or 'not given'})")
    for name, val in (("--poll-s", o.poll_s), ("--timeout-s", o.timeout_s)):
        if val is not None and not (math.isfinite(val) and val > 0):
            raise pytest.UsageError(f"{name}={val:g}: must be a positive number of seconds")
    for flag in ("--db", "--ledger", "--ssh-key", "--known-hosts", "--box-python", "--box-dir",
                 "--rows-dir", "--tmux-socket", "--report-json"):
        value = getattr(o, flag[2:].replace("-", "_"), None)
        if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
            # a newline in a path splits the lines the box and the controller exchange
            raise pytest.UsageError(f"{flag}={str(value)!r}: a name with control characters "
                                    "(a newline, a tab, …) is refused; give a plain path")
    if o.box_dir is not None:
        # the root, a home or the working folder is not a folder of its own (``~`` is the box
        # user's home; for this machine as the box the real paths are compared too)
        norm = os.path.normpath(o.box_dir.strip())
        whole = norm in ("/", "//", ".", "..") or (norm.startswith("~") and "/" not in norm)
        if o.remote is None and o.provider is None:
            whole = whole or Path(o.box_dir).expanduser().resolve() in (
                Path("/"), Path.home().resolve(), Path.cwd().resolve())
        if whole:
            raise pytest.UsageError(f"--box-dir={o.box_dir}: the run fills this folder and keeps "
                                    "it to itself; give a folder of its own, e.g. "
                                    "~/.local/share/emmy/node-collect")
    db = Path(o.db).expanduser() if o.db else None
    remote = None
    if o.remote is not None:
        from harness.remote.ssh import parse_remote

        try:
            remote = parse_remote(o.remote)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        if gpus == [cards.LOCAL]:
            raise pytest.UsageError(f"--remote={o.remote} with --gpu=local: a remote box needs "
                                    "--gpu=ALIAS (the card it must have) or --gpu=auto")
    for name, val, needs in (("--up-cmd", o.up_cmd, "command"), ("--down-cmd", o.down_cmd, "command"),
                             ("--sky-cloud", o.sky_cloud, "skypilot")):
        if val is not None and o.provider != needs:
            raise pytest.UsageError(f"{name}={val!r} is only used with --provider={needs} "
                                    f"(--provider is {o.provider or 'not given'})")
    if o.provider is not None:
        if o.remote is not None and o.provider != "slurm":
            raise pytest.UsageError(f"--provider={o.provider} and --remote={o.remote} exclude each "
                                    "other: rent a server, or name the one you have")
        if any(g in (cards.LOCAL, cards.AUTO) for g in gpus):
            what = "to ask Slurm for" if o.provider == "slurm" else "to rent"
            raise pytest.UsageError(f"--provider={o.provider} needs --gpu=ALIAS[,ALIAS…] (the card "
                                    f"{what}), not --gpu={o.gpu}")
        if o.provider == "slurm":
            from harness.remote.slurm import SlurmError, sbatch_options

            try:  # a placeholder other than {gpu} is refused before anything is submitted
                sbatch_options(slurm, gpus[0], job_name="x", output="x", chdir="x", minutes=1)
            except SlurmError as exc:
                raise pytest.UsageError(str(exc)) from None
        if o.provider == "command" and not (o.up_cmd and o.down_cmd):
            missing = " and ".join(n for n, v in (("--up-cmd", o.up_cmd), ("--down-cmd", o.down_cmd))
                                   if not v)
            raise pytest.UsageError(f"--provider command needs --up-cmd and --down-cmd (missing: "
                                    f"{missing}), e.g. --up-cmd='mycloud create --gpu {{gpu}} "
                                    "--json' --down-cmd='mycloud delete {handle}'")
        from harness.remote.providers import ProviderError, substitute

        try:
            substitute(o.up_cmd or "x", {"gpu": "", "gpu_name": ""}, "--up-cmd")
            substitute(o.down_cmd or "x", {"gpu": "", "gpu_name": "", "handle": "", "target": ""},
                       "--down-cmd")
        except ProviderError as exc:
            raise pytest.UsageError(str(exc)) from None
    elif len(gpus) > 1 and o.remote is not None:
        raise pytest.UsageError(f"--gpu={o.gpu} names several cards but --remote is one server; "
                                "rent one per card with --provider")
    if o.ssh_key is not None and not Path(o.ssh_key).expanduser().is_file():
        why = "is a directory" if Path(o.ssh_key).expanduser().is_dir() else "no such file"
        raise pytest.UsageError(f"--ssh-key {o.ssh_key}: {why}; give the private key file "
                                "(or leave it out to use the ssh config or ssh-agent)")
    if o.known_hosts is not None and not Path(o.known_hosts).expanduser().parent.is_dir():
        raise pytest.UsageError(f"--known-hosts {o.known_hosts}: its folder does not exist; give "
                                "a file in an existing folder (default ~/.ssh/known_hosts)")
    report_json = _check_report_json(o, db)
    return RunOptions.from_config(o, gpus=gpus, shares=shares, db=db, report_json=report_json,
                                  remote=remote, sweep=sweep, tools=tools, slurm=slurm)


def _check_report_json(o: Any, db: Path | None) -> Path | None:
    """``--report-json``: a file (made or replaced at the end) in an existing, writable folder,
    and never the node DB or the ledger it would overwrite."""
    if o.report_json is None:
        return None
    from harness.store import default_db_path

    given = o.report_json
    if not given.strip():
        raise pytest.UsageError("--report-json='': empty; give the file to write the report to, "
                                "e.g. --report-json=collect-report.json")
    path = Path(given).expanduser().absolute()
    ledger = Path(o.ledger).expanduser() if o.ledger else default_state_dir() / "ledger.json"
    for what, other in (("the node DB (--db)", db or default_db_path()), ("the ledger (--ledger)", ledger)):
        if path.resolve() == other.expanduser().resolve():
            raise pytest.UsageError(f"--report-json={given} is {what}: the report would overwrite "
                                    "it; give another file, e.g. --report-json=collect-report.json")
    if path.is_dir():
        raise pytest.UsageError(f"--report-json={given}: is a directory; give a file path in it, "
                                f"e.g. --report-json={Path(given) / 'collect-report.json'}")
    if not path.parent.is_dir():
        raise pytest.UsageError(f"--report-json={given}: its folder {path.parent} does not exist; "
                                "create it first or give a file in an existing folder")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"--report-json={given}: its folder {path.parent} is not writable; "
                                "give a file in a folder you can write to")
    return path


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sweep: one collection job (card × slice × kind)")
    for s in SLICES:  # -m own, -m "softmax and not tail", …
        config.addinivalue_line("markers", f"{s}: the collection jobs of the {s} slice")
    for k in registry.names():
        config.addinivalue_line("markers", f"{k}: the collection jobs of the {k} kind")
    # Every option is checked up front: a bad value stops the run before anything is touched.
    opts = config.stash[CHECKED_KEY] = _validate(config)
    if len(opts.gpus) > 1 and getattr(config.option, "dist", "no") in ("load", "no") \
            and getattr(config.option, "numprocesses", None):
        config.option.dist = "loadgroup"  # one xdist group (one worker, one server) per card
    from harness.interrupts import Interrupts

    interrupts = config.stash[INTERRUPTS_KEY] = Interrupts()
    interrupts.install()
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None:
        config.stash[SESSION_KEY] = str(worker_input.get("emmy_session") or secrets.token_hex(6))
        return
    config.stash[SESSION_KEY] = secrets.token_hex(6)
    # the process that sees every report
    from harness.harvest import Harvest

    harvest = Harvest(db_path=opts.db_path, no_merge=opts.no_merge, budget_s=opts.budget_s,
                      leases_dir=opts.leases_dir, keep_server=opts.keep_server,
                      report_json=opts.report_json, options=opts.report(),
                      ledger_path=opts.ledger_path, rows_dir=opts.rows_dir,
                      session=config.stash[SESSION_KEY], interrupts=interrupts,
                      known_hosts=opts.known_hosts)
    config.stash[HARVEST_KEY] = harvest
    config.pluginmanager.register(harvest, "emmy-harvest")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: every worker belongs to this session (its leases are this session's)."""
    node.workerinput["emmy_session"] = node.config.stash[SESSION_KEY]


def pytest_unconfigure(config: pytest.Config) -> None:
    interrupts = config.stash.get(INTERRUPTS_KEY, None)
    if interrupts is not None:
        interrupts.uninstall()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if JOB_FIXTURE not in metafunc.fixturenames:
        return
    opts = metafunc.config.stash[CHECKED_KEY]
    params = []
    for gpu in opts.gpus:
        for s in SLICES:
            for k in registry.names():
                params.append(pytest.param((gpu, Job(s, k)), id=f"{gpu}-{s}-{k}",
                                           marks=[pytest.mark.sweep, getattr(pytest.mark, s),
                                                  getattr(pytest.mark, k),
                                                  pytest.mark.xdist_group(f"card-{gpu}")]))
    metafunc.parametrize(JOB_FIXTURE, params)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """After -k/-m deselection: order the jobs and set up the collection session."""
    jobs = [it for it in items if JOB_FIXTURE in getattr(it, "fixturenames", ())
            and hasattr(it, "callspec")]
    if not jobs:
        return
    from harness.collection import Collection
    from harness.sessions import estimate_order

    opts = config.stash[CHECKED_KEY]
    selected = [it.callspec.params[JOB_FIXTURE] for it in jobs]
    order = estimate_order(selected)
    rank = {key: i for i, key in enumerate(order)}
    others = [it for it in items if it not in jobs]
    jobs.sort(key=lambda it: rank[it.callspec.params[JOB_FIXTURE]])
    items[:] = jobs + others
    harvest = config.stash.get(HARVEST_KEY, None)
    if harvest is not None and not config.option.collectonly:
        harvest.select([(it.nodeid, *_key_words(it.callspec.params[JOB_FIXTURE]))
                        for it in jobs])
    config.stash[SWEEP_IDS_KEY] = {it.nodeid for it in jobs}
    config.stash[COLLECTION_KEY] = Collection(
        opts, order, interrupts=config.stash[INTERRUPTS_KEY],
        session=config.stash[SESSION_KEY], harvest=config.stash.get(HARVEST_KEY, None),
        progress=_progress(config, opts))


def _progress(config: pytest.Config, opts: RunOptions) -> Progress:
    """The run's lines (:mod:`harness.progress`).  pytest's file name before its letters is
    left out (the jobs are all one file's, and every line of the run's own would start it
    again); on a terminal each job's line is its result, so its letters are left out too."""
    from harness.progress import Progress, PytestTerminal, heartbeat_s

    reporter = config.pluginmanager.getplugin("terminalreporter")
    verbose = int(config.option.verbose or 0)
    term = PytestTerminal(reporter, config.pluginmanager.getplugin("capturemanager"),
                          config.get_terminal_writer() if reporter is not None else None)
    term.tty = term.tty and verbose <= 0  # -v: pytest's line per test, and every step plain
    progress = config.stash[PROGRESS_KEY] = Progress(term, verbose=verbose,
                                                     heartbeat_s=heartbeat_s(opts.budget_s))
    if reporter is not None and verbose <= 0:
        reporter.showfspath = False
    return progress


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config
                             ) -> tuple[str, str, str] | None:
    """On a terminal a job's line says how it went: no letter of pytest's beside it."""
    progress = config.stash.get(PROGRESS_KEY, None)
    if progress is None or not progress.tty or int(config.option.verbose or 0) > 0 \
            or report.nodeid not in config.stash.get(SWEEP_IDS_KEY, set()):
        return None
    if report.passed:
        return ("passed", "", "PASSED") if report.when == "call" else None
    if report.skipped:
        return ("skipped", "", "SKIPPED")
    if report.when == "call":
        return ("failed", "", "FAILED")
    return ("error", "", "ERROR")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A card's box is opened before its first job runs: a box with another card than
    ``--gpu`` names is a usage error, and none of that card's jobs runs or reports (no
    failure, no skip; the run ends with the message and exit status 4)."""
    coll = item.config.stash.get(COLLECTION_KEY, None)
    callspec = getattr(item, "callspec", None)
    if coll is None or callspec is None or JOB_FIXTURE not in callspec.params:
        return None
    gpu = callspec.params[JOB_FIXTURE][0]
    if coll.open_before_jobs(gpu, item.config.stash[PROGRESS_KEY]):
        return None
    return True  # handled: the card was refused


def _key_words(key: Any) -> tuple[str, str, str]:
    gpu, job = key
    return gpu, job.slice, job.kind


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the session's fixtures are torn down (boxes unlocked, servers released): merge
    what is left, back up, write the report; rows that were rejected fail the session."""
    coll = session.config.stash.get(COLLECTION_KEY, None)
    worker_output = getattr(session.config, "workeroutput", None)
    if coll is not None and coll.refused and worker_output is not None:
        worker_output[REFUSED_OUTPUT] = dict(coll.refused)  # to the controller's harvest
    harvest = session.config.stash.get(HARVEST_KEY, None)
    if harvest is None:
        return
    try:
        harvest.finish()
    except Interrupted as exc:
        if exc.second:  # leave at once, still say what is where
            harvest._left_at_once()
        else:  # the first signal waited for the merge, backup and ledger: they are done
            harvest.interrupted_at_end(exc.signame)
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    except KeyboardInterrupt:  # not our handler's: leave at once
        if harvest.interrupts is not None:
            harvest.interrupts.count = max(harvest.interrupts.count, 2)
        harvest._left_at_once()
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    finally:  # also when the merge or a release raised: write what is known
        if harvest.exit_status is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = harvest.exit_status
        if harvest.refused and session.exitstatus != pytest.ExitCode.INTERRUPTED:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR  # a box with another card
        harvest.write_report(session.exitstatus)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    progress = config.stash.get(PROGRESS_KEY, None)
    if progress is not None:
        progress.close()
    harvest = config.stash.get(HARVEST_KEY, None)
    if harvest is not None:
        status = terminalreporter._session.exitstatus if getattr(terminalreporter, "_session", None) \
            else exitstatus
        for line in harvest.summary_lines(status):
            terminalreporter.write_line(line)
