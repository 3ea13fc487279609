"""The plugin as pytest sees it: ids, -k selection, ordering, bad options (pytester)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import kinds as registry

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    shutil.copytree(ROOT / "collect_tests", pytester.path / "collect_tests")
    return pytester


def _ids(result: pytest.RunResult) -> list[str]:
    return [line.split("::", 1)[1] for line in result.outlines if "::test_sweep[" in line]


def test_ids_are_card_slice_kind(project: pytest.Pytester) -> None:
    result = project.runpytest("collect_tests", "--collect-only", "-q", "--gpu=h200")
    ids = _ids(result)
    want = {f"test_sweep[h200-{s}-{k}]" for s in ("own", "cross", "tail") for k in registry.names()}
    assert set(ids) == want
    # slices run own → cross → tail
    slices = [i.split("-")[1] for i in ids]
    assert slices == sorted(slices, key=("own", "cross", "tail").index)


def test_kinds_inside_a_slice_run_smallest_pool_first(project: pytest.Pytester) -> None:
    result = project.runpytest("collect_tests", "--collect-only", "-q", "--gpu=h200", "-k", "tail")
    kinds = [i.split("-")[2].rstrip("]") for i in _ids(result)]
    from harness import pools
    from harness.cards import by_alias

    size = {k: len(pools.build(by_alias("h200"), kinds=[k]).points()) for k in kinds}
    assert [size[k] for k in kinds] == sorted(size[k] for k in kinds)


def test_k_selects_a_kind_or_a_slice(project: pytest.Pytester) -> None:
    ids = _ids(project.runpytest("collect_tests", "--collect-only", "-q", "-k", "softmax"))
    assert ids == [f"test_sweep[local-{s}-softmax]" for s in ("own", "cross", "tail")]
    ids = _ids(project.runpytest("collect_tests", "--collect-only", "-q", "-k", "own"))
    assert {i.split("-")[1] for i in ids} == {"own"} and len(ids) == len(registry.names())


def test_m_selects_by_slice_and_kind_markers_each_listed_once(project: pytest.Pytester) -> None:
    ids = _ids(project.runpytest("collect_tests", "--collect-only", "-q", "-m", "own"))
    assert {i.split("-")[1] for i in ids} == {"own"} and len(ids) == len(registry.names())
    ids = _ids(project.runpytest("collect_tests", "--collect-only", "-q", "-m",
                                 "softmax and not tail"))
    assert ids == [f"test_sweep[local-{s}-softmax]" for s in ("own", "cross")]
    listed = project.runpytest("collect_tests", "--markers").outlines
    for name in ("sweep", "own", "cross", "tail", *registry.names()):
        assert sum(line.startswith(f"@pytest.mark.{name}:") for line in listed) == 1, name


def test_several_cards_make_ids_per_card(project: pytest.Pytester) -> None:
    ids = _ids(project.runpytest("collect_tests", "--collect-only", "-q", "--gpu=l40s,h100", "-k", "own and matmul"))
    assert ids == ["test_sweep[l40s-own-matmul]", "test_sweep[h100-own-matmul]"]


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu=l4os"], r"--gpu: unknown card 'l4os'; did you mean 'l40s'\? valid aliases: l40s, .*h200"),
    (["--gpu=local,h100"], r"'local' cannot be combined"),
    (["--budget-s=0"], r"--budget-s=0: the budget must be a positive number of seconds"),
    (["--budget-s=-5"], r"--budget-s=-5"),
    (["--share-own=0", "--share-cross=0", "--share-tail=0"], r"at least one share must be positive"),
    (["--share-tail=-1"], r"--share-tail"),
    (["--batch=0"], r"--batch=0: must be at least 1"),
    (["--tail-cap=-1"], r"--tail-cap=-1"),
])
def test_bad_option_is_a_usage_error_naming_it(project: pytest.Pytester, args: list[str], message: str) -> None:
    result = project.runpytest("collect_tests", "--collect-only", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.re_match_lines([f".*{message}.*"])


def test_unwritable_db_is_refused_before_any_box(project: pytest.Pytester, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = project.runpytest("collect_tests", "--collect-only", f"--db={blocker}/sub/x.db",
                               f"--box-dir={tmp_path}/box")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.re_match_lines([r".*--db: cannot create .*sub.*"])
    assert not (tmp_path / "box").exists()


def test_plain_pytest_never_collects_sweeps(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.getini("testpaths") == ["tests"]


def test_local_collection_needs_no_paramiko() -> None:
    """A GPU box that is its own controller (``--gpu=local``) has no paramiko: never import it."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['paramiko'] = None; import pytest; "
            "sys.exit(pytest.main(['collect_tests', '--collect-only', '-q', '-p', 'no:cacheprovider']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
