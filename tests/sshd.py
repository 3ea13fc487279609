"""A real OpenSSH server on 127.0.0.1 for the SSH tests (a pytest plugin module).

Register it with ``pytest_plugins = ["tests.sshd"]`` (in the root conftest.py or in a test
module).  Fixtures:

- ``sshd``: one server per test session, i.e. per xdist worker (its own free port, host
  key, client key and temp folder), stopped at the end of the session.
- ``sshd_private``: a fresh server for one test, which that test may restart or re-key.

Both skip with a reason when ``/usr/sbin/sshd`` is missing (CI installs openssh-server).
Every server listens on 127.0.0.1 only and lets in the current user with its generated key.
"""

from __future__ import annotations

import atexit
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SSHD = Path("/usr/sbin/sshd")
HOST = "127.0.0.1"
_READY_TIMEOUT_S = 10.0


class SSHServer:
    """One ``sshd -D -e`` on 127.0.0.1 with everything it needs in ``root``.

    Lifecycle: :func:`start_server` creates and starts it; :meth:`restart` stops it (dropping
    every open connection) and starts it again on the same port; :meth:`stop` ends it.
    """

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = dict(env or {})
        self.host = HOST
        self.port = 0
        self.user = getpass.getuser()
        self.host_key = root / "ssh_host_ed25519_key"
        self.client_key = root / "client_key"
        self.authorized_keys = root / "authorized_keys"
        self.known_hosts = root / "known_hosts"
        self.ssh_config = root / "ssh_config"
        self.config = root / "sshd_config"
        self.log = root / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"SSHServer({self.remote!r}, root={str(self.root)!r})"

    @property
    def remote(self) -> str:
        """The ``--remote`` value for this server."""
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def host_key_pub(self) -> str:
        """The host public key as ``ssh-ed25519 AAAA...`` (no comment)."""
        kind, b64, *_ = self.host_key.with_suffix(".pub").read_text().split()
        return f"{kind} {b64}"

    @property
    def host_key_fingerprint(self) -> str:
        """``SHA256:...`` as ``ssh-keygen -l`` prints it."""
        out = subprocess.run(["ssh-keygen", "-l", "-f", str(self.host_key.with_suffix(".pub"))],
                             check=True, capture_output=True, text=True).stdout
        return out.split()[1]

    # -- files --------------------------------------------------------------------------------
    def _write_files(self) -> None:
        _keygen(self.client_key, "sshd-test-client")
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.authorized_keys.chmod(0o600)
        self.regenerate_host_key()

    def regenerate_host_key(self) -> None:
        """A new host key (takes effect at the next start; known_hosts is left as it was)."""
        self.host_key.unlink(missing_ok=True)
        self.host_key.with_suffix(".pub").unlink(missing_ok=True)
        _keygen(self.host_key, "sshd-test-host")

    def session_env(self) -> dict[str, str]:
        """What every session through this sshd gets in its environment.  A box through this
        sshd is this machine: its tmux sockets go where the tests look for them, also when
        TMUX_TMPDIR points at a folder of its own; and the server's own ``env`` (e.g. the
        ``SLURM_CONF`` of a test cluster whose login node it is)."""
        tmpdir = os.environ.get("TMUX_TMPDIR")
        return {**({"TMUX_TMPDIR": tmpdir} if tmpdir else {}), **self.env}

    def _write_port_files(self) -> None:
        env = self.session_env()
        self.config.write_text(
            f"Port {self.port}\n"
            f"ListenAddress {HOST}\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "StrictModes no\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "PermitRootLogin prohibit-password\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "X11Forwarding no\n"
            "AllowTcpForwarding no\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n"
            "Subsystem sftp internal-sftp\n"
            "LogLevel VERBOSE\n"
            # sshd takes the first SetEnv line only: every variable goes on one
            + ("SetEnv " + " ".join(f'"{k}={v}"' for k, v in env.items()) + "\n" if env else ""))
        self.known_hosts.write_text(f"[{HOST}]:{self.port} {self.host_key_pub}\n")
        self.ssh_config.write_text(
            "Host testbox\n"
            f"    HostName {HOST}\n"
            f"    Port {self.port}\n"
            f"    User {self.user}\n"
            f"    IdentityFile {self.client_key}\n"
            f"    UserKnownHostsFile {self.known_hosts}\n")

    # -- process ------------------------------------------------------------------------------
    def _launch(self) -> None:
        """Start sshd on ``self.port``; raise OSError if it exits before it answers."""
        argv = [str(SSHD), "-D", "-e", "-f", str(self.config)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise OSError(f"sshd exited at start (port {self.port}); log:\n{self._log_tail()}")
            if _answers_ssh(self.port):
                return
            time.sleep(0.02)
        self.stop()
        raise OSError(f"sshd did not answer on {HOST}:{self.port} within {_READY_TIMEOUT_S} s; "
                      f"log:\n{self._log_tail()}")

    def start(self) -> None:
        if self.port:
            self._write_port_files()
            self._launch()
            return
        last: OSError | None = None
        for _ in range(5):  # another worker may take the free port before sshd binds it
            self.port = _free_port()
            self._write_port_files()
            try:
                self._launch()
                return
            except OSError as exc:
                last = exc
        raise RuntimeError(f"could not start sshd: {last}")

    def stop(self) -> None:
        """End sshd and every connection it serves (their processes are its descendants)."""
        if self.proc is None:
            return
        # Connections first (deepest first), so fewer orphans are left for init to reap.
        pids = [*reversed(_descendants(self.proc.pid)), self.proc.pid]
        for pid in pids:
            _kill(pid, signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            for pid in pids:
                _kill(pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        """Stop (dropping open connections) and start again on the same port."""
        self.stop()
        self.start()

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    # -- clients ------------------------------------------------------------------------------
    def transport(self, **kwargs: Any) -> Any:
        """An SSHTransport to this server (its client key and known_hosts unless given)."""
        from harness.remote.ssh import SSHTransport

        kwargs.setdefault("key_filename", self.client_key)
        kwargs.setdefault("known_hosts", self.known_hosts)
        kwargs.setdefault("ssh_config_path", os.devnull)
        return SSHTransport(self.remote, **kwargs)


def start_server(root: Path, env: dict[str, str] | None = None) -> SSHServer:
    """Create keys and config under ``root`` and start sshd (skips the test without sshd);
    ``env``: variables every session through it gets."""
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} not found: install openssh-server "
                    f"(apt-get install openssh-server) to run the SSH tests")
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen not found: install openssh-client to run the SSH tests")
    if os.geteuid() == 0:
        # sshd refuses to start as root without its privilege separation folder.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    server = SSHServer(root, env)
    server._write_files()
    server.start()
    atexit.register(server.stop)
    return server


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """One server per session (per xdist worker); tests must not re-key it."""
    server = start_server(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sshd_private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """A server of its own for one test, free to restart, stop or re-key."""
    server = start_server(tmp_path_factory.mktemp("sshd-private"))
    try:
        yield server
    finally:
        server.stop()


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _answers_ssh(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), so a stop really drops the connections."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it ended on its own meanwhile: nothing to stop
        return
