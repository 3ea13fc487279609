"""Priors: plug-ins that rank the kernel configurations of a shape before they are measured.

A *prior* is any object with

- ``name: str``;
- ``fit(train_rows) -> None``: learn from measured node rows (``ok`` rows as
  :meth:`harness.store.NodeStore.rows` returns them, ``features`` decoded); called again for
  every fold, so it must forget what an earlier call learned;
- ``score(rows) -> list[float]``: one score per row, **lower = predicted faster**; only the
  order inside one shape is evaluated, so the scale is free (µs, a distance, a rank);
- optionally ``learns: bool`` (default True): False says ``fit`` ignores its rows, so the
  leave-one-card-out evaluation, which would repeat the same numbers, is skipped;
- optionally ``unit: str``: ``"us"`` when scores are predicted microseconds (the report then
  plots them against the measured times on log-log axes).

The evaluator (:mod:`harness.evaluate`) never gives a prior the rows it is scored on.

Adding a prior, either way:

1. in code: ``harness.priors.register("mine", lambda ctx: MyPrior())``, in a module that is
   imported before the evaluation runs;
2. on the command line, with no registration: ``python -m harness eval --prior
   mypkg.mymod:MyPrior``.  The attribute is either a prior object, or a callable (a class, a
   function) that takes a :class:`PriorContext` and returns one.

Built in: ``oracle`` and ``random`` (sanity baselines), ``transfer`` (knob distance to other
cards' anchors), ``roofline`` (an analytical time estimate), ``learned`` (gradient-boosted
trees on the features, learning each configuration's time relative to its shape's), ``learned_c``
(the same, also seeing the C_* compile facts) and ``learned_abs`` (learning absolute times).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from harness.goldens import Anchor
from harness.points import parse_spec

Row = Mapping[str, Any]
FACT_PREFIXES = ("H_", "S_", "C_")
"""Feature prefixes of card attributes, shape facts and compile facts; the rest are knobs."""

__all__ = [
    "DEFAULT_PRIORS",
    "Prior",
    "PriorContext",
    "PriorError",
    "learns",
    "make",
    "names",
    "register",
    "row_knobs",
]


class PriorError(ValueError):
    """A prior name or ``module:attr`` spec that does not give a prior."""


@runtime_checkable
class Prior(Protocol):
    """What the evaluator calls; see the module docstring for the contract."""

    name: str

    def fit(self, train_rows: Sequence[Row]) -> None: ...

    def score(self, rows: Sequence[Row]) -> list[float]: ...


@dataclass(frozen=True)
class PriorContext:
    """What a prior factory may use: the anchors of every card, and a seed."""

    anchors: tuple[Anchor, ...] = field(default=(), hash=False)
    seed: int = 0


Factory = Callable[[PriorContext], Prior]
_REGISTRY: dict[str, Factory] = {}

DEFAULT_PRIORS = ("oracle", "random", "transfer", "roofline", "learned")
"""What ``python -m harness eval`` evaluates when no ``--prior`` is given."""


def register(name: str, factory: Factory) -> None:
    """Make ``name`` resolve to ``factory(ctx)``; a later registration of a name wins."""
    if not name or ":" in name:
        raise PriorError(f"prior name {name!r} must be non-empty and contain no ':'")
    _REGISTRY[name] = factory


def names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def learns(prior: Prior) -> bool:
    """Whether ``fit`` uses its rows (an unknown plug-in is assumed to)."""
    return bool(getattr(prior, "learns", True))


def make(spec: str, ctx: PriorContext | None = None) -> Prior:
    """The prior a registered name or a ``module:attr`` spec names, built with ``ctx``."""
    _load_builtins()
    ctx = ctx or PriorContext()
    if spec in _REGISTRY:
        return _check(spec, _REGISTRY[spec](ctx))
    if ":" not in spec:
        raise PriorError(
            f"unknown prior {spec!r}; registered priors: {', '.join(names())} "
            "(or give your own as module:attr, e.g. mypkg.priors:MyPrior)"
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PriorError(f"prior {spec!r}: cannot import {module_name!r}: {e}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise PriorError(f"prior {spec!r}: module {module_name!r} has no {attr!r}") from None
    if isinstance(obj, type) or not isinstance(obj, Prior):  # a class is a factory
        if not callable(obj):
            raise PriorError(
                f"prior {spec!r} is a {type(obj).__name__}; expected an object with fit() and "
                "score(), or a callable taking a PriorContext that returns one"
            )
        obj = obj(ctx)
    return _check(spec, obj)


def row_knobs(row: Row) -> dict[str, Any]:
    """A row's knobs with their types: the features that are not H_*, S_* or C_* facts, else
    the spec's values (strings, as a spec stores them)."""
    feats = row.get("features") or {}
    knobs = {k: v for k, v in feats.items() if not k.startswith(FACT_PREFIXES)}
    if knobs or not row.get("spec"):
        return knobs
    return dict(parse_spec(row["spec"]))


def _check(spec: str, obj: Any) -> Prior:
    if not isinstance(obj, Prior):
        raise PriorError(
            f"prior {spec!r} gave a {type(obj).__name__} without name, fit() and score()"
        )
    return obj


_loaded = False


def _load_builtins() -> None:
    # Lazily, so importing the registry does not import scikit-learn.
    global _loaded
    if _loaded:
        return
    _loaded = True
    from harness.priors import baselines, roofline, transfer

    builtins: dict[str, Factory] = {
        "oracle": lambda ctx: baselines.OraclePrior(),
        "random": lambda ctx: baselines.RandomPrior(seed=ctx.seed),
        "transfer": lambda ctx: transfer.TransferPrior(ctx.anchors),
        "roofline": lambda ctx: roofline.RooflinePrior(),
    }

    def learned(compile_facts: bool, relative: bool = True) -> Factory:
        def factory(ctx: PriorContext) -> Prior:
            from harness.priors.learned import LearnedPrior

            return LearnedPrior(seed=ctx.seed, compile_facts=compile_facts, relative=relative)

        return factory

    builtins["learned"] = learned(False)
    builtins["learned_c"] = learned(True)
    builtins["learned_abs"] = learned(False, relative=False)
    for name, factory in builtins.items():
        _REGISTRY.setdefault(name, factory)  # a user's earlier registration wins
