"""The controller's half of a session: the request it sends the box, and the plan preview.

The request (:class:`~harness.contract.SessionSpec`) carries what only the controller knows:
the jobs pytest selected, in their order, and the node table's history of the card (the
seconds a point of each kind took one lane, and a ``torch.compile`` baseline of a shape), so
that the box plans with them.  The preview (``python -m harness plan``) makes the same request
for a catalog card, counts the card's pools here, and runs the run's own planner
(:func:`harness.planner.run_session`, with the plan the box service makes,
:func:`harness.planner.session_plan`) on jobs simulated at those paces.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import cards, pools, shipped
from harness.cards import Card
from harness.contract import (
    COMPILE_BASELINE_S,
    DEFAULT_S_PER_POINT,
    JobRef,
    SessionSpec,
    SweepOptions,
    ToolsSpec,
    parse_baselines,
)
from harness.ledger import Ledger
from harness.planner import Simulated, run_session, session_plan
from harness.slices import SLICES


def estimate_order(selected: Sequence[tuple[str, JobRef]]) -> list[tuple[str, JobRef]]:
    """The run order of the selected (``--gpu`` token, job) pairs, fixed before any box is
    seen (pytest runs items in collection order): per card, slices own → cross → tail, and
    inside a slice the kinds with the smallest pools first (on the named card, or on the
    interpreter / an H100 when the card is only known once the box is probed)."""
    sizes: dict[tuple[str, str], int] = {}

    def size(gpu: str, kind: str) -> int:
        if (gpu, kind) not in sizes:
            if gpu in (cards.LOCAL, cards.AUTO):
                card = cards.by_alias("h100") if shutil.which("nvidia-smi") else cards.INTERPRETER
            else:
                card = cards.by_alias(gpu)
            sizes[(gpu, kind)] = len(pools.build(card, kinds=[kind]).points())
        return sizes[(gpu, kind)]

    gpus = list(dict.fromkeys(g for g, _ in selected))
    return sorted(selected, key=lambda gj: (gpus.index(gj[0]), SLICES.index(gj[1].slice),
                                            size(gj[0], gj[1].kind), gj[1].kind))


def paces(db: Path | None, card: str, regime: str, kinds: Iterable[str]) -> dict[str, float]:
    """kind → seconds one lane takes a point of it on ``card``: the node table's history (the
    median pace of earlier jobs), else the regime's default."""
    kinds = list(kinds)
    rates = {k: DEFAULT_S_PER_POINT.get(regime, 0.1) for k in kinds}
    if db is not None and db.is_file():
        from harness.store import NodeStore

        with NodeStore(db) as store:
            rates.update({k: v for k, v in store.paces(card, regime).items() if k in kinds})
    return rates


def compile_costs(db: Path | None, card: str, regime: str, kinds: Iterable[str]
                  ) -> dict[str, float]:
    """kind → seconds ``torch.compile``'s baseline of a shape takes on ``card``: the node
    table's history of that kind (Inductor's autotuning of a fused GEMM costs several times a
    reduction's), else of any kind on the card, else the default."""
    kinds = list(kinds)
    if db is None or not db.is_file():
        return dict.fromkeys(kinds, COMPILE_BASELINE_S)
    from harness.store import NodeStore

    with NodeStore(db) as store:
        card_s = store.point_cost(card, regime, shipped.COMPILE_SPEC)
        fallback = COMPILE_BASELINE_S if card_s is None else card_s
        seen = {k: store.point_cost(card, regime, shipped.COMPILE_SPEC, k) for k in kinds}
    return {k: fallback if s is None else s for k, s in seen.items()}


def make_spec(*, run_id: str, session_id: str, budget_s: float, shares: Mapping[str, float],
              jobs: Sequence[JobRef], card: str, regime: str, db: Path | None,
              sweep: SweepOptions, tools: ToolsSpec) -> SessionSpec:
    """The session request for ``jobs`` on ``card``, with the paces of the node table ``db``
    (None, or a file that does not exist yet: the defaults)."""
    kinds = sorted({j.kind for j in jobs})
    return SessionSpec(run_id=run_id, session_id=session_id, budget_s=budget_s,
                       shares=dict(shares), jobs=tuple(jobs),
                       s_per_point=paces(db, card, regime, kinds),
                       compile_s=compile_costs(db, card, regime, kinds), sweep=sweep, tools=tools)


def preview(spec: SessionSpec, card: Card, ledger: Ledger, lanes: int = 1) -> dict[str, Any]:
    """What ``spec`` buys on ``card``: its pools counted here, the points ``ledger`` calls done
    left out, and the session's plan run on jobs simulated at the request's paces."""
    s = spec.sweep
    pool = pools.build(card, kinds=sorted({j.kind for j in spec.jobs}), filter=s.filter,
                       max_dist=s.max_dist, tail_cap=s.tail_cap,
                       baselines=parse_baselines(s.baselines))
    todo = {j: [p for p in pool.points(j.slice, j.kind)
                if ledger.needs_run(p.key, card.regime, s.max_attempts)] for j in spec.jobs}
    heavy = {j: sum(1 for p in v if p.spec == shipped.COMPILE_SPEC) for j, v in todo.items()}
    plan = session_plan(spec, {j: len(v) for j, v in todo.items()}, heavy, lanes)
    sim = Simulated({j: len(v) for j, v in todo.items()}, plan.rates, lanes=lanes, heavy=heavy,
                    heavy_s=spec.compile_s)
    skipped: dict[JobRef, str] = {}
    run_session(plan, sim, skip=lambda job, allot: skipped.__setitem__(
        job, f"skipped (allotted {allot:.1f}s, under what a job can use)"))
    runs = {(e["job"], e["round"]): e for e in sim.log or []}
    jobs = []
    for j in spec.jobs:
        n = len(todo[j])
        first = runs.get((j, 0))
        ups = [e for (job, rnd), e in sorted(runs.items(), key=lambda kv: kv[0][1])
               if job == j and rnd > 0]
        measures = sum(int(e["measures"]) for e in ([first] if first else []) + ups)  # type: ignore[call-overload]
        if j not in plan.order:
            state = ("no points to measure" if n == 0 else
                     f"--share-{j.slice}=0" if spec.shares.get(j.slice, 0) <= 0 else "not run")
        elif j in skipped:
            state = skipped[j]
        else:
            state = "all of its points" if measures >= n else "budget spent"
        jobs.append({"slice": j.slice, "kind": j.kind, "points": n,
                     "allotment_s": round(float(first["allotment_s"]), 1) if first else 0.0,  # type: ignore[arg-type]
                     "top_up_s": round(sum(float(e["allotment_s"]) for e in ups), 1),  # type: ignore[misc]
                     "measures": measures,
                     "seconds": round(sum(float(e["spent_s"]) for e in  # type: ignore[misc]
                                          ([first] if first else []) + ups), 1),
                     "state": state + (f" (after {len(ups)} top-up(s))" if ups else "")})
    total = sum(len(v) for v in todo.values())
    bought = sum(j["measures"] for j in jobs)
    return {"card": card.name, "regime": card.regime, "budget_s": spec.budget_s, "lanes": lanes,
            "s_per_point": {k: round(v, 4) for k, v in plan.rates.items()},
            "shares": plan.shares, "jobs": jobs, "points": total, "measures": bought,
            "unspent_s": round(plan.remaining_s, 1)}


def format_preview(p: dict[str, Any]) -> list[str]:
    shares = " ".join(f"{s} {v:.0%}" for s, v in p["shares"].items())
    paces_ = ", ".join(f"{k} {v:g}s" for k, v in sorted(p["s_per_point"].items()))
    lanes = f" on {p['lanes']} lanes" if p["lanes"] > 1 else ""
    lines = [f"what {p['budget_s']:.0f}s buys on {p['card']} ({p['regime']}){lanes}, shares "
             f"{shares}; seconds a point of one lane: {paces_}",
             f"{'slice':5} {'kind':12} {'points':>7} {'allotted s':>10} {'top-up s':>8} "
             f"{'measures':>8}  state"]
    for j in sorted(p["jobs"], key=lambda j: SLICES.index(j["slice"])):
        lines.append(f"{j['slice']:5} {j['kind']:12} {j['points']:>7} {j['allotment_s']:>10.0f} "
                     f"{j['top_up_s']:>8.0f} {j['measures']:>8}  {j['state']}")
    pct = p["measures"] / p["points"] if p["points"] else 1.0
    lines.append(f"total: about {p['measures']} of {p['points']} points ({pct:.0%}); "
                 f"{p['unspent_s']:.0f}s of the budget left unspent")
    return lines
