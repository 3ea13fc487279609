"""The seam between the controller and the box, declared once: both sides import this module.

What crosses the seam is here and nowhere else:

- the options that reach the box, as frozen values with one default each
  (:class:`SweepOptions`: which points and in what order; :class:`ToolsSpec`: what the box
  measures with), their checks, and the command-line options generated from them for pytest
  and for the box's own CLI (:func:`add_options`); :class:`SlurmOptions` too, the request
  that reaches a Slurm cluster's node as a batch job;
- the session request (:class:`SessionSpec`: every job pytest selected, in order, with the
  budget, shares, paces and options) and the box's answer (:class:`SessionStatus`, one entry
  per job the box ran or skipped), both with JSON round trips;
- where the session's files lie in the box folder (:class:`Layout`);
- the row a box writes and the merge reads (:data:`ROW_FIELDS` and its vocabularies);
- the seam's constants (the grace past an allotment, the least a job can use, a job's own
  overhead, the default paces), run ids, the pinned box versions and ``--box-gpus``.

Stdlib only: the box imports it beside the pure core, the controller beside its own parts,
and neither imports the other (``tests/test_contract.py`` holds both directions).
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import secrets
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

# -- constants of the seam ------------------------------------------------------------------

BOX_PINS = ("torch==2.11.0", "triton==3.6.0", "numpy<2.3")
"""What ``--box-install`` puts in BOX_DIR/venv (the ``box`` extra of pyproject.toml says the
same): the versions the kernels and timings were checked with on an H200."""

SLICES = ("own", "cross", "tail")
REGIMES = ("deployable", "interpret")
STATUSES = ("ok", "bench_fail", "timeout", "error", "crash")
TERMINAL_STATUSES = ("ok", "bench_fail")
"""A point with a row of one of these is done; the others are tried again (``max_attempts``)."""
MAX_ATTEMPTS = 2

BASELINES = ("torch", "compile")
"""What a user would run instead of a Triton kernel (``--baselines``)."""

BUDGET_GRACE_S = 20.0
"""A point started near the end of an allotment may run this far past it before it is cut: the
bound that keeps every job within that of its allotment."""

SLACK_PER_JOB_S = BUDGET_GRACE_S + 60.0
"""The controller's default limit on a card's session (``--timeout-s``) is the budget and this
much per job: the box bounds each job within the grace of its allotment; the rest is slack."""

MIN_JOB_S = 3.0
"""The least a job can use: an allotment under this is not started (its time goes on)."""

JOB_OVERHEAD_S = 1.0
"""A job's own start and end on a running box service (its points are drawn from pools built
once per session; its first compiles overlap the job before it)."""

DEFAULT_S_PER_POINT = {"deployable": 0.09, "interpret": 0.5}
"""Seconds one lane takes a point where the node table has no pace of the kind on the card: an
H200 sweep of 300 s measured 3348 points in 302 s of jobs; the interpreter on a 2-core machine
about half a second."""

COMPILE_BASELINE_S = 10.0
"""Seconds ``torch.compile``'s baseline of one shape takes (its max-autotune) where the node
table has none of the card yet: 1.2-33 s a shape on an H200, by kind."""

WRONG_CARD_RC = 4
"""The exit status of ``python -m harness.box probe --expect-card NAME`` on a box whose card is
another: a batch job refuses its node with it (the rows never mix cards)."""

FAIL_VALUE_US = 1e9
"""value_us of a row whose status is not ok: sorts after every real measurement."""


def new_run_id() -> str:
    """A run's id: ``bench-YYYYmmddTHHMMSSZ-<8 hex>`` (UTC), also its rows folder's name."""
    return f"bench-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(4)}"


class OptionError(ValueError):
    """An option's value that cannot be used: names the option, the value and what is valid."""


# -- --baselines and --box-gpus ---------------------------------------------------------------

def parse_baselines(value: str | None) -> tuple[str, ...]:
    """``--baselines``: ``torch,compile`` (the default), any of them, or ``none``."""
    if value is None:
        return BASELINES
    words = [w.strip() for w in value.split(",") if w.strip()]
    if words == ["none"]:
        return ()
    bad = [w for w in words if w not in BASELINES]
    if bad or not words:
        raise OptionError(f"--baselines={value}: {', '.join(bad) or 'empty'} is not a baseline; "
                          f"give {', '.join(BASELINES)} (comma-separated), or none")
    return tuple(b for b in BASELINES if b in words)


class LaneError(OptionError):
    """``--box-gpus`` names GPUs this box cannot give (or is not a valid value at all)."""


BoxGpus = str | int | tuple[int, ...]  # "all", a count, or GPU indices
BOX_GPUS_FORMS = ("all (every GPU of the box), N (the first N GPUs, e.g. 2) or a comma list of "
                  "GPU indices as nvidia-smi numbers them (e.g. 0,2,3)")


def parse_box_gpus(value: str) -> BoxGpus:
    """``--box-gpus``: ``"all"``, a count ``N`` (at least 1) or a list of distinct GPU indices
    (``0,2,3``: a comma makes it a list, so one GPU by its index is ``3,``)."""
    text = str(value).strip().lower()
    if text == "all":
        return "all"
    if "," not in text:
        if not text.isdigit() or int(text) < 1:
            raise LaneError(f"--box-gpus={value}: not a number of GPUs; give {BOX_GPUS_FORMS}")
        return int(text)
    words = [w.strip() for w in text.split(",")]
    if words[-1] == "" and len(words) > 1:  # "3,": one GPU by its index
        words = words[:-1]
    bad = [w for w in words if not w.isdigit()]
    if bad:
        raise LaneError(f"--box-gpus={value}: {bad[0] or 'an empty entry'!s} is not a GPU index; "
                        f"give {BOX_GPUS_FORMS}")
    indices = tuple(int(w) for w in words)
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise LaneError(f"--box-gpus={value} names GPU {', '.join(map(str, twice))} more than "
                        "once; name each GPU once (one lane per GPU)")
    return indices


def format_box_gpus(want: BoxGpus) -> str:
    """The option's value as written back on a command line."""
    if isinstance(want, tuple):
        return ",".join(map(str, want)) + ("," if len(want) == 1 else "")
    return str(want)


# -- options that cross the seam --------------------------------------------------------------

def option(default: Any, flag: str, help: str, *, type: Callable[[str], Any] = str,
           metavar: str | None = None, default_text: str | None = None,
           user: bool = True) -> Any:
    """A field of an options value: its one default, its flag and its help.  ``user``: also a
    pytest option (else only the box's CLI has it); ``default_text``: how help says the
    default, where the value alone would not."""
    return field(default=default, metadata={
        "flag": flag, "help": help, "type": type, "metavar": metavar,
        "default_text": default_text, "user": user})


def _check(flag: str, value: Any, ok: bool, want: str) -> None:
    if not ok:
        shown = f"{value:g}" if isinstance(value, float) else value
        raise OptionError(f"{flag}={shown}: {want}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class _Options:
    """JSON round trips and generated command-line options for the frozen option values."""

    @classmethod
    def flags(cls) -> dict[str, str]:
        return {f.name: f.metadata["flag"] for f in fields(cls)}  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Any:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise OptionError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; valid: "
                              f"{', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def from_namespace(cls, ns: Any) -> Any:
        """From parsed options (pytest's ``config.option`` or argparse's namespace); an option
        the parser did not declare keeps its default."""
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)  # type: ignore[arg-type]
                      if hasattr(ns, f.name)})

    def argv(self) -> list[str]:
        """These values as the box CLI's options (only those that differ from the default)."""
        out: list[str] = []
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value != f.default and value is not None:
                out.append(f"{f.metadata['flag']}={value}")
        return out


def add_options(add: Callable[..., Any], *specs: type, user_only: bool = False) -> None:
    """Declare the fields of ``specs`` as command-line options with ``add`` (argparse's
    ``add_argument`` or pytest's ``addoption``, which take the same arguments)."""
    for spec in specs:
        for f in fields(spec):
            meta = f.metadata
            if user_only and not meta["user"]:
                continue
            shown = meta["default_text"] or (f"default {f.default:g}" if isinstance(
                f.default, float) else f"default {f.default}" if f.default is not None
                else None)
            kwargs: dict[str, Any] = {
                "dest": f.name, "default": f.default if f.default is not MISSING else None,
                "help": meta["help"] + (f" ({shown})" if shown else "")}
            if meta["type"] is not str:
                kwargs["type"] = meta["type"]
            if meta["metavar"]:
                kwargs["metavar"] = meta["metavar"]
            add(meta["flag"], **kwargs)


@dataclass(frozen=True)
class SweepOptions(_Options):
    """Which points a card's jobs measure and in what order."""

    max_dist: int = option(2, "--max-dist", "knob distance to an anchor that puts a spec in the "
                           "own / cross slice", type=int)
    tail_cap: int = option(200, "--tail-cap", "tail points per shape", type=int)
    filter: str | None = option(None, "--filter", "keep golden shapes whose name contains this "
                                "(e.g. llama3-8b)", default_text="none")
    baselines: str = option(
        "torch,compile", "--baselines",
        "what a user would run instead of a Triton kernel, measured once per card and shape first "
        "in the own slice: torch (torch's own op), compile (torch.compile max-autotune of the "
        "reference, 1-33 s a shape on an H200 by kind, once per node table), both, or none")
    batch: int = option(6, "--batch", "points per batch", type=int)
    seed: int = option(0, "--seed", "seed of the batch draw and of the inputs", type=int)
    point_timeout_s: float = option(300.0, "--point-timeout-s", "bound on one point (compile + "
                                    "check + timing), seconds", type=float)
    max_attempts: int = option(MAX_ATTEMPTS, "--max-attempts", "tries of a point that times out or crashes "
                               "before it is left alone", type=int)

    def __post_init__(self) -> None:
        for name, low in (("max_dist", 0), ("tail_cap", 0), ("batch", 1), ("max_attempts", 1)):
            value = getattr(self, name)
            _check(self.flags()[name], value, isinstance(value, int) and value >= low,
                   f"must be at least {low}")
        _check("--seed", self.seed, isinstance(self.seed, int), "must be a whole number")
        _check("--point-timeout-s", self.point_timeout_s,
               _finite(self.point_timeout_s) and self.point_timeout_s > 0,
               "must be a positive number of seconds")
        if self.filter is not None:
            _check("--filter", self.filter, isinstance(self.filter, str) and _printable(self.filter),
                   "must be text without control characters")
        object.__setattr__(self, "baselines", ",".join(parse_baselines(self.baselines)) or "none")


@dataclass(frozen=True)
class ToolsSpec(_Options):
    """What the box measures with: its lanes, its compile pool and the timing protocol."""

    box_gpus: str = option(
        "1", "--box-gpus", "measure on several GPUs of one box, one lane (a bench worker pinned "
        "to its GPU) each, all fed from the same jobs: all, N (the first N GPUs) or GPU indices as "
        "nvidia-smi numbers them, e.g. 0,2,3; every GPU must be the box's card; on a box without a "
        "GPU, N interpreter lanes", metavar="all|N|LIST")
    compile_workers: int | None = option(
        None, "--compile-workers", "processes on the box that compile the coming points while the "
        "GPU measures; 0 turns compile-ahead off", type=int,
        default_text="default: the box's CPU cores less two, at most 16")
    max_cv: float = option(0.05, "--max-cv", "time a point again when its timed calls' "
                           "coefficient of variation is above this", type=float)
    remeasure: int = option(2, "--remeasure", "at most this many more timings of a noisy point",
                            type=int)
    warmup: int = option(5, "--warmup", "warm-up calls before a point is timed (at least 5; the "
                         "interpreter uses 1)", type=int, user=False)
    iters: int = option(20, "--iters", "timed calls of a point (at least 20; the interpreter "
                        "uses 3)", type=int, user=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "box_gpus", format_box_gpus(parse_box_gpus(self.box_gpus)))
        if self.compile_workers is not None:
            _check("--compile-workers", self.compile_workers,
                   isinstance(self.compile_workers, int) and self.compile_workers >= 0,
                   "must be at least 0")
        _check("--max-cv", self.max_cv, _finite(self.max_cv) and self.max_cv > 0,
               "must be a positive fraction, e.g. 0.05 (time again points whose calls vary more "
               "than 5%)")
        _check("--remeasure", self.remeasure,
               isinstance(self.remeasure, int) and self.remeasure >= 0,
               "must be at least 0")
        for name, low in (("warmup", 5), ("iters", 20)):
            value = getattr(self, name)
            _check(self.flags()[name], value, isinstance(value, int) and value >= low,
                   f"below {low} is under the measurement quality bar (the interpreter regime "
                   "uses its own small counts)")


@dataclass(frozen=True)
class SlurmOptions(_Options):
    """How ``--provider slurm`` asks a cluster for a card: one batch job per card runs the
    card's whole session (setup, probe, the box service) on the node Slurm allocates.
    ``{gpu}`` in the partition, gres and constraint is the card's alias (``h100``)."""

    slurm_partition: str | None = option(
        None, "--slurm-partition", "with --provider slurm: the partition of the card's job, e.g. "
        "gpu or gpu-{gpu}", default_text="default: the cluster's default partition")
    slurm_account: str | None = option(None, "--slurm-account", "with --provider slurm: the "
                                       "account the jobs are charged to", default_text="default: "
                                       "your default account")
    slurm_gres: str = option(
        "gpu:1", "--slurm-gres", "with --provider slurm: the generic resources of the card's "
        "job, e.g. gpu:{gpu}:1 where the cluster names GPU types after the cards; none asks for "
        "no gres (a cluster that hands out GPUs by partition or constraint)")
    slurm_constraint: str | None = option(
        None, "--slurm-constraint", "with --provider slurm: the node features the card's job "
        "needs, e.g. {gpu}", default_text="none")
    slurm_setup_s: float = option(
        900.0, "--slurm-setup-s", "with --provider slurm: seconds of the job's time limit for "
        "setup (Python check, probe, pools); the limit is this, the budget and the grace of "
        "each job", type=float)
    slurm_extra: str | None = option(
        None, "--slurm-extra", "with --provider slurm: more sbatch arguments, as one string "
        "split like a shell would, e.g. '--qos=high --cpus-per-task=16'", default_text="none")

    def __post_init__(self) -> None:
        for name in ("slurm_partition", "slurm_account", "slurm_gres", "slurm_constraint",
                     "slurm_extra"):
            value = getattr(self, name)
            if value is not None:
                _check(self.flags()[name], value, isinstance(value, str) and value.strip() != ""
                       and _printable(value), "must be non-empty text without control characters")
        _check("--slurm-setup-s", self.slurm_setup_s,
               _finite(self.slurm_setup_s) and self.slurm_setup_s > 0,
               "must be a positive number of seconds")
        if self.slurm_extra is not None:
            try:
                shlex.split(self.slurm_extra)
            except ValueError as exc:
                raise OptionError(f"--slurm-extra={self.slurm_extra!r}: {exc}; quote it as a "
                                  "shell would, e.g. --slurm-extra='--qos=high'") from None


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A name the box gives that becomes a path part (a run's or session's id, a rows file): no
separator, no leading dot, nothing a line-based listing could be split by."""


def _printable(text: str) -> bool:
    return not any(ord(c) < 32 or ord(c) == 127 for c in text)


# -- the session: the controller's request and the box's answer -------------------------------

@dataclass(frozen=True)
class JobRef:
    """One sweep job: all points of one kind in one slice."""

    slice: str
    kind: str

    @property
    def id(self) -> str:
        """The job's stable name, also its test id and its rows file's stem: ``slice-kind``."""
        return f"{self.slice}-{self.kind}"


SESSION_FORMAT = "collect-node-data session"
SESSION_VERSION = 1


@dataclass(frozen=True)
class SessionSpec:
    """Everything the box needs to run a card's whole session on its own clock: the jobs pytest
    selected in their order, the budget and the slices' shares, the seconds a point of each kind
    takes on one lane (``s_per_point``) and a ``torch.compile`` baseline of a shape takes
    (``compile_s``), from the node table's history, and the options."""

    run_id: str
    session_id: str
    budget_s: float
    shares: Mapping[str, float]
    jobs: tuple[JobRef, ...]
    s_per_point: Mapping[str, float]
    compile_s: Mapping[str, float]
    sweep: SweepOptions = field(default_factory=SweepOptions)
    tools: ToolsSpec = field(default_factory=ToolsSpec)

    def __post_init__(self) -> None:
        _check("--budget-s", self.budget_s, _finite(self.budget_s) and self.budget_s >= 0,
               "must be a number of seconds, at least 0")
        for name in (self.run_id, self.session_id):
            if not (isinstance(name, str) and name and _safe_name(name)):
                raise OptionError(f"session: {name!r} is not a usable run or session id (letters, "
                                  "digits, '.', '-' and '_' only)")
        for job in self.jobs:
            if job.slice not in SLICES:
                raise OptionError(f"session: job {job.id!r} has no slice of {', '.join(SLICES)}")

    def to_json(self) -> str:
        return json.dumps({
            "format": SESSION_FORMAT, "version": SESSION_VERSION, "run_id": self.run_id,
            "session_id": self.session_id, "budget_s": self.budget_s,
            "shares": dict(self.shares), "jobs": [[j.slice, j.kind] for j in self.jobs],
            "s_per_point": dict(self.s_per_point), "compile_s": dict(self.compile_s),
            "sweep": self.sweep.to_json(), "tools": self.tools.to_json()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SessionSpec:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != SESSION_FORMAT:
            raise OptionError("not a session request (its format is not "
                              f"{SESSION_FORMAT!r})")
        if data.get("version") != SESSION_VERSION:
            raise OptionError(f"session request of version {data.get('version')!r}; this box "
                              f"code reads version {SESSION_VERSION}: push the same harness to "
                              "both sides")
        return cls(run_id=data["run_id"], session_id=data["session_id"],
                   budget_s=float(data["budget_s"]), shares=dict(data["shares"]),
                   jobs=tuple(JobRef(s, k) for s, k in data["jobs"]),
                   s_per_point={k: float(v) for k, v in data["s_per_point"].items()},
                   compile_s={k: float(v) for k, v in data["compile_s"].items()},
                   sweep=SweepOptions.from_json(data["sweep"]),
                   tools=ToolsSpec.from_json(data["tools"]))


def _safe_name(name: str) -> bool:
    return all(c.isalnum() or c in ".-_" for c in name) and name not in (".", "..")


ENDED = "ended"
"""The file of a session's folder that lists, one a line, the id of every run as it becomes
final, and :data:`SESSION_ENDED` once the session has: what a waiting controller watches."""
SESSION_ENDED = "SESSION"

# A job's entry goes planned → running → one of FINAL; a job the plan leaves out is "skipped"
# from the start.  "died" is the controller's word for an entry whose service is gone.
FINAL = ("done", "stopped", "failed", "skipped", "died")
SESSION_FINAL = ("done", "stopped", "failed")


@dataclass
class Entry:
    """One run of a job in the session, as the box reports it: the job's run in the plan
    (``round`` 0) or a top-up after every planned job ran (``round`` 1, 2, …: time the jobs left
    unused, for points the job had left)."""

    slice: str
    kind: str
    round: int = 0
    state: str = "planned"
    reason: str | None = None  # why it was skipped, stopped or failed; or why it ended (stop)
    allotment_s: float = 0.0
    elapsed_s: float = 0.0
    points_total: int = 0  # the job's points on this card
    points_left: int = 0  # of them, still to measure (at the start, as it runs, at the end)
    benched: int = 0  # points measured by this run so far (as it runs, then at its end)
    ok: int = 0
    shape: str | None = None  # the shape_id it measures now (its last row's)
    best_us: float | None = None  # the session's best ok time on that shape so far
    eta_s: float | None = None  # the box's estimate of its seconds to go (running)

    @property
    def job(self) -> JobRef:
        return JobRef(self.slice, self.kind)

    @property
    def id(self) -> str:
        return self.job.id + (f".top{self.round}" if self.round else "")

    @property
    def final(self) -> bool:
        return self.state in FINAL


STATUS_FORMAT = "collect-node-data session status"


@dataclass
class SessionStatus:
    """The box's account of a session, rewritten whole (one JSON line, renamed into place) at
    its start, its plan, and every job's start and end.  ``spent_s`` is the box's own time
    charged to jobs; ``state`` is ``starting`` → ``running`` → ``done`` | ``stopped`` |
    ``failed``."""

    session_id: str
    run_id: str
    state: str = "starting"
    budget_s: float = 0.0
    spent_s: float = 0.0
    card: str | None = None
    regime: str | None = None
    lanes: int = 1
    pid: int | None = None
    error: str | None = None
    current: str | None = None  # the id of the entry running now
    started_at: float | None = None  # the box's wall clock when the service took the request
    eta_s: float | None = None  # the box's estimate of the session's seconds to go
    ended_at: float | None = None  # ... and when the session ended
    entries: list[Entry] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.state in SESSION_FINAL

    def entry(self, entry_id: str) -> Entry | None:
        for e in self.entries:
            if e.id == entry_id:
                return e
        return None

    def to_json(self) -> str:
        data = asdict(self)
        data["format"] = STATUS_FORMAT
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SessionStatus:
        data = json.loads(text)
        if not isinstance(data, dict) or data.pop("format", None) != STATUS_FORMAT:
            raise ValueError("not a session status")
        known = {f.name for f in fields(Entry)}
        data["entries"] = [Entry(**{k: v for k, v in e.items() if k in known})
                           for e in data.get("entries", [])]
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Layout:
    """Where a session's files lie in the box folder ``base`` (a POSIX path on the box).

    ``rows/<run_id>/`` holds the run's rows files (``<entry>.jsonl``), its ledger, its
    ``owner.json`` and the workers' logs; ``summary/<run_id>/<entry>.json`` each run's summary;
    ``service/<session_id>/`` the session's request (``session.json``), the service's claim of
    it (``claim.json``), its ``status.json``, and the controller's ``stop`` (at the next point)
    and ``drain`` (after the job in flight)."""

    base: str
    run_id: str
    session_id: str

    def _p(self, *parts: str) -> str:
        return posixpath.join(self.base, *parts)

    @property
    def run_dir(self) -> str:
        return self._p("rows", self.run_id)

    @property
    def ledger(self) -> str:
        return self._p("rows", self.run_id, "ledger.json")

    def rows(self, entry_id: str) -> str:
        return self._p("rows", self.run_id, f"{entry_id}.jsonl")

    def summary(self, entry_id: str) -> str:
        return self._p("summary", self.run_id, f"{entry_id}.json")

    @property
    def summary_dir(self) -> str:
        return self._p("summary", self.run_id)

    @property
    def service_dir(self) -> str:
        return self._p("service", self.session_id)

    def service(self, name: str) -> str:
        """``session.json``, ``claim.json``, ``status.json``, ``ended``, ``stop`` or
        ``drain``."""
        return self._p("service", self.session_id, name)


# -- the row ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RowField:
    """One key of a row: the JSON types it may hold and whether every row must have it."""

    types: tuple[str, ...]
    required: bool = False


ROW_FIELDS: Mapping[str, RowField] = {
    "point_key": RowField(("str",), True),
    "gpu": RowField(("str",), True),
    "regime": RowField(("str",), True),
    "kind": RowField(("str",), True),
    "shape_id": RowField(("str",), True),
    "spec": RowField(("str",), True),
    "status": RowField(("str",), True),
    "measured_at": RowField(("str",), True),
    "cc": RowField(("list",), True),
    "shape": RowField(("dict",)),
    "knobs": RowField(("dict",)),
    "slice": RowField(("str",)),
    "value_us": RowField(("number",)),
    "ref_us": RowField(("number",)),
    "variance": RowField(("number",)),
    "n_samples": RowField(("int",)),
    "error": RowField(("str",)),
    "features": RowField(("dict",)),
    "compile_s": RowField(("number",)),
    "bench_s": RowField(("number",)),
    "run_id": RowField(("str",)),
    "provenance": RowField(("dict",)),
}
"""The row a box writes (one JSON object per line of a rows file) and the merge, the counters
and ``bench/`` read: ``make_row`` writes exactly these keys."""

REQUIRED_ROW_KEYS = tuple(k for k, f in ROW_FIELDS.items() if f.required)


def count_statuses(lines: Iterable[str | bytes]) -> dict[str, Any]:
    """benched / ok / failed of a rows file's lines, as a job's summary says them (a line that
    is not a row is left to the merge, which sets it aside with its reason)."""
    statuses: dict[str, int] = {}
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            word = str(row.get("status"))
            statuses[word] = statuses.get(word, 0) + 1
    n = sum(statuses.values())
    ok = statuses.get("ok", 0)
    return {"benched": n, "ok": ok, "failed": n - ok, "statuses": statuses}
