"""The SSH transport: a remote box reached with paramiko (``--remote user@host[:port]``).

One :class:`SSHTransport` holds one connection, opened on first use and reopened after a
drop.  Host keys are verified against a known_hosts file; an unknown host is refused unless
the user opts in with ``--accept-new-host-key``, and a changed key is always refused.  Every
command is an argv list sent as one fully quoted line (:func:`remote_command_line`), so no
user text is ever interpreted by the remote shell.  The remote login shell must be a POSIX
shell (sh, bash, dash, zsh), as with OpenSSH itself.
"""

from __future__ import annotations

import getpass
import io
import ipaddress
import logging
import os
import posixpath
import re
import shlex
import tarfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TypeVar

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from harness.remote.transport import BoxUnreachable, CommandResult, RemoteCommandError, SSHError

log = logging.getLogger(__name__)

DEFAULT_PORT = 22
KEEPALIVE_S = 30.0
CONNECT_TIMEOUT_S = 20.0
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_SSH_CONFIG = "~/.ssh/config"
REMOTE_FORMS = ("user@host[:port], host[:port], [ipv6-address]:port, user@[ipv6-address]:port, "
                "or a Host alias from ~/.ssh/config")

_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?")
# A DNS name, an IPv4 address or an ~/.ssh/config alias; never starting with "-".
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

T = TypeVar("T")




class HostKeyError(SSHError):
    """The server's host key is unknown (and not accepted) or has changed."""

    def __init__(self, message: str, *, host: str, key_type: str, fingerprint: str) -> None:
        super().__init__(message)
        self.host = host
        self.key_type = key_type
        self.fingerprint = fingerprint


class SSHAuthError(SSHError):
    """The server refused our key (or we had none to offer)."""


class SSHKeyError(SSHError):
    """The private key named by ``--ssh-key`` (or IdentityFile) is missing or unusable."""


# -- where to connect ------------------------------------------------------------------------

@dataclass(frozen=True)
class SSHTarget:
    """Where a box is: ``host`` as the user wrote it (maybe an alias), the rest resolved."""

    host: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``user@host:port`` (an IPv6 address in brackets)."""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH (and paramiko) names this host in known_hosts."""
        if self.port == DEFAULT_PORT:
            return self.hostname
        return f"[{self.hostname}]:{self.port}"


def parse_remote(value: str, ssh_config_path: str | os.PathLike[str] | None = None) -> SSHTarget:
    """Resolve a ``--remote`` value against an ssh config (default ``~/.ssh/config``).

    As with OpenSSH, the host part is looked up in the config even when a user or port is
    given: HostName and IdentityFile come from the config; a user or port written in the
    value wins over the config's User / Port.
    """
    user, host, port = _split_remote(value)
    opts = _ssh_config_lookup(host, ssh_config_path)
    hostname = opts.get("hostname", host)
    if port is None and "port" in opts:
        if not _PORT.fullmatch(opts["port"]) or not 1 <= int(opts["port"]) <= 65535:
            raise ValueError(f"--remote {value!r}: the ssh config gives Port {opts['port']!r} "
                             f"for {host!r}; a port is a number from 1 to 65535")
        port = int(opts["port"])
    for unsupported in ("proxycommand", "proxyjump"):
        if unsupported in opts:
            warnings.warn(f"--remote {value!r}: the ssh config sets {unsupported} for {host!r}, "
                          f"which this harness does not support; connecting directly to "
                          f"{hostname}", stacklevel=2)
    return SSHTarget(
        host=host,
        hostname=hostname,
        port=port or DEFAULT_PORT,
        user=user or opts.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in opts.get("identityfile", [])),
    )


def _split_remote(value: str) -> tuple[str | None, str, int | None]:
    def bad(why: str) -> ValueError:
        return ValueError(f"--remote {value!r}: {why}; expected {REMOTE_FORMS}")

    if not value or any(c.isspace() for c in value):
        raise bad("empty or contains whitespace")
    user: str | None = None
    rest = value
    if "@" in value:
        user, _, rest = value.rpartition("@")
        if not _USER.fullmatch(user):
            raise bad(f"{user!r} is not a user name")
    port_text: str | None = None
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket:
            raise bad("'[' without a closing ']'")
        if tail:
            if not tail.startswith(":"):
                raise bad(f"unexpected {tail!r} after ']'")
            port_text = tail[1:]
        _check_ipv6(host, bad)
    elif rest.count(":") > 1:  # a bare IPv6 address, no port
        host = rest
        _check_ipv6(host, bad)
    else:
        host, colon, tail = rest.partition(":")
        if colon:
            port_text = tail
        if not _HOST.fullmatch(host):
            raise bad(f"{host!r} is not a host name")
    port = None
    if port_text is not None:
        if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
            raise bad(f"port {port_text!r} is not a number from 1 to 65535")
        port = int(port_text)
    return user, host, port


def _check_ipv6(host: str, bad: Callable[[str], ValueError]) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise bad(f"{host!r} is not an IPv6 address") from None


def _ssh_config_lookup(host: str, path: str | os.PathLike[str] | None) -> dict[str, Any]:
    cfg_path = Path(os.path.expanduser(path if path is not None else DEFAULT_SSH_CONFIG))
    if not cfg_path.exists():
        if path is not None:
            raise SSHError(f"ssh config {cfg_path} does not exist")
        return {"hostname": host}
    try:
        return dict(paramiko.SSHConfig.from_path(str(cfg_path)).lookup(host))
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise SSHError(f"cannot read ssh config {cfg_path}: {exc}") from exc


# -- the remote command line -----------------------------------------------------------------

def remote_command_line(argv: Sequence[str | os.PathLike[str]],
                        env: Mapping[str, str] | None = None) -> str:
    """The one line sent to the remote shell: every word quoted, env as an ``env`` prefix."""
    words = [os.fspath(a) for a in argv]
    if not words:
        raise ValueError("empty argv: nothing to run")
    if any("\0" in w for w in words) or any("\0" in v for v in (env or {}).values()):
        raise ValueError(f"a NUL byte cannot be passed to a remote command: {words!r}")
    if env:
        bad = [k for k in env if not _ENV_NAME.fullmatch(k)]
        if bad:
            raise ValueError(f"environment variable names must match [A-Za-z_][A-Za-z0-9_]*; "
                             f"got {bad!r}")
        if "=" in words[0]:
            raise ValueError(f"with env set, the program name cannot contain '=': {words[0]!r}")
        words = ["env", *(f"{k}={v}" for k, v in env.items()), *words]
    return shlex.join(words)


# -- host keys -------------------------------------------------------------------------------

class _AcceptNewOrReject(paramiko.RejectPolicy):
    """Refuse an unknown host key, or save it when the user passed --accept-new-host-key.

    paramiko only calls this for a host that has no key in known_hosts; a key that differs
    from the known one raises ``BadHostKeyException`` before any policy is asked.
    """

    def __init__(self, target: SSHTarget, known_hosts: Path, accept_new: bool,
                 revoked: frozenset[bytes]) -> None:
        self.target = target
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if key.asbytes() in self.revoked:
            raise HostKeyError(
                f"host {hostname} offered the {key.get_name()} key {key.fingerprint}, which "
                f"{self.known_hosts} marks @revoked; refused", host=hostname,
                key_type=key.get_name(), fingerprint=key.fingerprint)
        if not self.accept_new:
            kind = _keyscan_type(key)
            port = f"-p {self.target.port} " if self.target.port != DEFAULT_PORT else ""
            raise HostKeyError(
                f"host {hostname} is not in {self.known_hosts}; it offered a {key.get_name()} "
                f"key with fingerprint {key.fingerprint}. If that is the server's key, pass "
                f"--accept-new-host-key to save it there, or add it yourself with "
                f"`ssh-keyscan {port}-t {kind} {self.target.hostname} >> {self.known_hosts}` "
                f"(compare the fingerprint with `ssh-keygen -lf "
                f"/etc/ssh/ssh_host_{kind}_key.pub` on the server)",
                host=hostname, key_type=key.get_name(), fingerprint=key.fingerprint)
        _append_known_host(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("added %s host key %s for %s to %s (--accept-new-host-key)",
                    key.get_name(), key.fingerprint, hostname, self.known_hosts)


def _read_known_hosts(path: Path) -> tuple[list[HostKeyEntry], frozenset[bytes]]:
    """The entries and the @revoked keys of a known_hosts file (none if it is missing).

    paramiko's own loader gives up on the whole file at the first line it cannot parse; here
    such lines (and @cert-authority, which paramiko cannot use) are skipped, with a warning
    for damaged ones.
    """
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return [], frozenset()
    except OSError as exc:
        raise SSHError(f"cannot read known_hosts file {path} (--known-hosts): {exc}") from None
    entries: list[HostKeyEntry] = []
    revoked: set[bytes] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = ""
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
            if marker != "@revoked":
                log.debug("%s:%d: %s lines are not supported; skipped", path, lineno, marker)
                continue
        try:
            entry = HostKeyEntry.from_line(line, lineno)
        except (InvalidHostKey, paramiko.SSHException, ValueError) as exc:
            warnings.warn(f"{path}:{lineno}: skipping a known_hosts line that cannot be read "
                          f"({type(exc).__name__})", stacklevel=3)
            continue
        if entry is None:  # a key type paramiko does not know
            continue
        if marker:
            revoked.add(entry.key.asbytes())
        else:
            entries.append(entry)
    return entries, frozenset(revoked)


def _keyscan_type(key: paramiko.PKey) -> str:
    name = key.get_name()
    if name.startswith("ecdsa-"):
        return "ecdsa"
    return name.removeprefix("ssh-")


def _append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        needs_newline = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        f.write((("\n" if needs_newline else "") + line).encode())


# -- the transport ---------------------------------------------------------------------------

# What a dead or dying connection raises inside paramiko.
_LINK_ERRORS = (paramiko.SSHException, EOFError, OSError)


class SSHTransport:
    """A box over SSH: the :class:`~harness.remote.transport.Transport` protocol on paramiko.

    Lifecycle: constructing checks the arguments only; the connection opens on the first call
    (or :meth:`connect`), is kept alive (keepalive every ``keepalive_s``), and is reopened
    by the next call after it dropped.  A command that was never sent because the
    connection had gone stale is retried once after reconnecting; a command in flight when
    the connection broke raises :class:`BoxUnreachable` (it may or may not have run), and
    the next call reconnects.  File transfers are retried once (they are idempotent).
    """

    def __init__(self, target: SSHTarget | str, *,
                 key_filename: str | os.PathLike[str] | None = None,
                 known_hosts: str | os.PathLike[str] | None = None,
                 accept_new_host_key: bool = False,
                 keepalive_s: float = KEEPALIVE_S,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 ssh_config_path: str | os.PathLike[str] | None = None) -> None:
        self.target = parse_remote(target, ssh_config_path) if isinstance(target, str) else target
        self.name = self.target.name
        self.key_files = _key_files(self.target, key_filename)
        self.known_hosts = Path(os.path.expanduser(known_hosts or DEFAULT_KNOWN_HOSTS))
        self.accept_new_host_key = accept_new_host_key
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._home: str | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"SSHTransport({self.name!r}, known_hosts={str(self.known_hosts)!r})"

    def __enter__(self) -> SSHTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection ---------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the connection now (to surface host-key and auth problems early)."""
        self._live_transport()

    def close(self) -> None:
        with self._lock:
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except _LINK_ERRORS as exc:  # closing a dead link: nothing left to release
                    log.debug("closing sftp to %s: %s", self.name, exc)
                self._sftp = None
            if self._client is not None:
                self._client.close()
                self._client = None

    def _live_transport(self) -> paramiko.Transport:
        with self._lock:
            t = self._client.get_transport() if self._client is not None else None
            if t is None or not t.is_active():
                if self._client is not None:
                    log.info("connection to %s was lost; reconnecting", self.name)
                self.close()
                self._client = self._open_client()
                t = self._client.get_transport()
                assert t is not None
            return t

    def _open_client(self) -> paramiko.SSHClient:
        tgt = self.target
        client = paramiko.SSHClient()
        entries, revoked = _read_known_hosts(self.known_hosts)
        for entry in entries:
            if entry.key.asbytes() not in revoked:
                for hostname in entry.hostnames:
                    client.get_host_keys().add(hostname, entry.key.get_name(), entry.key)
        client.set_missing_host_key_policy(
            _AcceptNewOrReject(tgt, self.known_hosts, self.accept_new_host_key, revoked))
        keys = list(self.key_files)
        try:
            client.connect(
                tgt.hostname, tgt.port, username=tgt.user, key_filename=keys or None,
                allow_agent=not keys, look_for_keys=not keys, timeout=self.connect_timeout_s,
                banner_timeout=self.connect_timeout_s, auth_timeout=self.connect_timeout_s,
                channel_timeout=self.connect_timeout_s)
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"the host key of {tgt.known_hosts_name} has CHANGED: {self.known_hosts} has a "
                f"{exc.expected_key.get_name()} key {exc.expected_key.fingerprint}, but the server "
                f"sent {exc.key.get_name()} {exc.key.fingerprint}. The server may have been "
                f"reinstalled, or someone may be intercepting the connection. Refused, even with "
                f"--accept-new-host-key. If you know why the key changed, remove the old entry "
                f"with `ssh-keygen -R '{tgt.known_hosts_name}' -f {self.known_hosts}` and connect "
                f"again", host=tgt.known_hosts_name, key_type=exc.key.get_name(),
                fingerprint=exc.key.fingerprint) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise SSHKeyError(
                f"the private key {', '.join(keys) or '(default keys)'} is protected by a "
                f"passphrase, which this harness cannot ask for; load it into ssh-agent "
                f"(`ssh-add {keys[0] if keys else 'KEY'}`) and leave out --ssh-key") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            offered = (f"the key {', '.join(keys)}" if keys
                       else "ssh-agent and the default keys in ~/.ssh")
            raise SSHAuthError(
                f"{tgt.name} refused to log in {tgt.user!r} with {offered} ({exc}); pass "
                f"--ssh-key PATH with a key in the server's authorized_keys, or set "
                f"IdentityFile in ~/.ssh/config") from None
        except _LINK_ERRORS as exc:
            client.close()
            raise BoxUnreachable(f"cannot reach {tgt.name}: {_why_unreachable(exc)}") from exc
        t = client.get_transport()
        assert t is not None
        t.set_keepalive(max(1, int(self.keepalive_s)))
        log.debug("connected to %s", self.name)
        return client

    def _drop(self, broken: paramiko.Transport | None) -> None:
        """Forget a broken connection (unless another call already replaced it)."""
        with self._lock:
            current = self._client.get_transport() if self._client is not None else None
            if broken is None or current is broken:
                log.info("dropping the connection to %s", self.name)
                self.close()

    @staticmethod
    def _link_dead(t: paramiko.Transport | None) -> bool:
        """After an error: did the connection die?  (paramiko closes channels a moment before
        it marks the transport inactive, so give it that moment.)"""
        deadline = time.monotonic() + 0.5
        while t is not None and t.is_active() and time.monotonic() < deadline:
            time.sleep(0.01)
        return t is None or not t.is_active()

    # -- commands -----------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float = 600, check: bool = True,
            env: Mapping[str, str] | None = None) -> CommandResult:
        """Run argv on the box (stdin closed) and wait for it; rc 124 when it timed out."""
        line = remote_command_line(argv, env)
        words = tuple(os.fspath(a) for a in argv)
        res = self._exec(line, words, timeout)
        if check and res.rc != 0:
            raise RemoteCommandError(self.name, res)
        return res

    def _exec(self, line: str, argv: tuple[str, ...], timeout: float) -> CommandResult:
        deadline = time.monotonic() + timeout
        for attempt in (1, 2):
            t = self._live_transport()
            try:
                chan = t.open_session(timeout=min(self.connect_timeout_s, max(1.0, timeout)))
                break
            except _LINK_ERRORS as exc:
                # Nothing was sent yet, so trying again on a fresh connection is safe.
                self._drop(t)
                if attempt == 2:
                    raise BoxUnreachable(f"cannot open a channel on {self.name}: "
                                         f"{str(exc) or type(exc).__name__}") from exc
        log.debug("%s: %s", self.name, shlex.join(argv))
        try:
            chan.exec_command(line)
            chan.shutdown_write()
            return self._collect(chan, argv, deadline, timeout)
        except _LINK_ERRORS as exc:
            self._drop(t)
            raise BoxUnreachable(
                f"the connection to {self.name} broke while running {shlex.join(argv)} "
                f"(it may or may not have run); the next call reconnects") from exc
        finally:
            chan.close()

    def _collect(self, chan: paramiko.Channel, argv: tuple[str, ...], deadline: float,
                 timeout: float) -> CommandResult:
        out, err = bytearray(), bytearray()
        pause = 0.001
        while True:
            got = False
            while chan.recv_ready():
                out += chan.recv(65536)
                got = True
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                got = True
            # The exit status can arrive before the last stderr bytes: wait for the channel's
            # EOF (sent once both streams are drained) as well.
            if (chan.exit_status_ready() and (chan.eof_received or chan.closed)
                    and not chan.recv_ready() and not chan.recv_stderr_ready()):
                break
            if time.monotonic() >= deadline:
                return CommandResult(argv, 124, _text(out),
                                     _text(err) + f"\n(timed out after {timeout:g} s)")
            if got:
                pause = 0.001
            else:
                chan.status_event.wait(pause)
                pause = min(pause * 2, 0.05)
        rc = chan.exit_status
        if rc == -1:
            if self._link_dead(chan.get_transport()):
                raise EOFError("channel closed without an exit status")
            # The remote process was killed by a signal (paramiko drops "exit-signal");
            # OpenSSH's ssh exits 255 in that case too.
            return CommandResult(argv, 255, _text(out),
                                 _text(err) + "\n(ended without an exit status: killed by a signal?)")
        return CommandResult(argv, rc, _text(out), _text(err))

    # -- files --------------------------------------------------------------------------------
    def _sftp_call(self, what: str, fn: Callable[[paramiko.SFTPClient], T]) -> T:
        with self._lock:
            for attempt in (1, 2):
                t: paramiko.Transport | None = None
                try:
                    t = self._live_transport()
                    if self._sftp is None or self._sftp.sock.closed:
                        assert self._client is not None
                        self._sftp = self._client.open_sftp()
                    return fn(self._sftp)
                except BoxUnreachable:
                    raise
                except _LINK_ERRORS as exc:
                    if isinstance(exc, OSError) and not self._link_dead(t):
                        raise  # a file error on a live connection (permissions, missing dir)
                    self._drop(t)
                    if attempt == 2:
                        raise BoxUnreachable(f"the connection to {self.name} broke during "
                                             f"{what}: {str(exc) or type(exc).__name__}") from exc
                    log.info("connection to %s broke during %s; retrying", self.name, what)
        raise AssertionError("unreachable")

    def _expand(self, remote: str) -> str:
        if remote == "~" or remote.startswith("~/"):
            return self.home() + remote[1:]
        return remote

    def put_file(self, local: Path, remote: str) -> None:
        """Copy one file to the box (via ``remote.part`` and a rename; parents created)."""
        local = Path(local)
        if not local.is_file():
            raise FileNotFoundError(f"cannot upload {local}: no such file")
        remote = self._expand(remote)
        parent = posixpath.dirname(remote)
        if parent:
            self.run(["mkdir", "-p", "--", parent], timeout=60)
        part = remote + ".part"

        def push(sftp: paramiko.SFTPClient) -> None:
            sftp.put(str(local), part, confirm=True)
            sftp.posix_rename(part, remote)

        self._sftp_call(f"upload of {remote}", push)

    def get_file(self, remote: str, local: Path) -> bool:
        """Copy one file from the box; False (and nothing written) when it does not exist."""
        remote = self._expand(remote)
        local = Path(local)
        part = local.with_name(local.name + ".part")

        def fetch(sftp: paramiko.SFTPClient) -> bool:
            try:
                sftp.stat(remote)
            except FileNotFoundError:
                return False
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                sftp.get(remote, str(part))
            except FileNotFoundError:  # removed between stat and get
                part.unlink(missing_ok=True)
                return False
            except BaseException:
                part.unlink(missing_ok=True)
                raise
            os.replace(part, local)
            return True

        return self._sftp_call(f"download of {remote}", fetch)

    def put_tree(self, local_dir: Path, remote_dir: str, exclude: Sequence[str] = ()) -> None:
        """Replace ``remote_dir`` with a copy of ``local_dir``, leaving out names matching
        any glob in ``exclude`` (one tar.gz upload and one untar call)."""
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise NotADirectoryError(f"cannot upload {local_dir}: not a directory")
        remote_dir = self._expand(remote_dir).rstrip("/") or "/"
        if posixpath.normpath(remote_dir) in ("/", ".", "..", posixpath.normpath(self.home())):
            raise ValueError(f"refusing to replace {remote_dir!r} on {self.name}: put_tree "
                             f"deletes the target first; give a dedicated folder")
        blob = _tar_gz(local_dir, exclude)
        archive = f"{remote_dir}.upload-{uuid.uuid4().hex[:8]}.tar.gz"
        parent = posixpath.dirname(remote_dir)
        if parent:
            self.run(["mkdir", "-p", "--", parent], timeout=60)
        self._sftp_call(f"upload of {archive}",
                        lambda sftp: sftp.putfo(io.BytesIO(blob), archive, confirm=True))
        # The script is constant; the paths travel as positional arguments.
        script = ('rm -rf -- "$1" && mkdir -p -- "$1" && tar --no-same-owner -xzf "$2" -C "$1"; '
                  'rc=$?; rm -f -- "$2"; exit $rc')
        self.run(["sh", "-c", script, "put_tree", remote_dir, archive], timeout=600)

    def home(self) -> str:
        """The remote user's home directory (cached)."""
        if self._home is None:
            self._home = self._sftp_call("home lookup", lambda sftp: sftp.normalize("."))
        return self._home


def _why_unreachable(exc: BaseException) -> str:
    """A connect error in words (paramiko's "[Errno None] Unable to connect" hides the cause)."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        causes = sorted({(e.strerror or str(e)).lower() for e in exc.errors.values()})
        return (f"{', '.join(causes) or 'no address answered'} (is the box up, is sshd "
                f"listening on that port, does a firewall drop it?)")
    return str(exc) or type(exc).__name__


def _key_files(target: SSHTarget, key_filename: str | os.PathLike[str] | None) -> tuple[str, ...]:
    if key_filename is not None:
        path = Path(os.path.expanduser(key_filename))
        if not path.is_file():
            raise SSHKeyError(f"--ssh-key {os.fspath(key_filename)}: no such file; give the path "
                              f"of a private key (e.g. ~/.ssh/id_ed25519)")
        return (str(path),)
    found = tuple(p for p in target.identity_files if Path(p).is_file())
    if target.identity_files and not found:
        raise SSHKeyError(f"IdentityFile {', '.join(target.identity_files)} (ssh config for "
                          f"{target.host!r}) does not exist; fix the config or pass --ssh-key PATH")
    return found


def _tar_gz(root: Path, exclude: Sequence[str]) -> bytes:
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.name != "." and any(fnmatchcase(posixpath.basename(info.name), pat)
                                    for pat in exclude):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        tar.add(root, arcname=".", filter=keep)
    return buf.getvalue()


def _text(b: bytes | bytearray) -> str:
    return bytes(b).decode(errors="replace")
