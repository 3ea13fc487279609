"""Nothing lost: bad input, bad boxes, bad merges.

The node table is the only copy of measurements that cost GPU-hours.  These tests break things
with real parts: real SQLite files, ``python -m harness merge`` processes killed with SIGKILL
or racing each other, whole collection runs in real tmux (this machine as the box, and a real
sshd on 127.0.0.1), a tmpfs that fills up.  Fakes only at our own seams: a job's report
handed to the harvest, and the write function of the box's rows writer.
docs/RELIABILITY.md lists every fault and the test that injects it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.box.runner import BoxWriteError, RowsWriter
from harness.boxctl import BoxDriver, BoxError
from harness.contract import Layout
from harness.ledger import Ledger
from harness.points import point_key
from harness.remote.tmux import Tmux, session_names
from harness.remote.transport import LocalTransport
from harness.store import NodeStore
from tests.runs import summary_jobs

ROOT = Path(__file__).resolve().parent.parent
GPU = "NVIDIA H200 141GB"
INTERP = "Triton CPU interpreter"
T0, T1 = "2026-12-02T11:22:33.000000Z", "2026-12-02T11:22:34.000000Z"
RECEIPT = re.compile(r"merged (\d+) node rows \((\d+) new, (\d+) replaced, (\d+) kept, (\d+) duplicate\)")

pytest_plugins = ["pytester", "tests.sshd"]


# ---------------------------------------------------------------- helpers


def row(i: int, **over: Any) -> dict[str, Any]:
    """A complete box row; ``i`` picks a distinct shape, so distinct ``i`` are distinct nodes."""
    m = 64 + i
    spec = "BLOCK_K=64,BLOCK_M=128,BLOCK_N=128,num_stages=3,num_warps=4"
    shape_id = f"matmul_M{m}_N4096_K4096_bf16"
    out = {
        "point_key": point_key(GPU, shape_id, spec), "gpu": GPU, "regime": "deployable",
        "kind": "matmul", "shape_id": shape_id, "shape": {"M": m, "N": 4096, "K": 4096, "dtype": "bf16"},
        "spec": spec, "slice": "tail", "status": "ok", "value_us": 10.0 + i % 97, "variance": 0.01,
        "n_samples": 20, "features": {"S_M": m, "S_N": 4096, "S_K": 4096, "BLOCK_M": 128},
        "cc": [9, 0], "run_id": "bench-a", "measured_at": T0,
    }
    out.update(over)
    return out


def write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    return path


def dump(db: Path) -> list[str]:
    """Everything in the DB file (schema and rows) as SQL text, read by a fresh connection."""
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def db_rows(db: Path) -> dict[str, tuple[str, str]]:
    """point_key → (measured_at, run_id) of every node row."""
    conn = sqlite3.connect(db)
    try:
        return {k: (m, r) for k, m, r in conn.execute("select point_key, measured_at, run_id from node")}
    finally:
        conn.close()


def merge_process(*args: str | Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("EMMY_TUNE_DB", None)
    return subprocess.Popen([sys.executable, "-m", "harness", "merge", *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def tmpfs(where: Path, size: str, extra: str = "") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where`` (needs root); skips with the reason otherwise."""
    where.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0700" + (f",{extra}" if extra else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"needs a tmpfs of its own (mount as root): {r.stderr.strip() or r.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def tmux_socket() -> Iterator[str]:
    name = f"emmy-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


def collect(tmp_path: Path, socket: str, *args: str, extra_env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """``pytest collect_tests`` in a subprocess (this machine is the box unless args say
    otherwise); its output is also kept in ``tmp_path/out.txt``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("EMMY_TUNE_DB", None)
    env["EMMY_STATE_DIR"] = str(tmp_path / "state")
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "-p", "no:cacheprovider",
           f"--db={tmp_path / 'db' / 'autotune.db'}", f"--box-dir={tmp_path / 'box'}",
           f"--tmux-socket={socket}", "--poll-s=0.5", "--filter=fp32", "--max-dist=1", *args]
    if not any(a.startswith("--gpu") for a in args):
        cmd.append("--gpu=local")
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    (tmp_path / "out.txt").write_text(r.stdout + r.stderr)
    return r


def job_line(out: str, slice_: str, kind: str) -> dict[str, Any]:
    """The summary's account of one job: its cell, benched, failed, state."""
    jobs = summary_jobs(out)
    assert (slice_, kind) in jobs, f"no summary cell for {slice_} {kind}:\n{out[-3000:]}"
    return jobs[(slice_, kind)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def leaks(roots: Iterable[Path], secrets_: Iterable[str]) -> list[str]:
    """``file: secret`` for every secret found in any regular file under ``roots``."""
    wanted = [s.encode() for s in secrets_]
    found = []
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "venv"]  # the test's own venv: symlinks to python
            for name in files:
                path = Path(folder, name)
                if path.is_symlink() or not path.is_file():
                    continue
                data = path.read_bytes()
                found += [f"{path}: {s.decode()[:12]}…" for s in wanted if s in data]
    return found


def assert_private_box(box: Path, run_id: str, job: str, made_here: bool = True) -> None:
    """The run's folders are 0700 and its rows file 0600; the box folder and its rows/summary
    folders too when the run made them (a folder it did not make keeps its mode); nothing in
    the box folder can be written by others."""
    made = (box, box / "rows", box / "summary") if made_here else ()
    for d in (*made, box / "rows" / run_id, box / "summary" / run_id):
        assert mode(d) == 0o700, f"{d} is {oct(mode(d))}"
    assert mode(box / "rows" / run_id / f"{job}.jsonl") == 0o600
    assert mode(box / "rows" / run_id / "ledger.json") & 0o022 == 0
    writable = [str(p) for p in box.rglob("*") if not p.is_symlink() and mode(p) & 0o022]
    assert writable == []


def assert_private_db(tmp_path: Path) -> None:
    db = tmp_path / "db" / "autotune.db"
    assert mode(db) == 0o600 and mode(db.parent) == 0o700
    backups = list((db.parent / "backups").glob("autotune-*.db"))
    assert backups and mode(db.parent / "backups") == 0o700
    assert all(mode(b) == 0o600 for b in backups)


# ---------------------------------------------------------------- the node DB


def test_a_merge_killed_halfway_leaves_the_db_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "autotune.db"
    with NodeStore(db) as s:
        s.merge([row(i) for i in range(300)])
    before = dump(db)
    # 50k newer rows: the first 300 replace what is there, the rest are new
    big = write_rows(tmp_path / "big.jsonl",
                     (row(i, measured_at=T1, run_id="bench-b", value_us=5.0) for i in range(50_000)))
    wal = db.with_name(db.name + "-wal")
    proc = merge_process(big, "--db", db)
    try:
        deadline = time.monotonic() + 120
        # under way: its transaction's pages spill into the WAL long before it can commit
        while not (wal.exists() and wal.stat().st_size > 2_000_000):
            assert proc.poll() is None, f"the merge ended before it was killed: {proc.communicate()}"
            assert time.monotonic() < deadline, "the merge never got going"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert "merged" not in out
    assert integrity(db) == "ok"
    assert dump(db) == before
    assert not (tmp_path / "backups").exists()
    with NodeStore(db) as s:  # and the DB takes the next merge
        assert s.merge([row(i, run_id="bench-c") for i in range(300, 310)]).inserted == 10
        assert s.counts() == {GPU: 310}
    assert integrity(db) == "ok"


def test_two_merges_at_once_from_two_processes_both_land(tmp_path: Path) -> None:
    db = tmp_path / "autotune.db"
    with NodeStore(db) as s:
        s.merge([row(i) for i in range(10_000, 10_010)])
    a = write_rows(tmp_path / "a.jsonl", (row(i) for i in range(0, 3000)))
    b = write_rows(tmp_path / "b.jsonl", (row(i) for i in range(2000, 5000)))  # 1000 in both
    # A third writer holds the DB while both start, so they surely meet at its lock.
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    procs = [merge_process(f, "--db", db) for f in (a, b)]
    try:
        time.sleep(3)
        assert [p.poll() for p in procs] == [None, None], "a merge gave up instead of waiting"
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    receipts = [RECEIPT.search(out) for out, _ in outs]
    assert all(receipts), outs
    assert sorted(int(r[1]) for r in receipts) == [3000, 3000]
    assert sum(int(r[2]) for r in receipts) == 5000  # new, between them
    assert sum(int(r[5]) for r in receipts) == 1000  # the shared rows land once
    assert integrity(db) == "ok"
    keys = set(db_rows(db))
    assert len(keys) == 5010
    assert keys == {r["point_key"] for r in (*read_jsonl(a), *read_jsonl(b))} | {
        row(i)["point_key"] for i in range(10_000, 10_010)}
    backups = sorted((tmp_path / "backups").glob("autotune-*.db"))
    assert len(backups) == 2 and all(mode(p) == 0o600 for p in backups)


def test_backups_rotate_through_repeated_merges(tmp_path: Path) -> None:
    db, made = tmp_path / "autotune.db", []
    for n in range(7):
        proc = merge_process(write_rows(tmp_path / f"{n}.jsonl", [row(n)]), "--db", db)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        made.append(Path(re.search(r"^backup: (.*)$", out, re.M)[1]))
    kept = sorted((tmp_path / "backups").glob("autotune-*.db"))
    assert kept == sorted(made[2:])  # the newest five
    assert all(mode(p) == 0o600 for p in kept) and mode(tmp_path / "backups") == 0o700
    # the last merge's backup holds what the DB holds (VACUUM INTO may order the schema
    # differently, so compare the content); by name, "…-2.db" sorts before "….db"
    assert sorted(dump(made[-1])) == sorted(dump(db))


# ---------------------------------------------------------------- the DB is checked first

UP = "--up-cmd=touch {tmp}/rented-{{gpu}}"  # a server "rented" leaves this marker


def _set_version(db: Path, value: str) -> None:
    NodeStore(db).close()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (value,))
    conn.close()


def _newer_schema(db: Path) -> None:
    _set_version(db, "7")


def _a_good_db(db: Path) -> None:
    with NodeStore(db) as s:
        s.merge([row(0)])


def _a_folder(db: Path) -> None:
    db.mkdir()


def _not_a_db(db: Path) -> None:
    db.write_text("notes, not a database\n" * 100)


def _unreadable_version(db: Path) -> None:
    _set_version(db, "two")


DB_FAULTS: dict[str, tuple[Callable[[Path], None] | None, str]] = {
    "newer-schema": (_newer_schema, r"--db: node DB .*autotune.db has schema version 7, but this "
                     r"collect-node-data supports schema version 1 at most; upgrade collect-node-data"),
    "a-folder": (_a_folder, r"--db: node DB path .*autotune.db is a directory; give a file path"),
    "not-a-db": (_not_a_db, r"--db: cannot open node DB .*autotune.db: file is not a database"),
    "unreadable-version": (_unreadable_version, r"--db: node DB .* has an unreadable schema_version "
                           r"'two' .*restore it from a backup"),
    "read-only": (None, r"--db: node DB .*autotune.db is not readable and writable by this user"),
    "ledger-is-the-db": (_a_good_db, r"--ledger=.*autotune.db is the node DB \(--db\): the ledger "
                         r"would overwrite it"),
}


@pytest.mark.parametrize("fault", list(DB_FAULTS))
def test_a_db_that_cannot_take_the_rows_is_refused_before_any_server_is_rented(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmux_socket: str,
        fault: str) -> None:
    import shutil

    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    shutil.copytree(ROOT / "collect_tests", pytester.path / "collect_tests")
    tmp = pytester.path
    monkeypatch.setenv("EMMY_STATE_DIR", str(tmp / "state"))
    make, message = DB_FAULTS[fault]
    with _read_only_db(tmp) if make is None else _plain_db(tmp, make) as db:
        before = db.read_bytes() if db.is_file() else None
        args = [f"--ledger={db}"] if fault == "ledger-is-the-db" else []
        result = pytester.runpytest(
            "collect_tests", "-p", "no:cacheprovider", "-k", "own and softmax", "--gpu=h100",
            "--provider=command", UP.format(tmp=tmp), "--down-cmd=true {handle}", f"--db={db}",
            f"--box-dir={tmp / 'box'}", f"--tmux-socket={tmux_socket}", "--budget-s=20", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-20:]
        result.stderr.re_match_lines([f".*{message}.*"])
        assert not list(tmp.glob("rented-*")), "a server was rented"
        assert not (tmp / "box").exists()
        assert not (tmp / "state").exists()  # no lease, no ledger, no rows folder
        assert (db.read_bytes() if db.is_file() else None) == before


@contextmanager
def _plain_db(tmp: Path, make: Callable[[Path], None]) -> Iterator[Path]:
    db = tmp / "dbs" / "autotune.db"
    db.parent.mkdir()
    make(db)
    yield db


@contextmanager
def _read_only_db(tmp: Path) -> Iterator[Path]:
    """A node DB the user cannot write: mode 0444, or (root writes through modes) a DB on a
    file system mounted read-only."""
    folder = tmp / "dbs"
    if os.geteuid() != 0:
        folder.mkdir()
        NodeStore(folder / "autotune.db").close()
        (folder / "autotune.db").chmod(0o444)
        yield folder / "autotune.db"
        return
    with tmpfs(folder, "1m"):
        with NodeStore(folder / "autotune.db") as s:
            s.merge([row(0)])
        r = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount a tmpfs read-only: {r.stderr.strip()}")
        yield folder / "autotune.db"


# ---------------------------------------------------------------- bad rows through the harvest

HARVEST_JOB = '''
from harness.harvest import job_property

def test_job(record_property):
    record_property(*job_property(gpu="h200", slice="tail", kind="matmul", card="{gpu}",
                                  state="done (pool exhausted)", benched=4, ok=4, rows_file={rows!r}))
'''


def _cut_mid_line(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """A crash mid-write: three whole rows and half of a fourth, no newline."""
    rows = [row(i) for i in range(3)]
    cut = json.dumps(row(3), sort_keys=True)
    path.write_bytes("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
                     + cut[: len(cut) // 2].encode())
    return rows, [r"rows.jsonl:4: cut off \(no newline at its end"]


def _corrupt_lines(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Damage inside the file: bytes that are no JSON, and a JSON line that is no row."""
    rows = [row(i) for i in range(3)]
    path.write_bytes(b"".join([
        json.dumps(rows[0]).encode() + b"\n",
        b"\xff\xfe{\"gpu\": \x00garbage\n",
        json.dumps(rows[1]).encode() + b"\n",
        json.dumps(row(9, status="fine")).encode() + b"\n",
        json.dumps(rows[2]).encode() + b"\n",
    ]))
    return rows, [r"rows.jsonl:2: not UTF-8 text", r"rows.jsonl:4: row .* has status 'fine'; "
                  r"valid statuses: "]


@pytest.mark.parametrize("damage", [_cut_mid_line, _corrupt_lines], ids=["cut-mid-line", "corrupt-lines"])
def test_damaged_rows_file_merges_its_whole_rows_sets_the_rest_aside_and_fails(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        damage: Callable[[Path], tuple[list[dict[str, Any]], list[str]]]) -> None:
    tmp = pytester.path
    monkeypatch.setenv("EMMY_STATE_DIR", str(tmp / "state"))
    rows_file = tmp / "rows.jsonl"
    whole, reasons = damage(rows_file)
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    pytester.makepyfile(test_job=HARVEST_JOB.format(gpu=GPU, rows=str(rows_file)))
    db = tmp / "db" / "autotune.db"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--db={db}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.outlines[-30:]
    n_bad = len(reasons)
    result.stdout.re_match_lines([
        r"=== collect-node-data summary ===",
        r"merged 3 node rows \(3 new, 0 replaced, 0 kept, 0 duplicate\)",
        rf"warning: rejected {n_bad} row\(s\) that cannot be merged; they are set aside with "
        rf"their reasons in .*rejected.* \(first: .*{reasons[0]}",
        rf"status: FAILED \({n_bad} row\(s\) rejected\)",
    ], consecutive=False)
    assert set(db_rows(db)) == {r["point_key"] for r in whole}
    assert integrity(db) == "ok"
    (kept,) = (tmp / "state" / "rows" / "rejected").glob("*.jsonl")
    got = [json.loads(line) for line in kept.read_text().splitlines()]
    assert len(got) == n_bad
    for entry, reason in zip(got, reasons, strict=True):
        assert re.search(reason, f"{entry['source']}:{entry['line']}: {entry['reason']}")
    assert rows_file.exists()  # the rows file itself is left as it was


def test_box_names_with_a_newline_cannot_forge_the_listing_of_leftover_rows(tmp_path: Path) -> None:
    """A run folder or rows file on the box whose name holds a newline (``…\\nRUN ..``) is not
    the tool's: the listing leaves it out, so no path outside the rows folder is fetched."""
    from harness.intake import list_box_runs

    rows = tmp_path / "rows"
    good = rows / "bench-good"
    good.mkdir(parents=True)
    (good / "owner.json").write_text(json.dumps({"db_id": "x"}))
    (good / "own-matmul.jsonl").write_text(json.dumps(row(0)) + "\n")
    (good / "evil\nFILE 10 forged.jsonl").write_text("x\n")
    forged = rows / "bench-x\nRUN .."
    forged.mkdir()
    (forged / "own-matmul.jsonl").write_text(json.dumps(row(1)) + "\n")
    runs = list_box_runs(LocalTransport(), str(rows))
    assert list(runs) == ["bench-good"]
    assert runs["bench-good"].files == {"own-matmul.jsonl": (good / "own-matmul.jsonl").stat().st_size}
    assert runs["bench-good"].owner == {"db_id": "x"}


def test_a_file_in_the_way_of_the_box_folders_own_folders_is_a_clear_error(tmp_path: Path) -> None:
    """``BOX/service`` (or ``BOX/rows``) is a file: the run says what is in the way, no
    traceback of a failed mkdir."""
    base = tmp_path / "box"
    base.mkdir()
    (base / "service").write_text("x\n")
    driver = BoxDriver(transport=LocalTransport(), tmux=Tmux(LocalTransport(), "unused"),
                       base=str(base))
    with pytest.raises(BoxError, match=rf"cannot make {base}/service, .* on local \(mkdir: .*\): "
                                       rf"something in the box folder {base} is in "
                                       r"the way; remove it or give another --box-dir"):
        driver._make_folders(driver.path("service"), driver.path("service", "bench-1"))
    assert (base / "service").read_text() == "x\n"


@pytest.mark.parametrize(("rows", "summary", "benched", "problem"), [
    (3, True, 3, None),
    (2, True, 3, r"the box counts 3 point\(s\) benched, but its rows file holds 2"),
    (0, True, 3, r"the box counts 3 point\(s\) benched, but no rows file came back"),
    (3, False, 3, r"the box says it ended, but it wrote no summary"),
], ids=["accounted", "rows-missing", "no-rows-file", "no-summary"])
def test_a_run_the_box_calls_done_is_trusted_only_with_its_rows_accounted(
        tmp_path: Path, rows: int, summary: bool, benched: int, problem: str | None) -> None:
    """A status that says ``done`` (written by a service, or by anything else) is checked
    against what the box holds: the job's summary and a rows file with every benched point."""
    from harness.contract import Entry

    t = LocalTransport()
    driver = BoxDriver(transport=t, tmux=Tmux(t, "unused"), base=str(tmp_path / "box"))
    driver.session = Layout(driver.base, "bench-1", "bench-1")
    entry = Entry("own", "matmul", state="done", benched=benched, ok=benched)
    if rows:
        Path(driver.session.rows(entry.id)).parent.mkdir(parents=True)
        Path(driver.session.rows(entry.id)).write_text(
            "".join(json.dumps(row(i)) + "\n" for i in range(rows)))
    if summary:
        Path(driver.session.summary(entry.id)).parent.mkdir(parents=True)
        Path(driver.session.summary(entry.id)).write_text(json.dumps({"benched": benched}))
    out = driver.fetch_entry(entry, tmp_path / "home")
    if problem is None:
        assert out.state == "done" and "stop" not in out.summary
    else:
        assert out.state == "failed"
        assert re.match(problem + r"; what it wrote stays on the box in .*own-matmul\.jsonl$",
                        out.summary["stop"]), out.summary


def test_the_by_hand_merge_skips_runs_of_another_node_table_unless_told(tmp_path: Path) -> None:
    """``python -m harness merge rows/*/*.jsonl``: a run whose owner.json names another node
    table is skipped and counted (exit 1); one naming this table, none (``--no-merge``) or
    with no record merges; ``--from-other-table`` merges them all."""
    db = tmp_path / "mine.db"
    with NodeStore(db) as s:
        mine = s.db_id
    owners = {"bench-other": {"db_id": "0" * 32, "db": "/data/other.db", "merge": True},
              "bench-mine": {"db_id": mine, "db": str(db), "merge": True},
              "bench-nomerge": {"db_id": None, "db": str(db), "merge": False},
              "bench-old": None}
    files, keys = [], {}
    for i, (run, owner) in enumerate(owners.items()):
        folder = tmp_path / "rows" / run
        folder.mkdir(parents=True)
        if owner is not None:
            (folder / "owner.json").write_text(json.dumps(owner))
        f = folder / "own-matmul.jsonl"
        f.write_text(json.dumps(row(i)) + "\n")
        files.append(f)
        keys[run] = row(i)["point_key"]
    r = subprocess.run([sys.executable, "-m", "harness", "merge", *map(str, files), "--db", str(db),
                        "--no-backup"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"skipped {files[0]}: its run belongs to another node table (/data/other.db; its "
            "owner.json says so)") in r.stderr
    assert "error: skipped 1 of 4 rows file(s) that belong to another node table" in r.stderr
    assert set(db_rows(db)) == {keys["bench-mine"], keys["bench-nomerge"], keys["bench-old"]}
    r = subprocess.run([sys.executable, "-m", "harness", "merge", str(files[0]), "--db", str(db),
                        "--no-backup", "--from-other-table"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(db_rows(db)) == set(keys.values())


# ---------------------------------------------------------------- signals at the session's end

SIGNAL_IN_BACKUP = '''
pytest_plugins = ["harness.plugin"]
import os, signal
from harness.store import NodeStore

_real = NodeStore.backup

def backup(self, *args, **kwargs):  # the user presses Ctrl-C {n} time(s) while it is made
    for _ in range({n}):
        os.kill(os.getpid(), signal.SIGINT)
    return _real(self, *args, **kwargs)

NodeStore.backup = backup
'''


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_during_the_backup_at_the_sessions_end_ends_the_run_interrupted(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, presses: int) -> None:
    """Once: the backup and the ledger finish, then the run ends interrupted (exit 2) with its
    summary.  Twice: it leaves at once, the rows merged, and says no backup was made."""
    tmp = pytester.path
    monkeypatch.setenv("EMMY_STATE_DIR", str(tmp / "state"))
    rows_file = tmp / "rows.jsonl"
    rows = [row(i) for i in range(3)]
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pytester.makeconftest(SIGNAL_IN_BACKUP.format(n=presses))
    pytester.makepyfile(test_job=HARVEST_JOB.format(gpu=GPU, rows=str(rows_file)))
    db = tmp / "db" / "autotune.db"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--db={db}")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "Traceback" not in out and "=== collect-node-data summary ===" in out
    assert set(db_rows(db)) == {r["point_key"] for r in rows} and integrity(db) == "ok"
    backups = list((db.parent / "backups").glob("*.db"))
    if presses == 1:
        result.stdout.re_match_lines([
            r"merged 3 node rows",
            r"backup: .*\.db",
            r"SIGINT during the merge and backup at the session's end: they finished first",
            r"status: INTERRUPTED \(SIGINT at the session's end, after the merge and backup; "
            r"3 rows merged\)"], consecutive=False)
        assert len(backups) == 1 and integrity(backups[0]) == "ok"
        assert (tmp / "state" / "ledger.json").is_file()  # rewritten after the backup
    else:
        result.stdout.re_match_lines([
            r"left at once \(SIGINT twice\) at the session's end: the rows are merged; no backup "
            r"was made this run \(the next run makes one\)",
            r"status: INTERRUPTED \(left at once; the next run merges what is left; 3 rows "
            r"merged\)"], consecutive=False)
        assert backups == []  # none begun, none half-made


def test_a_merge_helper_outlives_the_terminals_ctrl_c_and_hang_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The terminal signals its whole process group, the merge's helpers too; they leave the
    signal to the merge (which finishes first) and go on with their work."""
    from harness.store import _parse_pool

    monkeypatch.setenv("EMMY_MERGE_WORKERS", "1")
    pool = _parse_pool()
    try:
        pid = pool.submit(os.getpid).result(timeout=60)
        for sig in (signal.SIGINT, signal.SIGHUP):
            os.kill(pid, sig)
        time.sleep(0.5)
        assert pool.submit(os.getpid).result(timeout=60) == pid
    finally:
        pool.shutdown()


# ---------------------------------------------------------------- the box


def test_a_failed_row_write_is_cut_back_to_the_last_whole_row(tmp_path: Path) -> None:
    path = tmp_path / "tail-matmul.jsonl"
    lines = [json.dumps(row(i), sort_keys=True) for i in range(3)]
    room = [len(lines[0]) + len(lines[1]) + 2 + 100]  # the disk is full 100 bytes into row 3

    def write(fd: int, data: bytes) -> int:  # os.write on a disk that fills up
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, data[: room[0]])
        room[0] -= n
        return n

    w = RowsWriter(path, write=write)
    w.write(row(0))
    w.write(row(1))
    with pytest.raises(BoxWriteError, match=rf"cannot write the rows file {re.escape(str(path))}: "
                       r"No space left on device; the job stopped with the 2 rows written before "
                       r"it kept whole in the file"):
        w.write(row(2))
    w.close()
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"
    assert mode(path) == 0o600


FAKE_SERVICE = """
import json, os, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a service slow to end: only a TERM or KILL ends it
claim = sys.argv[-1].rsplit("/", 1)[0] + "/claim.json"
with open(claim, "w") as fh:
    json.dump({"pid": os.getpid(), "pgid": os.getpgid(0)}, fh)
time.sleep(120)
"""


def _fake_service(tmux: Tmux, name: str, box: Path, session: Layout) -> None:
    """A process that claims ``session`` the way the box service does, with the service's words
    on its command line (``serve --session PATH``), in tmux session ``name``."""
    Path(session.service_dir).mkdir(parents=True)
    tmux.start(name, [sys.executable, "-c", FAKE_SERVICE, "serve", "--session",
                      session.service("session.json")],
               cwd=str(box.parent), log=str(box.parent / f"{name}.log"),
               status=str(box.parent / f"{name}.status"))
    deadline = time.monotonic() + 30
    while not Path(session.service("claim.json")).is_file():
        assert time.monotonic() < deadline, Path(box.parent / f"{name}.log").read_text()
        time.sleep(0.05)


def _runs(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_two_box_folders_on_one_tmux_server_never_end_each_others_sessions(
        tmp_path: Path, tmux_socket: str) -> None:
    """The other run's box folder ends with this one's path, so its service's command line
    holds this session's request path too; ending this run's session leaves it alone."""
    t = LocalTransport()
    tmux = Tmux(t, tmux_socket)
    mine = tmp_path / "box"
    other = tmp_path / "other" / str(mine).lstrip("/")
    drivers = [BoxDriver(transport=t, tmux=tmux, base=str(b), sleep=lambda s: time.sleep(0.1))
               for b in (mine, other)]
    assert drivers[0].sweep_session != drivers[1].sweep_session
    assert drivers[0].setup_session != drivers[1].setup_session
    for d in drivers:
        d.session = Layout(d.base, "bench-1", "bench-1")
        _fake_service(tmux, d.sweep_session, Path(d.base), d.session)
    victim = json.loads(Path(drivers[1].session.service("claim.json")).read_text())["pid"]
    target = json.loads(Path(drivers[0].session.service("claim.json")).read_text())["pid"]
    drivers[0].stop()
    assert not tmux.alive(drivers[0].sweep_session)
    assert not _runs(target)
    # the other run's session and service are untouched
    assert tmux.alive(drivers[1].sweep_session) and _runs(victim)
    drivers[1].stop()
    assert not tmux.alive(drivers[1].sweep_session)


def test_stop_leaves_a_process_that_took_over_a_dead_services_pid_alone(
        tmp_path: Path, tmux_socket: str) -> None:
    """The claim's pid now belongs to something else (the service died, the pid was reused):
    stop ends the tmux session and signals nothing by that pid."""
    t = LocalTransport()
    tmux = Tmux(t, tmux_socket)
    driver = BoxDriver(transport=t, tmux=tmux, base=str(tmp_path / "box"),
                       sleep=lambda s: time.sleep(0.1))
    driver.session = Layout(driver.base, "bench-1", "bench-1")
    Path(driver.session.service_dir).mkdir(parents=True)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        Path(driver.session.service("claim.json")).write_text(
            json.dumps({"pid": bystander.pid, "pgid": os.getpgid(bystander.pid)}))
        driver.stop()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_sweep_already_running_on_the_box_is_refused_and_left_alone(tmp_path: Path,
                                                                       tmux_socket: str) -> None:
    t = LocalTransport()
    tmux = Tmux(t, tmux_socket)
    name = session_names(str(tmp_path / "box"))[1]  # a session of this folder's name
    tmux.start(name, ["sleep", "60"], cwd=str(tmp_path), log=str(tmp_path / "other.log"),
               status=str(tmp_path / "other.status"))
    driver = BoxDriver(transport=t, tmux=tmux, base=str(tmp_path / "box"))
    with pytest.raises(BoxError, match=(
            rf"a sweep is already running on local \(tmux session '{name}'\) that no run "
            rf"of this box folder started; watch it with "
            rf"`tmux -L {tmux_socket} attach -t {name}` or end it with "
            rf"`tmux -L {tmux_socket} kill-session -t {name}`, then run again")):
        driver.settle_orphan(print)  # what a collection does once it holds the box's lock
    assert tmux.alive(name)  # the other sweep goes on
    assert not (tmp_path / "box").exists()


@pytest.mark.slow
def test_a_full_disk_fails_the_job_keeps_its_rows_and_marks_only_them(tmp_path: Path,
                                                                      tmux_socket: str) -> None:
    box = tmp_path / "box"
    (box / "rows").mkdir(parents=True)
    (box / ".collect-node-data").touch()  # the box folder of an earlier run
    # a stale "success" of an earlier job: this job's real outcome must win
    (box / "sweep.status").write_text("0\n")
    with tmpfs(box / "rows", "64k"):
        # two 4 KiB pages left: a few interpreter rows (~1.3 KB each) fit, then no space
        # (the run's folder takes two pages for its owner record and ledger)
        (box / "rows" / "filler").write_bytes(b"\0" * 12 * 4096)
        r = collect(tmp_path, tmux_socket, "--budget-s=120", "--batch=2", "--tail-cap=20",
                    "-k", "tail and rms_norm")
        (on_box,) = (box / "rows").glob("bench-*/tail-rms_norm.jsonl")
        box_text = on_box.read_text()
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    assert re.search(rf"cannot write the rows file {re.escape(str(on_box))}: No space left on device",
                     out), out[-4000:]
    assert job_line(out, "tail", "rms_norm")["state"].startswith("failed"), out[-3000:]
    # the service said the job failed (and ended normally with the session)
    (status,) = (box / "service").glob("bench-*/status.json")
    (entry,) = json.loads(status.read_text())["entries"]
    assert entry["state"] == "failed" and "No space left on device" in entry["reason"]
    # what was written is whole, came home and was merged
    assert box_text.endswith("\n")
    rows = [json.loads(line) for line in box_text.splitlines()]
    assert 2 <= len(rows) < 10
    (home,) = (tmp_path / "state" / "rows").glob(f"{on_box.parent.name}/tail-rms_norm.jsonl")
    assert home.read_text() == box_text
    assert RECEIPT.search(out)[1] == str(len(rows))
    db = tmp_path / "db" / "autotune.db"
    assert {k: v[0] for k, v in db_rows(db).items()} == {x["point_key"]: x["measured_at"] for x in rows}
    # the ledger marks exactly the points whose rows were written
    ledger = Ledger.load(tmp_path / "state" / "ledger.json")
    assert {k for k in ledger if not ledger.needs_run(k, "interpret")} == {x["point_key"] for x in rows}


@pytest.mark.slow
def test_a_full_rows_dir_fails_the_job_and_the_next_run_merges_its_rows(tmp_path: Path,
                                                                       tmux_socket: str) -> None:
    """--rows-dir on a full disk: the rows stay on the box, nothing half-copied is left at home,
    the ledger does not call them done, and the next run brings them home and merges them."""
    full = tmp_path / "rows-full"
    with tmpfs(full, "12k"):
        # two of its three pages are taken: the run's owner record fits, no rows file does, however
        # few rows a loaded machine measures in the budget
        (full / "filler").write_bytes(b"\0" * 2 * 4096)
        r = collect(tmp_path, tmux_socket, "--budget-s=60", f"--rows-dir={full}", "-k", "own and matmul")
        left = sorted(p.name for p in full.rglob("*"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    assert "its rows could not be brought home to" in out and "No space left on device" in out
    assert "the next run with this node table merges them first" in out
    assert "Traceback" not in out
    assert not [n for n in left if n.endswith(".part")], left
    assert not [n for n in left if n.endswith(".jsonl")], left
    # the job's rows file, and a top-up's where a loaded machine gave the job one
    files = sorted((tmp_path / "box" / "rows").glob("bench-*/*.jsonl"))
    assert [f.name for f in files if f.name == "own-matmul.jsonl"], files
    wrote = [x for f in files for x in read_jsonl(f)]
    assert wrote
    db = tmp_path / "db" / "autotune.db"
    assert db_rows(db) == {}
    ledger = Ledger.load(tmp_path / "state" / "ledger.json")
    assert all(ledger.needs_run(x["point_key"], "interpret") for x in wrote)

    r = collect(tmp_path, tmux_socket, "--budget-s=60", f"--rows-dir={tmp_path / 'rows'}",
                "-k", "own and matmul")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"merged {len(wrote)} rows that earlier runs left unmerged" in out, out[-3000:]
    assert {k: v[0] for k, v in db_rows(db).items()} == {x["point_key"]: x["measured_at"] for x in wrote}
    assert "in the node table already" in job_line(out, "own", "matmul")["state"]


@pytest.mark.slow
def test_stale_status_and_rows_of_an_earlier_run_are_never_used(tmp_path: Path,
                                                                tmux_socket: str) -> None:
    box, stale = tmp_path / "box", "bench-20200101T000000Z-5ca1e000"
    stale_row = {**row(0), "gpu": INTERP, "regime": "interpret", "kind": "softmax",
                 "point_key": "stale|softmax", "run_id": stale}
    planted = []
    for where in (box / "rows" / stale, tmp_path / "state" / "rows" / stale):
        where.mkdir(parents=True)
        planted.append(write_rows(where / "tail-softmax.jsonl", [stale_row]))
        # a run of another node table: never merged into this one
        planted.append(where / "owner.json")
        planted[-1].write_text(json.dumps({"run_id": stale, "db_id": "another-node-table",
                                           "merge": True}))
    (box / "summary" / stale).mkdir(parents=True)
    planted.append(box / "summary" / stale / "tail-softmax.json")
    planted[-1].write_text(json.dumps({"benched": 99, "ok": 99, "failed": 0, "run_id": stale}))
    (box / "sweep.status").write_text("0\n")  # the job's end is known only from its own status
    (box / ".collect-node-data").touch()  # the box folder of an earlier run
    box.chmod(0o755)
    planted_text = [p.read_text() for p in planted]
    token = secrets.token_hex(16)

    r = collect(tmp_path, tmux_socket, "--budget-s=30", "--tail-cap=3", "-k", "tail and softmax",
                extra_env={"HF_TOKEN": token, "EMMY_TEST_TOKEN": token})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    run_id = re.search(r"; run (bench-\S+)", (box / "sweep.log").read_text())[1]
    assert run_id != stale
    rows = read_jsonl(box / "rows" / run_id / "tail-softmax.jsonl")
    # the job's real outcome: it ran to its end, and only its own rows were counted and merged
    job = job_line(out, "tail", "softmax")
    # the tail of the fp32 shape cut to --tail-cap=3
    assert job["state"] == "done" and job["benched"] == len(rows) == 3, out[-3000:]
    assert job["cell"].startswith("3 in ") and "left" not in job["cell"]  # its pool's end
    assert "sweep done: tail-softmax" in (box / "sweep.log").read_text()
    merged = db_rows(tmp_path / "db" / "autotune.db")
    assert merged == {x["point_key"]: (x["measured_at"], run_id) for x in rows}
    assert [p.read_text() for p in planted] == planted_text  # left as they were
    # private through the run, and no token anywhere; the folders the test made keep their mode
    assert_private_db(tmp_path)
    assert mode(box) == 0o755
    assert_private_box(box, run_id, "tail-softmax", made_here=False)
    assert leaks([tmp_path], [token]) == []


# ---------------------------------------------------------------- security over SSH


@pytest.mark.slow
def test_an_ssh_run_leaks_no_key_or_token_and_keeps_the_box_private(sshd, tmp_path: Path,
                                                                   tmux_socket: str) -> None:
    box = tmp_path / "box"
    hf, emmy = secrets.token_hex(16), f"emmy-{secrets.token_urlsafe(24)}"
    r = collect(tmp_path, tmux_socket, "--gpu=auto", f"--remote={sshd.remote}",
                f"--ssh-key={sshd.client_key}", f"--known-hosts={sshd.known_hosts}",
                f"--box-python={sys.executable}", "--budget-s=30", "--tail-cap=3",
                "-k", "tail and softmax", f"--junitxml={tmp_path / 'junit.xml'}",
                extra_env={"HF_TOKEN": hf, "EMMY_TEST_TOKEN": emmy})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert db_rows(tmp_path / "db" / "autotune.db")
    key_body = [ln for ln in sshd.client_key.read_text().splitlines()
                if ln.strip() and not ln.startswith("-----")]
    assert key_body
    # every output, log, rows file, ledger, summary, DB, backup and the JUnit report
    assert (tmp_path / "junit.xml").is_file() and (tmp_path / "out.txt").is_file()
    assert leaks([tmp_path], [*key_body, "".join(key_body), hf, emmy]) == []
    run_id = re.search(r"; run (bench-\S+)", (box / "sweep.log").read_text())[1]
    assert_private_box(box, run_id, "tail-softmax")
    assert_private_db(tmp_path)
