"""SSHTransport against a real OpenSSH server on 127.0.0.1 (see tests/sshd.py)."""

from __future__ import annotations

import getpass
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.remote.ssh import (
    HostKeyError,
    SSHAuthError,
    SSHKeyError,
    SSHTarget,
    SSHTransport,
    parse_remote,
    remote_command_line,
)
from harness.remote.tmux import Tmux
from harness.remote.transport import BoxUnreachable, RemoteCommandError

pytest_plugins = ["tests.sshd"]

HOSTILE = [
    "two words",
    "it's",
    'say "hi"',
    "a; touch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "line one\nline two",
    "$HOME ${PATH} $1 $@",
    "*",
    "~",
    "back\\slash",
    "-n",
    "",
    "| & > < ( ) { } ! #",
    "tab\there",
    "ünïcødé ☃",
]


@pytest.fixture(scope="module")
def box(sshd):
    t = sshd.transport()
    yield t
    t.close()


# -- commands --------------------------------------------------------------------------------

def test_run_returns_stdout_stderr_and_rc(box):
    r = box.run(["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (r.rc, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert r.argv == ("sh", "-c", "echo out; echo err >&2; exit 3")
    assert box.run(["echo", "fine"]).stdout == "fine\n"


def test_check_failure_shows_command_exit_code_and_output(box):
    with pytest.raises(RemoteCommandError, match=r"(?s)exit 7\).*sh -c echo oops.*oops") as info:
        box.run(["sh", "-c", "echo oops >&2; exit 7"])
    assert info.value.result.rc == 7
    assert box.name in str(info.value)


def test_timeout_gives_124_and_the_connection_stays_usable(box):
    t0 = time.monotonic()
    r = box.run(["sleep", "10"], timeout=0.5, check=False)
    assert r.rc == 124 and "timed out" in r.stderr
    assert time.monotonic() - t0 < 5
    assert box.run(["echo", "still here"]).stdout == "still here\n"


def test_stdin_is_closed(box):
    r = box.run(["cat"], timeout=10)
    assert (r.rc, r.stdout) == (0, "")


def test_hostile_file_name_is_created_literally(box, tmp_path):
    tag = f"pwned-{uuid.uuid4().hex[:6]}"
    names = [f"x; touch {tag}", f"$(touch {tag}-sub)", f"`touch {tag}-bt`", f"a\nb && touch {tag}"]
    box.run(["env", "-C", str(tmp_path), "touch", *names])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert not list(home.glob(f"{tag}*"))


_ECHO_ENV = "import os, sys; sys.stdout.write(''.join(os.environ[k] + chr(0) for k in sys.argv[1:]))"


def test_hostile_values_reach_the_remote_process_verbatim(box):
    r = box.run(["printf", r"%s\0", *HOSTILE])
    assert r.stdout.split("\0")[:-1] == HOSTILE
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    r = box.run([sys.executable, "-c", _ECHO_ENV, *env], env=env)
    assert r.stdout.split("\0")[:-1] == HOSTILE


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                        max_size=20), min_size=1, max_size=4))
def test_any_text_round_trips_through_argv_and_env(box, values):
    r = box.run(["sh", "-c", 'printf "%s\\0" "$V" "$@"', "sh", *values], env={"V": values[0]})
    assert r.stdout.split("\0")[:-1] == [values[0], *values]


def test_remote_command_line_quotes_every_word():
    assert remote_command_line(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    assert remote_command_line(["run"], {"K": "v w;"}) == "env 'K=v w;' run"
    with pytest.raises(ValueError, match=r"names must match.*'A B'"):
        remote_command_line(["true"], {"A B": "1"})
    with pytest.raises(ValueError, match="empty argv"):
        remote_command_line([])
    with pytest.raises(ValueError, match="NUL"):
        remote_command_line(["echo", "a\0b"])


# -- files -----------------------------------------------------------------------------------

def test_put_file_get_file_round_trip(box, tmp_path):
    data = os.urandom(200_000) + b"end"
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    remote = str(tmp_path / "remote dir 'q'" / "nested" / "f.bin")
    box.put_file(src, remote)
    assert Path(remote).read_bytes() == data
    assert not Path(remote + ".part").exists()
    back = tmp_path / "back" / "f.bin"
    assert box.get_file(remote, back) is True
    assert back.read_bytes() == data
    assert sorted(p.name for p in back.parent.iterdir()) == ["f.bin"]


def test_get_file_of_a_missing_file_is_false(box, tmp_path):
    local = tmp_path / "dl" / "nothing.json"
    assert box.get_file(str(tmp_path / "no-such-file.json"), local) is False
    assert not local.exists() and not local.with_name("nothing.json.part").exists()


def test_put_tree_replaces_the_folder_and_leaves_out_excluded_names(box, tmp_path):
    src = tmp_path / "src"
    for i in range(100):
        f = src / f"pkg{i % 5}" / f"mod{i}.py"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"x = {i}\n")
    (src / "pkg0" / "__pycache__").mkdir()
    (src / "pkg0" / "__pycache__" / "mod0.cpython-311.pyc").write_bytes(b"\0")
    (src / "pkg1" / "stray.pyc").write_bytes(b"\0")
    (src / "top file; $(x).txt").write_text("hostile name\n")
    dest = tmp_path / "dest dir"
    (dest / "stale").mkdir(parents=True)
    (dest / "stale" / "old.py").write_text("old\n")

    box.put_tree(src, str(dest), exclude=("__pycache__", "*.pyc"))

    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    want = sorted(str(p.relative_to(src)) for p in src.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    assert got == want and len(got) == 101
    assert (dest / "pkg3" / "mod8.py").read_text() == "x = 8\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest dir", "src"]  # no archive left


def test_put_tree_refuses_root_and_home(box, tmp_path):
    with pytest.raises(ValueError, match="refusing to replace '/'"):
        box.put_tree(tmp_path, "/")
    with pytest.raises(ValueError, match="refusing to replace"):
        box.put_tree(tmp_path, "~")


def test_home_is_the_remote_users_home(box):
    assert box.home() == pwd.getpwuid(os.getuid()).pw_dir


# -- targets, config, keys -------------------------------------------------------------------

def test_ssh_config_alias_gives_hostname_user_port_and_identity_file(sshd):
    target = parse_remote("testbox", ssh_config_path=sshd.ssh_config)
    assert target == SSHTarget("testbox", "127.0.0.1", sshd.port, sshd.user, (str(sshd.client_key),))
    with SSHTransport(target, known_hosts=sshd.known_hosts) as t:
        assert t.name == f"{sshd.user}@127.0.0.1:{sshd.port}"
        assert t.run(["id", "-un"]).stdout.strip() == sshd.user


def test_unknown_host_key_is_refused_then_accepted_and_saved(sshd, tmp_path):
    known = tmp_path / "ssh" / "known_hosts"
    fp = re.escape(sshd.host_key_fingerprint)
    with pytest.raises(HostKeyError, match=rf"\[127\.0\.0\.1\]:{sshd.port} is not in .*known_hosts.*"
                                           rf"ssh-ed25519 key with fingerprint {fp}.*"
                                           r"--accept-new-host-key.*ssh-keyscan"):
        sshd.transport(known_hosts=known).run(["true"])
    assert not known.exists()

    with sshd.transport(known_hosts=known, accept_new_host_key=True) as t:
        t.run(["true"])
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_key_pub}\n"
    assert known.stat().st_mode & 0o777 == 0o600
    with sshd.transport(known_hosts=known) as t:
        assert t.run(["echo", "known now"]).stdout == "known now\n"


def test_changed_host_key_is_refused_even_with_accept_new(sshd_private, tmp_path):
    known = tmp_path / "known_hosts"
    shutil.copy(sshd_private.known_hosts, known)
    before = known.read_text()
    sshd_private.regenerate_host_key()
    sshd_private.restart()
    new_fp = re.escape(sshd_private.host_key_fingerprint)
    with pytest.raises(HostKeyError, match=rf"CHANGED.*sent ssh-ed25519 {new_fp}.*even with "
                                           r"--accept-new-host-key.*ssh-keygen -R") as info:
        sshd_private.transport(known_hosts=known, accept_new_host_key=True).run(["true"])
    assert info.value.fingerprint == sshd_private.host_key_fingerprint
    assert known.read_text() == before


def test_known_hosts_lines_paramiko_cannot_read_are_skipped(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("# comment\n"
                     "@cert-authority *.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0\n"
                     "damaged.example.com ssh-ed25519 not!base64\n"
                     + sshd.known_hosts.read_text())
    with pytest.warns(UserWarning, match=r"known_hosts:3: skipping"):
        with sshd.transport(known_hosts=known) as t:
            assert t.run(["echo", "ok"]).stdout == "ok\n"


def test_revoked_host_key_is_refused_even_with_accept_new(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * {sshd.host_key_pub}\n")
    with pytest.raises(HostKeyError, match="marks @revoked; refused"):
        sshd.transport(known_hosts=known, accept_new_host_key=True).run(["true"])
    assert known.read_text() == f"@revoked * {sshd.host_key_pub}\n"


def test_missing_key_file_names_the_option_and_path(sshd, tmp_path):
    missing = tmp_path / "no_such_key"
    with pytest.raises(SSHKeyError, match=rf"--ssh-key {re.escape(str(missing))}: no such file"):
        sshd.transport(key_filename=missing)


def test_unauthorized_key_is_refused_and_no_key_material_leaks(sshd, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True, capture_output=True)
    t = sshd.transport(key_filename=other)
    with pytest.raises(SSHAuthError, match=rf"refused to log in '{sshd.user}' with the key .*other_key.*--ssh-key") as info:
        t.run(["true"])
    secret_lines = [ln for ln in other.read_text().splitlines() if not ln.startswith("-----")]
    shown = f"{info.value!r} {info.value} {t!r}"
    assert secret_lines and not any(line in shown for line in secret_lines)


def test_closed_port_is_box_unreachable(sshd_private):
    t = sshd_private.transport()
    sshd_private.stop()
    with pytest.raises(BoxUnreachable, match=rf"cannot reach {re.escape(t.name)}"):
        t.run(["true"])


@pytest.mark.parametrize(("value", "want"), [
    ("alice@gpu1", ("gpu1", 22, "alice")),
    ("alice@gpu1:2222", ("gpu1", 2222, "alice")),
    ("gpu1", ("gpu1", 22, getpass.getuser())),
    ("gpu-1.example.org:2200", ("gpu-1.example.org", 2200, getpass.getuser())),
    ("10.0.0.5:22", ("10.0.0.5", 22, getpass.getuser())),
    ("[::1]:2222", ("::1", 2222, getpass.getuser())),
    ("bob@[fe80::1]:22", ("fe80::1", 22, "bob")),
    ("[::1]", ("::1", 22, getpass.getuser())),
    ("fe80::1", ("fe80::1", 22, getpass.getuser())),
    ("box", ("127.0.0.1", 2201, "carol")),
    ("dave@box:2300", ("127.0.0.1", 2300, "dave")),
])
def test_parse_remote(value, want, tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("Host box\n  HostName 127.0.0.1\n  Port 2201\n  User carol\n  IdentityFile ~/k\n")
    t = parse_remote(value, ssh_config_path=cfg)
    assert (t.hostname, t.port, t.user) == want
    assert t.identity_files == ((os.path.expanduser("~/k"),) if "box" in value else ())
    host = f"[{want[0]}]" if ":" in want[0] else want[0]
    assert t.name == f"{want[2]}@{host}:{want[1]}"


@pytest.mark.parametrize("value", [
    "", " ", "gpu 1", "user@", "@host", "a@b@c", "host:", "host:ssh", "host:0", "host:65536",
    "host:22:33", "[::1", "[::1]x", "[nothost]:22", "-oProxyCommand=x", "user@host;rm", "host/x",
])
def test_parse_remote_rejects_malformed_values(value, tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("")
    with pytest.raises(ValueError, match=rf"--remote {re.escape(repr(value))}: .*expected "
                                         r"user@host\[:port\], host\[:port\], \[ipv6-address\]:port"):
        parse_remote(value, ssh_config_path=cfg)


# -- dropped connections ---------------------------------------------------------------------

def _client_port(t: SSHTransport) -> str:
    return t.run(["sh", "-c", "echo $SSH_CLIENT"]).stdout.split()[1]


def test_reconnects_after_the_server_restarts_between_calls(sshd_private, tmp_path):
    t = sshd_private.transport()
    first = _client_port(t)
    f = tmp_path / "f.txt"
    f.write_text("one\n")
    assert t.get_file(str(f), tmp_path / "g.txt")  # opens the SFTP channel too
    sshd_private.restart()
    try:
        second = _client_port(t)
    except BoxUnreachable:  # allowed once: the next call reconnects
        second = _client_port(t)
    assert second != first
    sshd_private.restart()
    assert t.get_file(str(f), tmp_path / "h.txt") and (tmp_path / "h.txt").read_text() == "one\n"
    t.close()


def test_command_in_flight_when_the_connection_drops_is_box_unreachable(sshd_private):
    t = sshd_private.transport()
    t.run(["true"])
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["result"] = t.run(["sleep", "3"], timeout=30)
        except Exception as exc:  # handed to the main thread's asserts
            outcome["error"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.5)
    sshd_private.restart()
    worker.join(10)
    assert isinstance(outcome.get("error"), BoxUnreachable), outcome
    assert "may or may not have run" in str(outcome["error"])
    assert t.run(["echo", "back"]).stdout == "back\n"
    t.close()


# -- tmux over SSH ---------------------------------------------------------------------------

@pytest.fixture
def tmux_socket(sshd):
    if shutil.which("tmux") is None:
        pytest.skip("tmux not found: install tmux to run the tmux-over-SSH tests")
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    with sshd.transport() as t:
        t.run(["tmux", "-L", name, "kill-server"], check=False)


def _wait_for_status(tmux: Tmux, name: str, log: Path, status: Path, timeout: float = 20):
    deadline = time.monotonic() + timeout
    seen_alive = False
    while time.monotonic() < deadline:
        state = tmux.poll(name, log=str(log), status=str(status))
        seen_alive = seen_alive or bool(state.alive)
        if state.status is not None:
            return state, seen_alive
        time.sleep(0.1)
    raise AssertionError(f"tmux job {name} did not finish in {timeout} s")


def test_tmux_job_over_ssh(sshd, tmux_socket, tmp_path):
    with sshd.transport() as t:
        tmux = Tmux(t, socket=tmux_socket)
        log, status = tmp_path / "job.log", tmp_path / "job.status"
        tmux.start("job", ["sh", "-c", "echo working; sleep 0.5; echo finished; exit 3"],
                   cwd=str(tmp_path), log=str(log), status=str(status), env={"X": "a b"})
        state, seen_alive = _wait_for_status(tmux, "job", log, status)
        assert seen_alive
        assert (state.status, state.last_line) == ("3", "finished")
        assert not tmux.alive("job")


def test_tmux_job_survives_a_dropped_connection(sshd_private, tmux_socket, tmp_path):
    t = sshd_private.transport()
    tmux = Tmux(t, socket=tmux_socket)
    log, status = tmp_path / "job.log", tmp_path / "job.status"
    tmux.start("job", ["sh", "-c", "sleep 1; echo survived"], cwd=str(tmp_path),
               log=str(log), status=str(status))
    sshd_private.restart()
    state, _ = _wait_for_status(tmux, "job", log, status)
    assert (state.status, state.last_line) == ("0", "survived")
    t.run(["tmux", "-L", tmux_socket, "kill-server"], check=False)
    t.close()
