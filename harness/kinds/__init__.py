"""The kind registry: one module per kernel family, looked up by name.

Adding a kind is one module with a :class:`~harness.kinds.base.Kind` subclass plus one line
in ``_MODULES``; nothing else in the harness names kinds.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from harness.kinds.base import Kind

HERE = Path(__file__).resolve().parent
_IMPORT = re.compile(r"harness\.kinds\.(\w+)")

# kind name -> module under harness.kinds that defines KIND
_MODULES: dict[str, str] = {
    "matmul": "matmul",
    "reduce": "reduce",
    "rms_norm": "rms_norm",
    "softmax": "softmax",
    "attention": "attention",
    "norm_linear": "norm_linear",
    "mlp_geglu": "mlp_geglu",
    "linear_norm": "linear_norm",
}

_cache: dict[str, Kind] = {}


class UnknownKindError(KeyError):
    def __str__(self) -> str:
        return f"unknown kind {self.args[0]!r}; valid kinds: {', '.join(names())}"


def names() -> list[str]:
    return sorted(_MODULES)


def get(name: str) -> Kind:
    if name not in _MODULES:
        raise UnknownKindError(name)
    if name not in _cache:
        mod = importlib.import_module(f"harness.kinds.{_MODULES[name]}")
        _cache[name] = mod.KIND
    return _cache[name]


@cache
def source_rev(name: str, root: Path = HERE) -> str:
    """A short hash of the code a kind's rows are measured with: its module and every module
    of ``harness.kinds`` it names, followed through the modules they name (``base`` names the
    GEMM template, so every kind's hash covers it).  Rows carry it in their provenance, so
    rows of one point measured before and after a kernel change can be told apart."""
    if name not in _MODULES:
        raise UnknownKindError(name)
    if not (root / f"{_MODULES[name]}.py").is_file():
        raise FileNotFoundError(f"kind {name!r}: no source {root / _MODULES[name]}.py to hash")
    seen: set[str] = set()
    todo = [_MODULES[name]]
    while todo:
        mod = todo.pop()
        if mod in seen or not (root / f"{mod}.py").is_file():
            continue
        seen.add(mod)
        todo.extend(_IMPORT.findall((root / f"{mod}.py").read_text()))
    digest = hashlib.sha256()
    for mod in sorted(seen):
        digest.update(f"{mod}\n".encode())
        digest.update((root / f"{mod}.py").read_bytes())
    return digest.hexdigest()[:12]


def kernel_rev_notes(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per kind whose rows were not all measured with the kernel code here: rows of
    several ``kernel_rev`` values (or some without one), or all of one revision that is not
    this code's.  Rows that all predate ``kernel_rev`` (none has one) say nothing."""
    revs: dict[str, Counter[str | None]] = {}
    for row in rows:
        prov = row.get("provenance")
        rev = prov.get("kernel_rev") if isinstance(prov, Mapping) else None
        revs.setdefault(str(row.get("kind")), Counter())[rev] += 1
    notes = []
    for kind, counts in sorted(revs.items()):
        if set(counts) == {None} or kind not in _MODULES:
            continue
        here = source_rev(kind)
        if set(counts) == {here}:
            continue
        if len(counts) == 1:
            (rev, n), = counts.items()
            notes.append(f"{kind}: all {n} rows were measured with kernel revision {rev}, not "
                         f"this code's ({here})")
            continue
        parts = [f"{n} of {'this code' if rev == here else rev or 'no recorded revision'}"
                 + (f" ({rev})" if rev == here else "")
                 for rev, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))]
        notes.append(f"{kind}: rows of {len(counts)} kernel revisions ({', '.join(parts)}); "
                     "their times are ranked together")
    return notes
