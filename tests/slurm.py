"""A real Slurm cluster on 127.0.0.1 for the Slurm tests (a pytest plugin module).

``slurm``: one cluster per test session, i.e. per xdist worker: ``munged``, ``slurmctld`` and
``slurmd`` started in the foreground as this test session's children, with every file (munge
key and socket, ``slurm.conf``, state, spool, logs) in a folder of its own and ports of their
own.  One node of this machine's cores (``proctrack/linuxproc``, ``task/none``: no cgroups),
and partitions:

- ``debug`` (the default): a CPU node, the Triton interpreter's box;
- ``l40s`` and ``h100``: the same node, whose jobs see a card of that name (a ``TaskProlog``
  sets the probe's test seam ``EMMY_BOX_CARD_NAME``, as a real node's driver would name its
  GPU).

``slurm_login``: the cluster's login node over SSH, a real sshd on 127.0.0.1 (``tests/sshd.py``)
whose sessions talk to this cluster (``SLURM_CONF``), for ``--remote``.

The session's end cancels every job of the cluster, stops the daemons and removes the folder;
nothing of it is left in ``ps``.  Skips with a reason when Slurm or munge is not installed
(``.ci/run`` installs ``slurm-wlm`` and ``munge``).
"""

from __future__ import annotations

import atexit
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.sshd import SSHServer

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
CARDS = {"l40s": "NVIDIA L40S", "h100": "NVIDIA H100 80GB"}
_READY_TIMEOUT_S = 60.0


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


class SlurmCluster:
    """The daemons of one private cluster and how to talk to it (``env``: ``SLURM_CONF``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.node = f"emmy-{os.getpid()}"
        self.cpus = os.cpu_count() or 1
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment in which Slurm's commands talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=60, check=check)

    # -- setup ----------------------------------------------------------------------------------
    def _write_files(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o711)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir()
        prolog = self.root / "task_prolog.sh"
        prolog.write_text("#!/bin/sh\n# the card the node of each partition has\n"
                          'case "$SLURM_JOB_PARTITION" in\n'
                          + "".join(f'  {p}) echo "export EMMY_BOX_CARD_NAME={n}";;\n'
                                    for p, n in CARDS.items())
                          + "esac\n")
        prolog.chmod(0o755)
        ctld_port, slurmd_port = _free_port(), _free_port()
        user = getpass.getuser()
        r = self.root
        self.conf.write_text(f"""\
ClusterName=emmytest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge / 'munge.sock'}
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog={prolog}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
DebugFlags=NO_CONF_HASH
NodeName={self.node} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""" + "".join(f"PartitionName={p} Nodes={self.node} MaxTime=INFINITE State=UP\n" for p in CARDS))

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        with log:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True)

    def start(self) -> None:
        self._write_files()
        munge = self.root / "munge"
        self._spawn("munged", [str(_which("munged")), "-F", f"--socket={munge / 'munge.sock'}",
                               f"--key-file={munge / 'munge.key'}",
                               f"--log-file={munge / 'munged.log'}",
                               f"--pid-file={munge / 'munged.pid'}",
                               f"--seed-file={munge / 'munged.seed'}"])
        self._wait(lambda: (munge / "munge.sock").exists(), "munged's socket", "munged")
        self._spawn("slurmctld", [str(_which("slurmctld")), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0,
                   "slurmctld to answer", "slurmctld")
        self._spawn("slurmd", [str(_which("slurmd")), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: self.run("sinfo", "-h", "-n", self.node, "-o", "%t",
                                    check=False).stdout.split()[:1] == ["idle"],
                   "the node to be idle", "slurmd")

    def _wait(self, ready: object, what: str, daemon: str) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            proc = self.procs[daemon]
            if proc.poll() is not None:
                raise RuntimeError(f"{daemon} exited (rc {proc.returncode}) while waiting for "
                                   f"{what}:\n{self.logs()}")
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.1)
        raise RuntimeError(f"no {what} within {_READY_TIMEOUT_S:.0f}s:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            try:
                out.append(f"== {f.name}\n" + "\n".join(f.read_text(errors="replace")
                                                        .splitlines()[-15:]))
            except OSError:
                continue
        return "\n".join(out)

    # -- jobs -----------------------------------------------------------------------------------
    def jobs(self) -> dict[str, str]:
        """Job id → state of every job the cluster holds, ended ones too."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%i %T").stdout
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def live_jobs(self) -> set[str]:
        """Ids of the jobs waiting or running (or still ending)."""
        from harness.remote.slurm import ALIVE_STATES

        return {j for j, state in self.jobs().items() if state in ALIVE_STATES}

    def submit(self, *args: str) -> str:
        """Another user's job, e.g. ``submit('-c', '2', '--wrap', 'sleep 300')``."""
        return self.run("sbatch", "--parsable", "-o", "/dev/null", *args).stdout.strip()

    def wait_gone(self, *job_ids: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while set(job_ids) & self.live_jobs():
            assert time.monotonic() < deadline, f"jobs {job_ids} still live: {self.jobs()}"
            time.sleep(0.2)

    # -- teardown -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job, then end the daemons (slurmd last but one, munged last)."""
        if not self.procs:
            return
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "-u", getpass.getuser(), check=False)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if not self.live_jobs():
                        break
                except (subprocess.SubprocessError, ValueError):
                    break
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> SlurmCluster:
    """Start a private cluster (skips the test without Slurm or munge)."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found: install slurm-wlm and munge "
                    "(apt-get install slurm-wlm munge) to run the Slurm tests")
    # munged wants its socket's folders open to all (execute), so not under pytest's 0700
    # temp folders; a short path also keeps the socket's name under its length limit.
    root = Path(tempfile.mkdtemp(prefix="emmy-slurm-"))
    root.chmod(0o711)
    cluster = SlurmCluster(root)
    atexit.register(cluster.stop)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """One cluster per session (per xdist worker); each test leaves no job of its own."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_login(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[SSHServer]:
    """An sshd of its own on 127.0.0.1 whose sessions reach ``slurm`` as a login node's do."""
    from tests.sshd import start_server

    server = start_server(tmp_path_factory.mktemp("slurm-login"), env={"SLURM_CONF": str(slurm.conf)})
    try:
        yield server
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
