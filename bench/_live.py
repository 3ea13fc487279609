"""What the bench scripts that measure on the GPU share: the live card from the catalog, the
Bencher with the sweep's defaults, and the card's anchors as knobs."""

from __future__ import annotations

import random
import sys
from typing import Any


def live_setup() -> tuple[Any, Any, dict[str, dict[str, int]]] | None:
    """(card, started Bencher, {shape_id: anchor knobs}) of this machine's GPU; None, with
    the reason on stderr, where there is no CUDA GPU or the catalog lacks it."""
    import torch

    from harness import goldens
    from harness.box.bench import Bencher
    from harness.cards import canonicalize
    from harness.contract import ToolsSpec

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return None
    card = canonicalize(torch.cuda.get_device_name())
    if card is None:
        print(f"{torch.cuda.get_device_name()} is not in the card catalog", file=sys.stderr)
        return None
    o = ToolsSpec()
    bencher = Bencher("cuda", o.warmup, o.iters, max_cv=o.max_cv, remeasure=o.remeasure)
    bencher.start()
    return card, bencher, card_anchors(card.name, goldens.anchors())


def card_anchors(card_name: str, anchors: list[Any]) -> dict[str, dict[str, int]]:
    """{shape_id: knobs} of the card's anchors; where a shape has several (a measured one
    and one taken from vLLM's tuned configs, which has no time), the measured one."""
    from harness.points import parse_spec

    taken: dict[str, Any] = {}
    for a in anchors:
        if a.gpu != card_name:
            continue
        held = taken.get(a.shape_id)
        if held is None or (held.value_us is None and a.value_us is not None):
            taken[a.shape_id] = a
    return {sid: {k: int(v) for k, v in parse_spec(a.spec).items()} for sid, a in taken.items()}


def shape_configs(shape_id: str, pool: list[dict[str, int]], first: list[dict[str, int]],
                  n: int, space: dict[str, list[Any]]) -> list[dict[str, int]]:
    """``first`` (the anchor, the heuristic: each once, its missing knobs at their first value
    in ``space``, the kind's knob space), then ``n`` configurations of ``pool`` drawn at
    random, seeded by the shape, from those not already in ``first``."""
    from harness.kinds.base import completed
    from harness.points import make_spec

    configs: list[dict[str, int]] = []
    taken: set[str] = set()
    for c in (completed(c, space) for c in first):
        if make_spec(c) not in taken:
            taken.add(make_spec(c))
            configs.append(c)
    rest = [c for c in pool if make_spec(c) not in taken]
    return configs + random.Random(shape_id).sample(rest, max(0, min(n, len(rest))))
