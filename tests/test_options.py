"""Every bad option value is a usage error naming the option, the value and what is valid, and
nothing is rented, created or written before it (pytester runs of ``collect_tests``).

Each case runs a real collection command line (not ``--collect-only``): had the value been
let through, the run would have gone on to make the box folder, the state folder and the DB,
and a ``--provider`` run would have called its up command, which here leaves a marker file.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
NAN = r"--{0}=nan: must be a positive number of seconds"
UP = "--up-cmd=touch {tmp}/rented-{{gpu}}"  # a server "rented" leaves this marker
DOWN = "--down-cmd=true {{handle}}"

# (id, arguments (after the defaults below; {tmp} is the test's folder), stderr regex)
CASES: list[tuple[str, list[str], str]] = [
    ("baselines-unknown", ["--baselines=torch,inductor"],
     r"--baselines=torch,inductor: inductor is not a baseline; give torch, compile"),
    ("baselines-empty", ["--baselines=,"], r"--baselines=,: empty is not a baseline"),
    ("gpu-unknown", ["--gpu=l4os"], r"--gpu: unknown card 'l4os'; did you mean 'l40s'\? valid aliases: l40s, .*h200"),
    ("gpu-empty", ["--gpu=,"], r"--gpu=',' names no card; valid: l40s, .*auto, local"),
    ("gpu-local-and-card", ["--gpu=local,h100"], r"--gpu='local,h100': 'local' cannot be combined"),
    ("gpu-twice", ["--gpu=h100,h100"], r"--gpu=h100,h100 names h100 more than once; name each card once"),
    ("budget-zero", ["--budget-s=0"], r"--budget-s=0: the budget must be a positive number of seconds"),
    ("budget-negative", ["--budget-s=-5"], r"--budget-s=-5: the budget must be a positive number"),
    ("budget-nan", ["--budget-s=nan"], r"--budget-s=nan: the budget must be a positive number"),
    ("budget-inf", ["--budget-s=inf"], r"--budget-s=inf: the budget must be a positive number"),
    ("budget-not-a-number", ["--budget-s=1h"], r"argument --budget-s: invalid float value: '1h'"),
    ("share-negative", ["--share-own=-1"], r"--share-own must be a finite number >= 0, got -1.0"),
    ("share-nan", ["--share-cross=nan"], r"--share-cross must be a finite number >= 0, got nan"),
    ("shares-all-zero", ["--share-own=0", "--share-cross=0", "--share-tail=0"],
     r"at least one share must be positive \(--share-own, --share-cross, --share-tail are all zero\)"),
    ("batch-zero", ["--batch=0"], r"--batch=0: must be at least 1"),
    ("batch-negative", ["--batch=-3"], r"--batch=-3: must be at least 1"),
    ("batch-not-an-int", ["--batch=2.5"], r"argument --batch: invalid int value: '2.5'"),
    ("tail-cap-negative", ["--tail-cap=-1"], r"--tail-cap=-1: must be at least 0"),
    ("max-dist-negative", ["--max-dist=-2"], r"--max-dist=-2: must be at least 0"),
    ("seed-not-an-int", ["--seed=x"], r"argument --seed: invalid int value: 'x'"),
    ("poll-zero", ["--poll-s=0"], r"--poll-s=0: must be a positive number of seconds"),
    ("poll-negative", ["--poll-s=-1"], r"--poll-s=-1: must be a positive number of seconds"),
    ("poll-nan", ["--poll-s=nan"], NAN.format("poll-s")),
    ("timeout-negative", ["--timeout-s=-5"], r"--timeout-s=-5: must be a positive number of seconds"),
    ("timeout-zero", ["--timeout-s=0"], r"--timeout-s=0: must be a positive number of seconds"),
    ("timeout-inf", ["--timeout-s=inf"], r"--timeout-s=inf: must be a positive number of seconds"),
    ("point-timeout-zero", ["--point-timeout-s=0"], r"--point-timeout-s=0: must be a positive number"),
    ("point-timeout-nan", ["--point-timeout-s=nan"], NAN.format("point-timeout-s")),
    ("compile-workers-negative", ["--compile-workers=-1"], r"--compile-workers=-1: must be at least 0"),
    ("remeasure-negative", ["--remeasure=-2"], r"--remeasure=-2: must be at least 0"),
    ("max-cv-zero", ["--max-cv=0"], r"--max-cv=0: must be a positive fraction, e.g. 0.05"),
    ("max-cv-nan", ["--max-cv=nan"], r"--max-cv=nan: must be a positive fraction"),
    ("remote-space", ["--gpu=h100", "--remote=gpu box"],
     r"--remote 'gpu box': empty or contains whitespace; expected user@host\[:port\]"),
    ("remote-port", ["--gpu=h100", "--remote=u@gpu:99999"],
     r"--remote 'u@gpu:99999': port '99999' is not a number from 1 to 65535; expected user@host"),
    ("remote-option-injection", ["--gpu=h100", "--remote=-oProxyCommand=x"],
     r"--remote '-oProxyCommand=x': .* is not a host name; expected user@host"),
    ("remote-with-local", ["--remote=u@gpu"],
     r"--remote=u@gpu with --gpu=local: a remote box needs --gpu=ALIAS .* or --gpu=auto"),
    ("remote-several-cards", ["--gpu=l40s,h100", "--remote=u@gpu"],
     r"--gpu=l40s,h100 names several cards but --remote is one server; rent one per card with --provider"),
    ("ssh-key-missing", ["--gpu=h100", "--remote=u@gpu", "--ssh-key={tmp}/no_such_key"],
     r"--ssh-key .*no_such_key: no such file; give the private key file"),
    ("ssh-key-a-folder", ["--gpu=h100", "--remote=u@gpu", "--ssh-key={tmp}"],
     r"--ssh-key .*: is a directory; give the private key file"),
    ("known-hosts-folder-missing", ["--gpu=h100", "--remote=u@gpu", "--known-hosts={tmp}/no/kh"],
     r"--known-hosts .*no/kh: its folder does not exist; give a file in an existing folder"),
    ("provider-unknown", ["--gpu=h100", "--provider=aws"],
     r"argument --provider: invalid choice: 'aws' \(choose from '?command'?, '?skypilot'?, '?slurm'?\)"),
    ("provider-without-up-cmd", ["--gpu=h100", "--provider=command", DOWN],
     r"--provider command needs --up-cmd and --down-cmd \(missing: --up-cmd\), e.g. --up-cmd="),
    ("provider-without-either-cmd", ["--gpu=h100", "--provider=command"],
     r"\(missing: --up-cmd and --down-cmd\)"),
    ("provider-bad-placeholder", ["--gpu=h100", "--provider=command",
                                  "--up-cmd=touch {tmp}/rented-{{gpuu}}", DOWN],
     r"--up-cmd: unknown placeholder\(s\) \{gpuu\}; valid: \{gpu\}, \{gpu_name\}"),
    ("provider-bad-down-placeholder", ["--gpu=h100", "--provider=command", UP, "--down-cmd=rm {{id}}"],
     r"--down-cmd: unknown placeholder\(s\) \{id\}; valid: \{gpu\}, \{gpu_name\}, \{handle\}, "
     r"\{target\}"),
    ("provider-unclosed-quote", ["--gpu=h100", "--provider=command", "--up-cmd=mk 'x", DOWN],
     r"--up-cmd=\"mk 'x\": No closing quotation"),
    ("provider-and-remote", ["--gpu=h100", "--provider=command", UP, DOWN, "--remote=u@gpu"],
     r"--provider=command and --remote=u@gpu exclude each other"),
    ("provider-local", ["--provider=command", UP, DOWN],
     r"--provider=command needs --gpu=ALIAS\[,ALIAS…\] \(the card to rent\), not --gpu=local"),
    ("provider-auto", ["--gpu=auto", "--provider=skypilot"], r"--provider=skypilot needs --gpu=ALIAS"),
    ("up-cmd-with-skypilot", ["--gpu=h100", "--provider=skypilot", UP],
     r"--up-cmd='touch .*rented-\{gpu\}' is only used with --provider=command \(--provider is skypilot\)"),
    ("down-cmd-without-provider", ["--gpu=h100", DOWN],
     r"--down-cmd='true \{handle\}' is only used with --provider=command \(--provider is not given\)"),
    ("sky-cloud-without-skypilot", ["--sky-cloud=gcp"],
     r"--sky-cloud='gcp' is only used with --provider=skypilot \(--provider is not given\)"),
    ("box-dir-root", ["--box-dir=/"], r"--box-dir=/: the run fills this folder and keeps it to itself; give a folder of its own"),
    ("box-dir-home", ["--box-dir=~"], r"--box-dir=~: the run fills this folder"),
    ("box-dir-remote-home", ["--gpu=h100", "--remote=u@gpu", "--box-dir=~/"], r"--box-dir=~/: the run fills"),
    ("box-dir-dot", ["--box-dir=."], r"--box-dir=\.: the run fills this folder"),
    ("box-dir-newline", ["--box-dir={tmp}/box\nRUN .."],
     r"--box-dir='.*box\\nRUN \.\.': a name with control characters \(a newline, a tab, …\) is "
     r"refused; give a plain path"),
    ("db-tab", ["--db={tmp}/a\tb.db"], r"--db='.*a\\tb.db': a name with control characters"),
    ("tmux-socket-escape", ["--tmux-socket=a\x1bb"], r"--tmux-socket='a\\x1bb': a name with control"),
    ("report-json-empty", ["--report-json="], r"--report-json='': empty; give the file to write"),
    ("report-json-a-folder", ["--report-json={tmp}"],
     r"--report-json=.*: is a directory; give a file path in it, e.g. --report-json=.*collect-report.json"),
    ("report-json-folder-missing", ["--report-json={tmp}/no/report.json"],
     r"--report-json=.*no/report.json: its folder .*no does not exist; create it first or give a file"),
    ("report-json-is-the-db", ["--report-json={tmp}/db/autotune.db"],
     r"--report-json=.*autotune.db is the node DB \(--db\): the report would overwrite it; give another"),
    ("report-json-is-the-ledger", ["--ledger={tmp}/ledger.json", "--report-json={tmp}/ledger.json"],
     r"--report-json=.*ledger.json is the ledger \(--ledger\): the report would overwrite it"),
]


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    shutil.copytree(ROOT / "collect_tests", pytester.path / "collect_tests")
    monkeypatch.setenv("EMMY_STATE_DIR", str(pytester.path / "state"))
    monkeypatch.delenv("EMMY_TUNE_DB", raising=False)
    return pytester


@pytest.fixture
def tmux_socket():
    name = f"emmy-opt-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


@pytest.mark.parametrize(("args", "message"), [pytest.param(a, m, id=i) for i, a, m in CASES])
def test_bad_value_is_a_usage_error_and_nothing_is_touched(project: pytest.Pytester, tmux_socket: str,
                                                           args: list[str], message: str) -> None:
    tmp = project.path
    # defaults that keep a run that wrongly got through short; the case's own values come
    # last (a later value of an option wins)
    result = project.runpytest(*_base(tmp, tmux_socket), *[a.format(tmp=tmp) for a in args])
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-20:]
    result.stderr.re_match_lines([f".*{message}.*"])
    # nothing was rented, created or written
    assert not list(tmp.glob("rented-*"))
    assert not (tmp / "box").exists()
    assert not (tmp / "db").exists()
    assert not (tmp / "state").exists()
    assert not list(tmp.glob("*.json"))  # no --report-json either
    assert subprocess.run(["tmux", "-L", tmux_socket, "has-session"], capture_output=True).returncode != 0


def test_the_marker_shows_a_rented_server(project: pytest.Pytester, tmux_socket: str) -> None:
    """The control: with valid values the same command line does rent (the up command runs,
    prints no server, and the job fails saying so)."""
    tmp = project.path
    result = project.runpytest(*_base(tmp, tmux_socket), "--gpu=h100", "--provider=command",
                               UP.format(tmp=tmp), DOWN.format(tmp=tmp))
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.outlines[-20:]
    result.stdout.fnmatch_lines(["*the up command printed no server*"])
    assert (tmp / "rented-h100").exists()


def _base(tmp: Path, tmux_socket: str) -> list[str]:
    return ["collect_tests", "-p", "no:cacheprovider", "-k", "own and softmax", "--budget-s=5",
            "--timeout-s=30", f"--db={tmp / 'db' / 'autotune.db'}", f"--box-dir={tmp / 'box'}",
            f"--tmux-socket={tmux_socket}"]


def test_the_run_options_are_one_frozen_value_with_resolved_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part of a run reads the same checked value: paths resolved once, nothing mutable."""
    import dataclasses
    from types import SimpleNamespace

    from harness.contract import SweepOptions, ToolsSpec
    from harness.options import RunOptions

    monkeypatch.setenv("EMMY_STATE_DIR", str(tmp_path / "state"))
    names = [f.name for f in dataclasses.fields(RunOptions)]
    raw = SimpleNamespace(**{**dict.fromkeys(names), **dict(
        gpu="local", budget_s=60.0, ledger=None, rows_dir="~/rows", no_merge=False,
        accept_new_host_key=False, keep_server=False, box_install=False)})
    opts = RunOptions.from_config(raw, gpus=["local"], shares={"own": 0.5, "cross": 0.2,
                                                               "tail": 0.3},
                                  db=None, report_json=None, remote=None,
                                  sweep=SweepOptions(baselines="compile,torch"),
                                  tools=ToolsSpec())
    assert opts.ledger_path == tmp_path / "state" / "ledger.json"
    assert opts.leases_dir == tmp_path / "state" / "leases"
    assert opts.rows_dir == Path.home() / "rows" and opts.merging
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.budget_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        opts.shares["own"] = 1.0  # type: ignore[index]
    # what reaches the box is the contract's values, the baselines written one way
    assert opts.sweep == SweepOptions() and opts.sweep.baselines == "torch,compile"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.sweep.batch = 1  # type: ignore[misc]
    assert opts.report()["rows_dir"] == str(Path.home() / "rows")
