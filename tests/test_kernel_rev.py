"""Each row names the revision of its kind's kernel code (``provenance.kernel_rev``): a hash
of the kind's module and the modules of ``harness.kinds`` it reaches, so rows of one point
measured before and after a kernel change can be told apart in the node table (that the row
carries it there: tests/test_contract.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from harness import kinds

KINDS_DIR = Path(kinds.__file__).resolve().parent


def _revs(root: Path) -> dict[str, str]:
    return {name: kinds.source_rev(name, root) for name in kinds.names()}


def test_a_kernel_change_moves_the_revision_of_the_kinds_that_run_it_only(tmp_path: Path) -> None:
    root = tmp_path / "kinds"
    shutil.copytree(KINDS_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    before = _revs(root)
    assert before == _revs(KINDS_DIR)  # the same code, the same revision
    assert all(re.fullmatch(r"[0-9a-f]{12}", r) for r in before.values())
    assert len(set(before.values())) == len(before)  # each kind its own

    def touched(module: str) -> set[str]:
        path = root / f"{module}.py"
        path.write_text(path.read_text() + f"\n# {module} changed\n")
        kinds.source_rev.cache_clear()
        after = _revs(root)
        return {k for k in after if after[k] != before[k]}

    # the fold kernel of linear_norm is linear_norm's alone
    assert touched("_linear_norm_triton") == {"linear_norm"}
    before = _revs(root)
    # attention's Gluon kernels are attention's
    assert touched("_attention_gluon") == {"attention"}
    before = _revs(root)
    # the row kinds' shared tile loader: the three row kinds, and norm_linear (its rms pass)
    assert touched("_rows_triton") == {"reduce", "rms_norm", "softmax", "norm_linear"}
    before = _revs(root)
    # base names the GEMM template: a change there is every kind's
    assert touched("_gemm_triton") == set(kinds.names())


def test_a_kind_without_its_source_is_an_error_not_the_hash_of_nothing(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text("# base\n")
    with pytest.raises(FileNotFoundError, match="kind 'softmax': no source"):
        kinds.source_rev("softmax", tmp_path)
    with pytest.raises(KeyError, match="unknown kind 'nope'"):
        kinds.source_rev("nope")
