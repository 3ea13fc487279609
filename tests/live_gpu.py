"""The check the ``gpu`` tests run on the device: points compiled ahead on the box's cores, then
measured by the bench worker, which checks each against the fp32 reference before it times it
(as every sweep point is)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.points import make_spec


def hopper_card(lacks: str) -> Any:
    """This box's card, or a skip with the reason: no CUDA GPU, or one of compute capability
    below 9.0 (``lacks``: what such a card lacks, said in the skip)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False")
    from harness.box.probe import probe
    from harness.cards import card_from_probe

    card = card_from_probe(probe())
    if card.cc < (9, 0):
        pytest.skip(f"{card.name} (compute capability {card.cc}) {lacks}")
    return card


def check_points(kind_name: str, points: list[tuple[str, dict[str, Any], str, dict[str, Any]]],
                 card: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    """``points``: (shape id, shape, label, knobs).  Returns a line per point and the points
    that were not ``ok`` (shape id, spec, status, error)."""
    from harness.box.bench import Bencher
    from harness.box.compiler import CompilePool, default_workers

    compiler = CompilePool(default_workers(), target=("cuda", card.cc[0] * 10 + card.cc[1], 32))
    for i, (_, shape, _, knobs) in enumerate(points):
        compiler.submit(str(i), kind_name, shape, knobs)
    bencher = Bencher("cuda", 2, 5)
    failures, lines = [], []
    for i, (shape_id, shape, label, knobs) in enumerate(points):
        compiler.wait(str(i), 600)
        res = bencher.measure({"kind": kind_name, "shape": shape, "knobs": knobs})
        lines.append(f"{shape_id:58} {label:24} {res['status']:10} "
                     f"{res['value_us'] or 0:10.1f} us  {make_spec(knobs)}")
        if res["status"] != "ok":
            failures.append((shape_id, make_spec(knobs), res["status"], res["error"]))
    return lines, failures
