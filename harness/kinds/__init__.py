"""The kind registry: one module per kernel family, looked up by name.

Adding a kind is one module with a :class:`~harness.kinds.base.Kind` subclass plus one line
in ``_MODULES``; nothing else in the harness names kinds.
"""

from __future__ import annotations

import importlib

from harness.kinds.base import Kind

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
