"""A node table shaped like a real H200 sweep's, for benchmarking ``python -m harness eval``.

    python bench/eval_table.py OUT.db [--rows 8400] [--card h200] [--seed 0]

Every golden shape of the card's pool (``harness.pools.build``: its own, cross and tail
slices, the shipped configurations and the torch / torch.compile baselines), a sample of each
shape's points so the table holds about ``--rows`` rows, as the box would write them
(``harness.box.runner.make_row``'s fields) and merged through :class:`harness.store.NodeStore`.

The times are not measured.  A configuration's time is the shape's best roofline estimate
(:func:`harness.priors.roofline.estimate`) times the roofline's ranking of it (compressed to at
most e^SPREAD: the roofline spreads a shape's configurations wider than a card does), times a
hidden effect of its knobs that the roofline does not know (one seeded factor per kind × knob
value, larger on bigger shapes, and one per kind × pair of knobs), times noise (3%); about 6%
of the points fail (``bench_fail``, as out
of resources would).  The baselines run at the shape's best configuration's time times a
factor drawn per kind.  So the learned prior has something to learn that carries from shape
to shape, and something it cannot (the noise), as on a real table.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import kinds as registry  # noqa: E402
from harness import pools, shipped  # noqa: E402
from harness.cards import Card, by_alias  # noqa: E402
from harness.priors.roofline import estimate  # noqa: E402
from harness.store import NodeStore  # noqa: E402

NOISE = 0.03
FAIL_RATE = 0.06
SPREAD = 1.3  # log of the most a configuration is slower than the roofline's best, by its estimate
KNOB_EFFECT = 0.08  # sigma of a knob value's log factor
PAIR_EFFECT = 0.03  # sigma of a pair of knob values' log factor


def _gauss(*key: Any, sigma: float) -> float:
    """A fixed N(0, sigma) draw per key: the same knob value has the same effect everywhere."""
    h = hashlib.sha1("|".join(map(str, key)).encode()).digest()
    return random.Random(h).gauss(0.0, sigma)


def hidden(kind: str, knobs: Mapping[str, Any], shape_feats: Mapping[str, Any]) -> float:
    """The log factor of a configuration's time that the roofline does not model."""
    size = math.log2(max(2.0, float(shape_feats.get("S_flops") or 0) + 2.0)) / 30.0
    out = sum(_gauss(kind, k, v, sigma=KNOB_EFFECT) * (0.5 + size) for k, v in knobs.items())
    names = sorted(knobs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out += _gauss(kind, a, knobs[a], b, knobs[b], sigma=PAIR_EFFECT)
    return out


def _row(card: Card, point: pools.Point, shape_feats: Mapping[str, Any], status: str,
         value: float | None, i: int) -> dict[str, Any]:
    compile_facts = {} if value is None or shipped.is_baseline(point.spec) else {
        "C_regs": 64 + (i * 37) % 192, "C_spills": 0, "C_shared": (i * 4096) % 200_000}
    return {
        "point_key": point.key, "gpu": card.name, "regime": card.regime, "kind": point.kind,
        "shape_id": point.shape_id, "shape": point.shape, "spec": point.spec,
        "knobs": point.knobs, "slice": point.slice, "status": status, "value_us": value,
        "ref_us": None, "variance": None if value is None else (value * NOISE) ** 2,
        "n_samples": 20 if value is not None else None,
        "error": None if value is not None else "out of resources (synthetic)",
        "features": {**card.features(), **shape_feats, **point.knobs, **compile_facts},
        "cc": list(card.cc), "compile_s": 0.3, "bench_s": 0.03, "run_id": "bench-eval-table",
        "measured_at": f"2026-12-03T10:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}."
                       f"{i % 1000:03d}000Z",
        "provenance": {"synthetic": "bench/eval_table.py"},
    }


def build_rows(card: Card, n_rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """About ``n_rows`` rows over every golden shape of ``card``'s pool."""
    rng = random.Random(seed)
    pool = pools.build(card)
    everything = pool.points()
    keep = min(1.0, n_rows / max(1, len(everything)))
    rows: list[dict[str, Any]] = []
    for sp in pool.shapes:
        kind = registry.get(sp.golden.kind)
        feats = kind.shape_features(sp.golden.shape)
        configs = [p for p in sp.points if not shipped.is_baseline(p.spec)]
        chosen = [p for p in configs if p.first or rng.random() < keep]
        roof = {p.key: estimate({**card.features(), **feats, **p.knobs}, p.knobs)["R_time_us"]
                for p in chosen}
        floor = min(roof.values()) if roof else 1.0
        times: dict[str, float] = {}
        for p in chosen:
            # the roofline's ranking, compressed (its spread is wider than a card's), then
            # what it does not know, then noise
            rel = SPREAD * math.tanh(math.log(roof[p.key] / floor) / SPREAD)
            times[p.key] = floor * math.exp(rel + hidden(p.kind, p.knobs, feats)
                                            + rng.gauss(0.0, NOISE))
        best = min(times.values()) if times else None
        by_kind = defaultdict(float)
        for p in sp.points:
            if shipped.is_baseline(p.spec):
                if best is not None:
                    by_kind[p.spec] = best * math.exp(_gauss(p.kind, p.spec, sigma=0.4))
                    rows.append(_row(card, p, feats, "ok", by_kind[p.spec], len(rows)))
                continue
            if p.key not in times:
                continue
            if rng.random() < FAIL_RATE:
                rows.append(_row(card, p, feats, "bench_fail", None, len(rows)))
            else:
                rows.append(_row(card, p, feats, "ok", times[p.key], len(rows)))
    return rows


def build(out: Path, n_rows: int = 8400, card: str = "h200", seed: int = 0) -> Path:
    """Write the table to ``out`` (a new SQLite file); returns its path."""
    out = Path(out)
    if out.exists():
        raise SystemExit(f"{out} exists; give a new path")
    rows = build_rows(by_alias(card), n_rows, seed)
    with NodeStore(out) as store:
        store.merge(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--rows", type=int, default=8400)
    p.add_argument("--card", default="h200")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    db = build(args.out, args.rows, args.card, args.seed)
    with NodeStore(db) as store:
        rows = store.rows()
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{db}: {len(rows)} rows ({ok} ok) over "
          f"{len({r['shape_id'] for r in rows})} shapes of {args.card}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
