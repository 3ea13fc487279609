"""The pytest plugin: options, the sweep jobs as parametrized tests, merge at session end.

``conftest.py`` at the repository root loads this module.  Every option is declared here; the
collection session (:class:`harness.collection.Collection`) is created in
``pytest_configure`` only when sweep jobs are collected, and does the box work.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from harness import cards
from harness import kinds as registry
from harness.planner import Job, ShareError, normalize_shares
from harness.slices import SLICES

COLLECTION_KEY = pytest.StashKey["Collection"]()
CHECKED_KEY = pytest.StashKey[dict]()
JOB_FIXTURE = "sweep_job"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("collect-node-data", "collect-node-data: measure kernels on a GPU box")
    g.addoption("--gpu", default=cards.LOCAL,
                help="card alias the box must have (l40s, h100, h200, a100-80, rtx4090, …; a comma "
                     "list for several cards), 'auto' to accept the box's card, or 'local' to use "
                     "this machine as the box (default: local)")
    g.addoption("--budget-s", type=float, default=3600.0,
                help="wall-clock seconds for the whole sweep, shared by the jobs (default 3600)")
    g.addoption("--db", default=None,
                help="node table to merge into (default $EMMY_TUNE_DB or ~/.cache/emmy/autotune.db)")
    g.addoption("--ledger", default=None,
                help="resume state (default ~/.cache/emmy/node-collect/ledger.json)")
    g.addoption("--max-dist", type=int, default=2,
                help="knob distance that puts a spec in the own/cross slice (default 2)")
    for s, d in (("own", 60.0), ("cross", 25.0), ("tail", 15.0)):
        g.addoption(f"--share-{s}", type=float, default=d,
                    help=f"share of the budget for the {s} slice (default {d:g}; 0 skips it)")
    g.addoption("--tail-cap", type=int, default=200, help="tail points per shape (default 200)")
    g.addoption("--batch", type=int, default=6, help="points per batch (default 6)")
    g.addoption("--seed", type=int, default=0, help="seed of the batch draw (default 0)")
    g.addoption("--filter", default=None, help="keep golden shapes whose name contains this")
    g.addoption("--remote", default=None,
                help="an existing GPU server: user@host[:port] or an ~/.ssh/config alias (never "
                     "torn down; only our folder and tmux sessions are touched)")
    g.addoption("--ssh-key", default=None, help="private key for --remote (default: ssh config/agent)")
    g.addoption("--known-hosts", default=None,
                help="known_hosts file that verifies the box's host key (default ~/.ssh/known_hosts)")
    g.addoption("--accept-new-host-key", action="store_true", default=False,
                help="trust and save the host key of a box not yet in known_hosts (a changed key "
                     "is always refused)")
    g.addoption("--box-python", default=None,
                help="python on the box that has (or can get) torch and triton; a remote box gets a "
                     "venv over it (default python3; local: this python)")
    g.addoption("--box-dir", default=None,
                help="the harness folder on the box (default ~/.local/share/emmy/node-collect)")
    g.addoption("--rows-dir", default=None,
                help="where fetched rows files are kept (default ~/.cache/emmy/node-collect/rows)")
    g.addoption("--poll-s", type=float, default=None,
                help="seconds between polls of a running job (default 1 local, 60 remote)")
    g.addoption("--timeout-s", type=float, default=None,
                help="stop and harvest the sweep after this many seconds (default: the budget "
                     "plus one batch's bound)")
    g.addoption("--point-timeout-s", type=float, default=300.0,
                help="bound on one point (compile + check + timing), seconds (default 300)")
    g.addoption("--tmux-socket", default=None,
                help="tmux server socket name on the box (tmux -L); default: the user's server")
    g.addoption("--no-merge", action="store_true", default=False,
                help="keep the fetched rows but do not merge them (prints the merge command)")


def _validate(config: pytest.Config) -> dict[str, Any]:
    o = config.option
    try:
        gpus = cards.parse_gpu_option(o.gpu)
    except cards.UnknownCardError as exc:
        raise pytest.UsageError(f"--gpu: {exc}") from None
    if not math.isfinite(o.budget_s) or o.budget_s <= 0:
        raise pytest.UsageError(f"--budget-s={o.budget_s:g}: the budget must be a positive number of seconds")
    try:
        shares = normalize_shares({"own": o.share_own, "cross": o.share_cross, "tail": o.share_tail})
    except ShareError as exc:
        raise pytest.UsageError(str(exc)) from None
    for name, val, low in (("--batch", o.batch, 1), ("--tail-cap", o.tail_cap, 0),
                           ("--max-dist", o.max_dist, 0)):
        if val < low:
            raise pytest.UsageError(f"{name}={val}: must be at least {low}")
    for name, val in (("--poll-s", o.poll_s), ("--timeout-s", o.timeout_s),
                      ("--point-timeout-s", o.point_timeout_s)):
        if val is not None and not val > 0:
            raise pytest.UsageError(f"{name}={val:g}: must be a positive number of seconds")
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
    if o.ssh_key is not None and not Path(o.ssh_key).expanduser().is_file():
        raise pytest.UsageError(f"--ssh-key {o.ssh_key}: no such file")
    if o.known_hosts is not None and not Path(o.known_hosts).expanduser().parent.is_dir():
        raise pytest.UsageError(f"--known-hosts {o.known_hosts}: its folder does not exist")
    return {"gpus": gpus, "shares": shares, "db": db, "remote": remote}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sweep: one collection job (card × slice × kind)")
    # Every option is checked up front: a bad value stops the run before anything is touched.
    config.stash[CHECKED_KEY] = _validate(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if JOB_FIXTURE not in metafunc.fixturenames:
        return
    checked = metafunc.config.stash[CHECKED_KEY]
    params = []
    for gpu in checked["gpus"]:
        for s in SLICES:
            for k in registry.names():
                params.append(pytest.param((gpu, Job(s, k)), id=f"{gpu}-{s}-{k}",
                                           marks=[pytest.mark.sweep]))
    metafunc.parametrize(JOB_FIXTURE, params)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """After -k/-m deselection: order the jobs and set up the collection session."""
    jobs = [it for it in items if JOB_FIXTURE in getattr(it, "fixturenames", ())
            and hasattr(it, "callspec")]
    if not jobs:
        return
    from harness.collection import Collection, estimate_order

    checked = config.stash[CHECKED_KEY]
    selected = [it.callspec.params[JOB_FIXTURE] for it in jobs]
    order = estimate_order(selected)
    rank = {key: i for i, key in enumerate(order)}
    others = [it for it in items if it not in jobs]
    jobs.sort(key=lambda it: rank[it.callspec.params[JOB_FIXTURE]])
    items[:] = jobs + others
    config.stash[COLLECTION_KEY] = Collection(config, checked, order)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    coll = session.config.stash.get(COLLECTION_KEY, None)
    if coll is not None:
        coll.finish()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    coll = config.stash.get(COLLECTION_KEY, None)
    if coll is not None:
        for line in coll.summary_lines():
            terminalreporter.write_line(line)


def default_state_dir() -> Path:
    return Path(os.environ.get("EMMY_STATE_DIR", "~/.cache/emmy/node-collect")).expanduser()
