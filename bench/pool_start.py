"""How soon a job's first compiles land: compile-pool variants side by side, in one run.

    python bench/pool_start.py [--workers 14] [--points 28] [--kind rms_norm]

Run on the box (a real GPU).  Each variant starts a fresh pool with its own copy of one seeded
Triton cache (Triton's helper modules built, no kernel of the sample), submits the same sample
of the kind's points at once, as a job does after its planning, and waits for every answer:

- ``cold``: processes start on the first point;
- ``warm``: ``warm()`` at creation, each process compiling a first kernel (Triton asks CUDA for
  the target);
- ``warm+target``: the same, the target given from NVML (no CUDA in the pool processes).

It prints per variant the seconds from the pool's creation to the first submitted point's
answer and to the last answer, the median and worst compile of the sample, and errors; then, for ``warm+target``, that a
fresh bench worker loads a sample point from the cache instead of compiling it
(``first_launch_s``).  ``--delay-s`` (default 5) waits between creation and the submissions, as
the probe and planning do in a job.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEED = """
import torch, triton, triton.language as tl
@triton.jit
def _seed(x, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), tl.arange(0, BLOCK))
x = torch.empty(64, device="cuda", dtype=torch.int32)
_seed[(1,)](x, BLOCK=64)
torch.cuda.synchronize()
"""

LOAD = """
import json, sys
from harness.box.bench import Bencher
b = Bencher("cuda", 1, 3, remeasure=0)
for line in sys.stdin:
    p = json.loads(line)
    r = b.measure(p)
    print(json.dumps({"status": r["status"], "first_launch_s": r.get("first_launch_s"),
                      "compile_s": r.get("compile_s")}), flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--points", type=int, default=28)
    ap.add_argument("--kind", default="rms_norm")
    ap.add_argument("--delay-s", type=float, default=5.0)
    args = ap.parse_args()

    from harness import kinds as registry
    from harness import pools
    from harness.box.compiler import CompilePool
    from harness.box.gpustate import compute_capability
    from harness.box.probe import probe
    from harness.cards import card_from_probe

    card = card_from_probe(probe())
    pool = pools.build(card, kinds=[args.kind])
    pts = [p for s in ("own", "tail") for p in pool.points(s, args.kind)]
    sample = pts[:: max(1, len(pts) // args.points)][: args.points]
    cc = compute_capability()
    if cc is None:
        raise SystemExit("NVML gave no compute capability: run this on the GPU box")
    print(f"{card.name}: compute capability {cc}; {len(sample)} {args.kind} points over "
          f"{len({p.shape_id for p in sample})} shapes; {args.workers} compile processes")
    tmp = Path(tempfile.mkdtemp(prefix="pool-start-"))
    seeded = tmp / "seed"
    env = dict(os.environ, TRITON_CACHE_DIR=str(seeded))
    seed_py = tmp / "seed_kernel.py"  # Triton reads a jit function's source from its file
    seed_py.write_text(SEED)
    subprocess.run([sys.executable, str(seed_py)], env=env, check=True)
    registry.get(args.kind)  # imported here, not timed
    variants = [("cold", False, None), ("warm", True, None), ("warm+target", True, ("cuda", cc, 32))]
    results = {}
    for name, warm, target in variants:
        cache = tmp / name
        shutil.copytree(seeded, cache)
        os.environ["TRITON_CACHE_DIR"] = str(cache)
        t0 = time.monotonic()
        cp = CompilePool(args.workers, target=target)
        if warm:
            cp.warm()
        time.sleep(args.delay_s)
        for p in sample:
            cp.submit(p.key, p.kind, p.shape, p.knobs)
        answers, landed = [], []
        for p in sample:
            a = cp.wait(p.key, 300)
            landed.append(time.monotonic() - t0)
            answers.append(a or {"error": "no answer"})
        cp.close()
        comp = [a["compile_s"] for a in answers if "compile_s" in a]
        errors = [a["error"] for a in answers if "error" in a]
        results[name] = {"first_s": landed[0], "last_s": max(landed),
                         "median_compile_s": statistics.median(comp) if comp else None,
                         "worst_compile_s": max(comp) if comp else None, "errors": len(errors)}
        print(f"{name:12} first point {landed[0]:6.2f}s, all in {max(landed):6.2f}s after the "
              f"pool's creation; compile median {results[name]['median_compile_s']:.2f}s, worst "
              f"{results[name]['worst_compile_s']:.2f}s; errors {len(errors)}"
              + (f" (e.g. {errors[0][:160]})" if errors else ""), flush=True)
    # a fresh worker on the warm+target cache: loads, does not compile
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp / "warm+target"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    req = "".join(json.dumps({"kind": p.kind, "shape": p.shape, "knobs": p.knobs}) + "\n"
                  for p in sample[:6])
    out = subprocess.run([sys.executable, "-c", LOAD], input=req, env=env, capture_output=True,
                         text=True, timeout=600)
    loads = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    print("worker on the warm+target cache (first launch s, status): "
          + ", ".join(f"{r['first_launch_s']:.3f} {r['status']}" for r in loads if r["first_launch_s"] is not None)
          + (f"\n{out.stderr[-800:]}" if out.returncode else ""))
    results["worker_first_launch_s"] = [r["first_launch_s"] for r in loads]
    print(json.dumps(results))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
