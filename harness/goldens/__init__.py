"""Golden shapes (real model layers) and per-card anchors, kept as JSON data beside this file.

``shapes.json`` holds the deployable golden shapes, ``interpret_shapes.json`` the tiny ones
the CPU interpreter runs; ``anchors/<card alias>.json`` holds a card's anchors (the best known
spec per shape), written by ``python -m harness goldens record``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cards import INTERPRET

HERE = Path(__file__).resolve().parent
ANCHOR_DIR = HERE / "anchors"


@dataclass(frozen=True)
class GoldenShape:
    kind: str
    name: str
    model: str
    shape: dict[str, Any] = field(hash=False)
    shape_id: str = ""


@dataclass(frozen=True)
class Anchor:
    gpu: str
    kind: str
    shape_id: str
    spec: str
    value_us: float | None = None
    source: str = ""


def _shape_file(regime: str) -> Path:
    return HERE / ("interpret_shapes.json" if regime == INTERPRET else "shapes.json")


def shapes(regime: str, kinds: list[str] | None = None, filter: str | None = None,
           path: Path | None = None) -> list[GoldenShape]:
    """Golden shapes of ``regime``; ``filter`` keeps those whose name contains it."""
    from harness import kinds as registry

    data = json.loads((path or _shape_file(regime)).read_text())["kinds"]
    out = []
    for kind_name in sorted(data):
        if kinds is not None and kind_name not in kinds:
            continue
        kind = registry.get(kind_name)
        for entry in data[kind_name]:
            if filter and filter not in entry["name"]:
                continue
            out.append(GoldenShape(kind=kind_name, name=entry["name"], model=entry["model"],
                                   shape=dict(entry["shape"]),
                                   shape_id=kind.shape_id(entry["shape"])))
    return out


def load_anchor_file(path: Path) -> list[Anchor]:
    data = json.loads(path.read_text())
    default_gpu = data.get("gpu", "")
    return [Anchor(gpu=a.get("gpu", default_gpu), kind=a["kind"], shape_id=a["shape_id"],
                   spec=a["spec"], value_us=a.get("value_us"), source=a.get("source", ""))
            for a in data.get("anchors", [])]


def anchors(anchor_dir: Path | None = None) -> list[Anchor]:
    """Every card's anchors (own vs cross is decided against the live card)."""
    out: list[Anchor] = []
    for path in sorted((anchor_dir or ANCHOR_DIR).glob("*.json")):
        out.extend(load_anchor_file(path))
    return out


def write_anchor_file(path: Path, gpu: str, anchors_: list[Anchor], comment: str) -> None:
    payload = {"comment": comment, "gpu": gpu,
               "anchors": [{"kind": a.kind, "shape_id": a.shape_id, "spec": a.spec,
                            "value_us": a.value_us, "source": a.source}
                           for a in sorted(anchors_, key=lambda a: (a.kind, a.shape_id))]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    tmp.replace(path)
