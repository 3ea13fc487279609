"""Points per GPU-hour of the sweep against a serial compile-then-``do_bench`` loop, side by side.

    python bench/throughput.py [--kinds matmul,attention,softmax] [--budget-s 40]
                               [--serial-s 30] [--out DIR]

Run on the box (a real GPU).  For each kind it runs one real sweep job
(``python -m harness.box run``, compile-ahead on, the box's defaults) for ``--budget-s`` and
then, over the very points that job measured, in the order it measured them, the loop
``triton.autotune`` runs: compile a configuration (its first launch), then
``triton.testing.do_bench`` it, one after the other, for ``--serial-s``.  Each side starts with
an empty Triton cache of its own and counts its own process start-up.  Points per hour are
points measured over wall seconds.

It prints, per kind and over all: both rates and their ratio; the fraction of the sweep's wall
time the GPU spent in timed kernels (candidate and reference calls of the kept samples); and
where the rest went (start-up, bench worker, waiting for compiles, the harness's own work).
The rows (``DIR/rows-KIND.jsonl``) feed ``bench/reproducibility.py``.

    python bench/throughput.py --from-sweep BOX_DIR [--serial-s 60] [--out DIR]

takes the sweep side from a collection run that already happened on this box (its jobs'
summaries and rows under ``<box-dir>/summary/RUN`` and ``<box-dir>/rows/RUN``: points benched over the jobs' own wall time,
start-up included; a box folder that holds one run) and runs only the serial loop, over points drawn at random from that run's
rows, so both sides cover the same mix of kinds.  A serial loop of a minute covers about a
hundred points, and a matmul point's compile costs several times a reduction's: the ratio is
printed with the serial loop's 90% interval over the points it drew (bootstrap, its process
start held fixed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = str(cache)
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run_sweep_job(kind: str, slice_: str, budget_s: float, out: Path, extra: list[str]) -> dict[str, Any]:
    rows, summary = out / f"rows-{kind}.jsonl", out / f"summary-{kind}.json"
    for p in (rows, summary, out / f"ledger-{kind}.json"):
        p.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "harness.box", "run", "--slice", slice_, "--kind", kind,
           "--budget-s", str(budget_s), "--rows", str(rows), "--ledger", str(out / f"ledger-{kind}.json"),
           "--summary", str(summary), *extra]
    t = time.monotonic()
    proc = subprocess.run(cmd, env=_env(out / "cache-sweep"), cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.monotonic() - t
    if proc.returncode != 0:
        raise SystemExit(f"sweep job {kind} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-2000:]}")
    return {"wall_s": wall, "summary": json.loads(summary.read_text()), "rows": rows}


def run_serial(rows: Path, limit_s: float, out: Path, kind: str) -> dict[str, Any]:
    res = out / f"serial-{kind}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "_serial", "--rows", str(rows),
           "--limit-s", str(limit_s), "--out", str(res)]
    t = time.monotonic()
    proc = subprocess.run(cmd, env=_env(out / f"cache-serial-{kind}"), cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.monotonic() - t
    if proc.returncode != 0:
        raise SystemExit(f"serial loop {kind} failed:\n{proc.stderr[-3000:]}")
    done = [json.loads(line) for line in res.read_text().splitlines()]
    return {"wall_s": wall, "points": done}


def serial_main(args: argparse.Namespace) -> int:
    """The autotune-style loop: compile, then do_bench, one point after the other."""
    t_start = time.monotonic()
    import torch
    import triton.testing

    from harness import kinds as registry

    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.strip()]
    inputs_key, inputs = None, None
    with open(args.out, "w") as out:
        for r in rows:
            if time.monotonic() - t_start > args.limit_s:
                break
            kind = registry.get(r["kind"])
            key = json.dumps([r["kind"], r["shape"]], sort_keys=True)
            if key != inputs_key:
                inputs = kind.make_inputs(r["shape"], "cuda", 0)
                inputs_key = key
            rec: dict[str, Any] = {"point_key": r["point_key"], "harness_status": r["status"]}
            t_point = time.perf_counter()
            try:
                launch = kind.prepare(r["knobs"], r["shape"], inputs)
                t = time.perf_counter()
                launch.run()
                torch.cuda.synchronize()
                rec["compile_s"] = time.perf_counter() - t
                t = time.perf_counter()
                rec["do_bench_us"] = triton.testing.do_bench(launch.run, return_mode="median") * 1e3
                rec["bench_s"] = time.perf_counter() - t
            except Exception as exc:  # noqa: BLE001 - autotune skips configs that fail
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rec["point_s"] = time.perf_counter() - t_point
            out.write(json.dumps(rec) + "\n")
            out.flush()
    return 0


def serial_interval(points: list[dict[str, Any]], wall_s: float, n_boot: int = 2000,
                    seed: int = 0, level: float = 0.9) -> tuple[float, float]:
    """How much the serial loop's points per GPU-hour owe to which points it drew: resample its
    points with replacement (each costs what it took, ``point_s``, else compile and do_bench),
    the rest of its wall time (process start, CUDA, inputs) fixed; the ``level`` interval."""
    import random

    if not points or wall_s <= 0:
        raise ValueError("the serial loop measured no points")
    costs = [p.get("point_s", (p.get("compile_s") or 0.0) + (p.get("bench_s") or 0.0))
             for p in points]
    fixed = max(0.0, wall_s - sum(costs))
    rng = random.Random(seed)
    n = len(costs)
    rates = sorted(n * 3600 / (fixed + sum(rng.choices(costs, k=n))) for _ in range(n_boot))
    tail = (1 - level) / 2
    return rates[int(tail * (n_boot - 1))], rates[int((1 - tail) * (n_boot - 1))]


def _sum_times(per_job: list[dict[str, Any]]) -> dict[str, Any]:
    """The jobs' ``time_s`` added up: seconds by part, the worker's phases, its start-ups."""
    ts: dict[str, Any] = {"worker_phases": {}, "worker_ready": []}
    for t in per_job:
        for k, v in t.items():
            if k == "worker_phases":
                for ph, s in v.items():
                    ts["worker_phases"][ph] = ts["worker_phases"].get(ph, 0.0) + s
            elif k == "worker_ready":
                ts["worker_ready"] += v
            else:
                ts[k] = ts.get(k, 0.0) + v
    return ts


def _phase_line(ts: dict[str, Any], wall: float) -> str:
    """Where the bench worker's time went, as fractions of the wall time."""
    ph = ts.get("worker_phases") or {}
    if not ph:
        return "bench worker by phase: not recorded by this sweep"
    parts = [f"{k.replace('_', ' ')} {v / wall:.1%}" for k, v in
             sorted(ph.items(), key=lambda kv: -kv[1])]
    rest = ts["worker"] - sum(ph.values())
    ready = ts.get("worker_ready") or []
    started = (f"; {len(ready)} worker starts, median {statistics.median(ready):.1f}s"
               if ready else "")
    return (f"bench worker by phase: {', '.join(parts)}; waiting for it to start and "
            f"messages {rest / wall:.1%}{started}")


def from_sweep(run_dir: Path, serial_s: float, out: Path) -> int:
    import random

    out.mkdir(parents=True, exist_ok=True)
    sums = []
    for f in sorted(run_dir.rglob("*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and "benched" in d and "time_s" in d:
            sums.append(d)
    rows = [json.loads(line) for f in sorted(run_dir.rglob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("regime") == "deployable"]
    # the baselines (torch's op, torch.compile) are points of the sweep, but no Triton kernel:
    # the serial loop draws only configurations; what their first launches cost is said
    from harness.shipped import is_baseline

    based = [r for r in rows if is_baseline(str(r.get("spec") or ""))]
    rows = [r for r in rows if not is_baseline(str(r.get("spec") or ""))]
    if based:
        first = {b: sum((r.get("provenance") or {}).get("first_launch_s") or 0 for r in based
                        if r["spec"] == f"baseline={b}") for b in ("torch", "compile")}
        print(f"baselines: {len(based)} rows of the sweep (torch op "
              f"{sum(r['spec'] == 'baseline=torch' for r in based)}, torch.compile "
              f"{sum(r['spec'] == 'baseline=compile' for r in based)}); their first launches "
              f"took {first['torch']:.1f}s and {first['compile']:.1f}s (torch.compile's "
              "compile and autotuning) of the jobs' time")
        spent = sum(((r.get("provenance") or {}).get("first_launch_s") or 0)
                    + (r.get("bench_s") or 0) for r in based)
        n_cfg = sum(d["benched"] for d in sums) - len(based)
        wall_all = sum(d["elapsed_s"] for d in sums)
        print(f"without them: {n_cfg} configurations in {wall_all - spent:.0f}s of job time -> "
              f"{3600 * n_cfg / max(1e-9, wall_all - spent):.0f} points per GPU-hour")
    if not sums or not rows:
        raise SystemExit(f"no job summaries or deployable rows under {run_dir}")
    n_sweep = sum(d["benched"] for d in sums)
    wall = sum(d["elapsed_s"] for d in sums)
    # the box service (one per session): its start, and the span from it to the last job's end,
    # gaps between jobs included (the GPU-hours a rented box bills for)
    span = None
    for f in run_dir.glob("service/*/status.json"):
        st = json.loads(f.read_text())
        if st.get("started_at") and st.get("ended_at"):
            span = (span or 0.0) + st["ended_at"] - st["started_at"]
    ts = _sum_times([d["time_s"] for d in sums])
    random.Random(0).shuffle(rows)
    sample = out / "serial-sample.jsonl"
    sample.write_text("".join(json.dumps(r) + "\n" for r in rows))
    se = run_serial(sample, serial_s, out, "mixed")
    n_serial = len(se["points"])
    r_sweep, r_serial = n_sweep / wall * 3600, n_serial / se["wall_s"] * 3600
    ser_compile = sum(p.get("compile_s", 0) for p in se["points"])
    own = wall - ts["startup"] - ts["worker"] - ts["compile_wait"]
    kinds = sorted({r["kind"] for r in rows})
    print(f"sweep: {len(sums)} jobs over {', '.join(kinds)}: {n_sweep} points in {wall:.0f}s of "
          f"job wall time -> {r_sweep:.0f} points per GPU-hour")
    print(f"serial compile+do_bench loop over {n_serial} of the same points (random order, cold "
          f"cache): {se['wall_s']:.0f}s -> {r_serial:.0f} points per GPU-hour "
          f"({ser_compile / se['wall_s']:.0%} of it compiling)")
    lo, hi = serial_interval(se["points"], se["wall_s"])
    print(f"ratio sweep/serial: {r_sweep / r_serial:.2f}x (the serial loop's 90% interval over "
          f"the points it drew, bootstrap: {lo:.0f}-{hi:.0f} points per GPU-hour, ratio "
          f"{r_sweep / hi:.2f}-{r_sweep / lo:.2f}x)")
    if span:
        r_span = n_sweep / span * 3600
        print(f"over the whole session from the box service's start to its last job's end "
              f"({span:.0f}s, its start and the gaps between jobs included): {r_span:.0f} points "
              f"per GPU-hour, {r_span / r_serial:.2f}x")
    print(f"sweep wall time: GPU in timed kernels {ts['timed_kernels'] / wall:.1%}; start-up "
          f"{ts['startup'] / wall:.1%}, bench worker {ts['worker'] / wall:.1%}, waiting for "
          f"compiles {ts['compile_wait'] / wall:.1%}, the harness's own work {own / wall:.1%}")
    print(_phase_line(ts, wall))
    (out / "throughput.json").write_text(json.dumps(
        {"sweep_points": n_sweep, "sweep_wall_s": wall, "serial_points": n_serial,
         "serial_wall_s": se["wall_s"], "ratio": r_sweep / r_serial, "time_s": ts,
         "serial_compile_s": ser_compile, "session_span_s": span,
         "serial_interval_per_hour": [lo, hi]}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("_serial")
    s.add_argument("--rows", required=True)
    s.add_argument("--limit-s", type=float, required=True)
    s.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="matmul,attention,softmax")
    ap.add_argument("--slice", default="own")
    ap.add_argument("--budget-s", type=float, default=40.0)
    ap.add_argument("--serial-s", type=float, default=30.0)
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--job-args", default="", help="more arguments for the sweep job")
    ap.add_argument("--from-sweep", default=None, metavar="BOX_DIR",
                    help="take the sweep side from this finished run's summaries and rows")
    args = ap.parse_args()
    if args.cmd == "_serial":
        return serial_main(args)
    if args.from_sweep:
        return from_sweep(Path(args.from_sweep), args.serial_s, Path(args.out))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    tot = {"sweep_n": 0, "sweep_s": 0.0, "serial_n": 0, "serial_s": 0.0}
    print(f"{'kind':12} {'sweep pts':>9} {'sweep s':>8} {'pts/GPU-h':>10} {'serial pts':>10} "
          f"{'serial s':>8} {'pts/GPU-h':>10} {'ratio':>6} {'GPU in timed kernels':>21} "
          f"{'startup/worker/compile-wait/harness s':>38}")
    for kind in [k for k in args.kinds.split(",") if k]:
        sw = run_sweep_job(kind, args.slice, args.budget_s, out, args.job_args.split())
        summ = sw["summary"]
        n_sweep = summ["benched"]
        se = run_serial(sw["rows"], args.serial_s, out, kind)
        n_serial = len(se["points"])
        r_sweep = n_sweep / sw["wall_s"] * 3600
        r_serial = n_serial / se["wall_s"] * 3600 if n_serial else 0.0
        ts = summ["time_s"]
        own = sw["wall_s"] - ts["startup"] - ts["worker"] - ts["compile_wait"]
        busy = ts["timed_kernels"] / sw["wall_s"]
        ser_compile = sum(p.get("compile_s", 0) for p in se["points"])
        tot["sweep_n"] += n_sweep
        tot["sweep_s"] += sw["wall_s"]
        tot["serial_n"] += n_serial
        tot["serial_s"] += se["wall_s"]
        line = {"kind": kind, "sweep_points": n_sweep, "sweep_wall_s": round(sw["wall_s"], 1),
                "sweep_points_per_h": round(r_sweep), "serial_points": n_serial,
                "serial_wall_s": round(se["wall_s"], 1), "serial_points_per_h": round(r_serial),
                "ratio": round(r_sweep / r_serial, 2) if r_serial else None,
                "gpu_timed_fraction": round(busy, 3), "startup_s": ts["startup"],
                "worker_s": ts["worker"], "compile_wait_s": ts["compile_wait"],
                "harness_own_s": round(own, 2), "compiled_ahead": summ["compiled_ahead"],
                "compile_workers": summ["compile_workers"], "remeasured": summ["remeasured"],
                "serial_compile_fraction": round(ser_compile / se["wall_s"], 3),
                "sweep_ok": summ["ok"], "statuses": summ["statuses"]}
        lines.append(line)
        print(f"{kind:12} {n_sweep:9d} {sw['wall_s']:8.1f} {r_sweep:10.0f} {n_serial:10d} "
              f"{se['wall_s']:8.1f} {r_serial:10.0f} {line['ratio'] or 0:6.2f} {busy:21.1%} "
              f"{ts['startup']:>9.1f}/{ts['worker']:.1f}/{ts['compile_wait']:.1f}/{own:.1f}",
              flush=True)
        print(f"{'':12} sweep: {summ['ok']} ok, statuses {summ['statuses']}, compiled ahead "
              f"{summ['compiled_ahead']} by {summ['compile_workers']} processes, re-measured "
              f"{summ['remeasured']}; serial loop: {ser_compile / se['wall_s']:.0%} of its wall "
              "time compiling", flush=True)
        print(f"{'':12} {_phase_line(ts, sw['wall_s'])}", flush=True)
    r_sweep = tot["sweep_n"] / tot["sweep_s"] * 3600
    r_serial = tot["serial_n"] / tot["serial_s"] * 3600 if tot["serial_n"] else 0.0
    ratio = r_sweep / r_serial if r_serial else float("nan")
    print(f"{'all':12} {tot['sweep_n']:9d} {tot['sweep_s']:8.1f} {r_sweep:10.0f} "
          f"{tot['serial_n']:10d} {tot['serial_s']:8.1f} {r_serial:10.0f} {ratio:6.2f}")
    ratios = [ln["ratio"] for ln in lines if ln["ratio"]]
    if ratios:
        print(f"sweep / serial points per GPU-hour: {ratio:.2f}x over all kinds "
              f"(per kind median {statistics.median(ratios):.2f}x, min {min(ratios):.2f}x)")
    (out / "throughput.json").write_text(json.dumps({"kinds": lines, "ratio_all": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
