"""Slurm's command-line tools on the login node: submit a batch job, ask how it is, cancel it.

Every call is an argv run through a transport (this machine as the login node, or the login
node over SSH with ``--remote``), never a shell line with a value pasted in.  A job is known by
its id, which ``sbatch --parsable`` prints the moment the job exists: that id is the lease, and
a job is only ever cancelled by it (``scancel ID``), so no other job of the user or of anyone
else is touched.

``squeue -j ID -t all`` answers for a job while the controller remembers it (``MinJobAge``,
5 minutes by default, after it ended); ``sacct`` answers after that where the cluster keeps
accounting.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

from harness.contract import SlurmOptions
from harness.remote.transport import CommandResult, Transport

# A job in one of these states may still run the session (or is waiting to), or its processes
# are still being ended (COMPLETING): what it wrote is whole only once it has left them.
ALIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STOPPED", "COMPLETING")
# What Slurm's states of an ended job mean, for the summary.
ENDED_STATES = {
    "COMPLETED": "ended",
    "CANCELLED": "was cancelled (scancel, by you or an administrator)",
    "TIMEOUT": "reached its time limit",
    "PREEMPTED": "was preempted",
    "NODE_FAIL": "lost its node (a node failure)",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "ran out of memory",
    "BOOT_FAIL": "could not boot its node",
    "DEADLINE": "reached its deadline",
}
_JOB_ID = re.compile(r"^\d+$")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class SlurmError(RuntimeError):
    """A Slurm command failed: says which, its exit code and what it printed."""


@dataclass(frozen=True)
class JobInfo:
    """One answer about a job: its state (``""``: Slurm no longer knows it), the reason
    Slurm gives (why it waits, or why it ended) and its node."""

    job_id: str
    state: str
    reason: str = ""
    node: str = ""

    @property
    def alive(self) -> bool:
        return self.state in ALIVE_STATES

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    def describe(self) -> str:
        """``is pending (Resources)``, ``is running on node7``, ``was cancelled (…)``, …"""
        if not self.state:
            return "is no longer known to Slurm"
        if self.pending:
            return f"is pending ({self.reason})" if self.reason else "is pending"
        if self.state == "RUNNING":
            return f"is running on {self.node}" if self.node else "is running"
        if self.alive:
            return f"is {self.state.lower()}"
        word = ENDED_STATES.get(self.state, f"ended ({self.state})")
        reason = f" ({self.reason})" if self.reason else ""
        return f"{word}{reason}"


def parse_squeue(job_id: str, line: str) -> JobInfo:
    """A line of ``squeue -h -o '%T|%r|%N'`` (state, reason, node list) or of ``sacct -P -o
    State,Reason,NodeList``; Slurm's reason ``None`` (no reason) is read as none."""
    state, _, rest = line.strip().partition("|")
    reason, _, node = rest.partition("|")
    reason = "" if reason.strip() == "None" else reason.strip()
    return JobInfo(job_id, state.strip().split()[0] if state.strip() else "", reason,
                   node.strip())


def fill(template: str, gpu: str, flag: str) -> str:
    """``{gpu}`` in a Slurm option's value, the card's alias; any other placeholder is an
    error that names the valid one."""
    bad = sorted(set(_PLACEHOLDER.findall(template)) - {"gpu"})
    if bad:
        raise SlurmError(f"{flag}={template!r}: unknown placeholder(s) "
                         f"{', '.join('{' + b + '}' for b in bad)}; valid: {{gpu}} (the card's "
                         "alias, e.g. h100)")
    return template.replace("{gpu}", gpu)


def time_limit_minutes(budget_s: float, setup_s: float, grace_s: float) -> int:
    """A job's ``--time`` in minutes: the session's budget, its setup, and the grace of its
    jobs, rounded up."""
    return max(1, math.ceil((budget_s + setup_s + grace_s) / 60.0))


def sbatch_options(opts: SlurmOptions, gpu: str, *, job_name: str, output: str, chdir: str,
                   minutes: int) -> list[str]:
    """The options of the card ``gpu``'s batch job: one task on one node, its partition,
    account, gres and constraint from ``opts`` (``{gpu}`` filled in), its time limit and
    Slurm's own output file; then ``--slurm-extra`` as given."""
    out = [f"--job-name={job_name}", f"--output={output}", f"--chdir={chdir}", "--nodes=1",
           "--ntasks=1", f"--time={minutes}"]
    if opts.slurm_partition:
        out.append(f"--partition={fill(opts.slurm_partition, gpu, '--slurm-partition')}")
    if opts.slurm_account:
        out.append(f"--account={fill(opts.slurm_account, gpu, '--slurm-account')}")
    if opts.slurm_gres and opts.slurm_gres.strip().lower() != "none":
        out.append(f"--gres={fill(opts.slurm_gres, gpu, '--slurm-gres')}")
    if opts.slurm_constraint:
        out.append(f"--constraint={fill(opts.slurm_constraint, gpu, '--slurm-constraint')}")
    if opts.slurm_extra:
        out += shlex.split(fill(opts.slurm_extra, gpu, "--slurm-extra"))
    return out


class Slurm:
    """Slurm's tools on the login node that ``transport`` reaches."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def _run(self, argv: list[str], timeout: float = 120) -> CommandResult:
        try:
            return self.transport.run(argv, check=False, timeout=timeout)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found on {self.transport.name}: --provider slurm "
                             "runs Slurm's commands on the login node (this machine, or the "
                             "one --remote names); run where sbatch is on the PATH") from None

    def submit(self, options: list[str], script: str) -> str:
        """``sbatch --parsable OPTIONS SCRIPT``; the job's id."""
        argv = ["sbatch", "--parsable", *options, script]
        r = self._run(argv)
        job_id = r.stdout.strip().splitlines()[-1].split(";")[0].strip() if r.stdout.strip() else ""
        if r.rc != 0 or not _JOB_ID.match(job_id):
            missing = "command not found" in r.stderr or r.rc == 127
            hint = ("sbatch is not on the PATH of the login node" if missing else
                    "check --slurm-partition, --slurm-account, --slurm-gres, --slurm-constraint "
                    "and --slurm-extra against `sinfo` and your cluster's documentation")
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-10:])
            raise SlurmError(f"sbatch refused the job (exit {r.rc}) on {self.transport.name}: "
                             f"{shlex.join(argv)}\n{tail}\n({hint})")
        return job_id

    def info(self, job_id: str) -> JobInfo | None:
        """How the job is; None when Slurm did not answer (its controller is down, the login
        node unreachable): not an ended job."""
        try:
            r = self._run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T|%r|%N"], 60)
        except ConnectionError:
            return None
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        if r.rc == 0 and lines:
            return parse_squeue(job_id, lines[0])
        if r.rc == 0 or "Invalid job id" in r.stderr:
            return self._accounted(job_id)
        return None

    def _accounted(self, job_id: str) -> JobInfo:
        """A job squeue forgot: what accounting says, where the cluster keeps it."""
        try:
            r = self._run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Reason,NodeList"],
                          60)
        except (ConnectionError, SlurmError):
            return JobInfo(job_id, "")
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        if r.rc != 0 or not lines:
            return JobInfo(job_id, "")
        return parse_squeue(job_id, lines[0])

    def cancel(self, job_id: str) -> None:
        """``scancel ID``: this job and no other.  A job that has ended already is fine."""
        if not _JOB_ID.match(job_id):
            raise SlurmError(f"refusing to cancel {job_id!r}: not a Slurm job id")
        r = self._run(["scancel", job_id], 60)
        if r.rc != 0 and "Invalid job id" not in r.stderr and "already completing" not in r.stderr:
            raise SlurmError(f"scancel {job_id} failed (exit {r.rc}) on {self.transport.name}: "
                             f"{(r.stdout + r.stderr).strip()[-500:]}")
