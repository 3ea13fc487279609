"""The kernels' copy-engine paths against torch's op on the golden shapes of the live GPU.

For every golden shape of the matmul-like kinds and attention (or the kinds named), a small
grid of tiles is run on each path the card realizes (GEMM template: pointers; TMA; TMA +
persistent; TMA + persistent + subtiled epilogue; on a 9.x card the warp-specialized Gluon
GEMM's two forms; attention: pointers; TMA), checked against the fp32 reference with the
kind's tolerance, and timed with ``triton.testing.do_bench``
(median) beside torch's own op (cuBLAS for the linears, SDPA for attention) and, with
``--compile``, torch.compile's kernel (max-autotune).  Prints one line per shape (the best
configuration of each path over torch's time) and writes every measurement as JSON lines to
``--out``.

    python bench/kernel_paths.py [--kinds matmul,attention] [--paths tma_persistent,gluon]
                                 [--compile] [--out paths.jsonl]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("matmul", "norm_linear", "mlp_geglu", "linear_norm", "attention")
PATHS = {"ptr": {"TMA": 0, "PERSISTENT": 0, "SUBTILE": 0},
         "tma": {"TMA": 1, "PERSISTENT": 0, "SUBTILE": 0},
         "tma_persistent": {"TMA": 1, "PERSISTENT": 1, "SUBTILE": 0},
         "tma_persistent_subtile": {"TMA": 1, "PERSISTENT": 1, "SUBTILE": 1},
         "gluon": {"TMA": 1, "PERSISTENT": 1, "SUBTILE": 0, "GLUON": 1},
         "gluon_coop": {"TMA": 1, "PERSISTENT": 1, "SUBTILE": 0, "GLUON": 2}}
# the Gluon GEMM's own grids: two consumer warpgroups (8 warps), each holding a whole tile's
# accumulator in ping-pong (BLOCK_M * BLOCK_N at most 128 * 128), half of it if cooperative
GLUON_TILES = {"gluon": [(128, 128, 64, 8, 8, 4), (128, 128, 64, 8, 8, 5),
                         (64, 256, 64, 8, 8, 4), (128, 128, 32, 8, 8, 5)],
               "gluon_coop": [(128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3),
                              (128, 256, 32, 8, 8, 4), (128, 128, 64, 8, 8, 5),
                              (128, 256, 64, 4, 8, 3), (128, 256, 64, 16, 8, 3)]}
GLUON_KINDS = ("matmul", "norm_linear", "linear_norm")
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
PREFILL_TILES = [(128, 256, 64, 8, 8, 3), (128, 128, 64, 8, 4, 4), (128, 256, 64, 8, 8, 4),
                 (128, 128, 128, 8, 8, 3), (256, 128, 64, 8, 8, 3), (64, 256, 64, 8, 4, 4)]
# mlp_geglu holds two B tiles and two accumulators: the 128x256 tiles do not fit its card
GEGLU_PREFILL_TILES = [(128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (64, 128, 64, 8, 4, 4),
                       (128, 64, 64, 8, 4, 4), (128, 128, 32, 8, 8, 4), (64, 256, 64, 8, 8, 3)]
DECODE_TILES = [(16, 64, 128, 1, 4, 4), (16, 128, 128, 1, 4, 4), (16, 32, 256, 1, 4, 3),
                (16, 64, 256, 1, 4, 4), (16, 128, 64, 1, 4, 6)]
# (BLOCK_M, BLOCK_N, num_warps, num_stages); a tile a head_dim cannot hold is unrealizable
ATTENTION_TILES = [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3),
                   (128, 64, 4, 3), (128, 128, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2),
                   (128, 32, 4, 4), (256, 64, 8, 2)]
ATTENTION_PATHS = {"ptr": {"TMA": 0}, "tma": {"TMA": 1}}
OWN = {"norm_linear": [{"PROLOGUE": 0}, {"PROLOGUE": 1}, {"PROLOGUE": 2}], "linear_norm": [{"ROW_PROGRAM": 0}]}


def path_of(kind_name: str, knobs: dict) -> str:
    table = ATTENTION_PATHS if kind_name == "attention" else PATHS
    return next(p for p, v in table.items()
                if all(knobs.get(k, 0) == v.get(k, 0) for k in ("TMA", "PERSISTENT", "SUBTILE",
                                                                "GLUON")))


def candidates(kind_name: str, shape: dict, only: set[str] | None = None) -> list[dict]:
    """The grid of ``kind_name`` on ``shape``: every path's (or those in ``only``)."""
    if kind_name == "attention":
        return [{"BLOCK_M": bm, "BLOCK_N": bn, **path, "num_warps": w, "num_stages": s}
                for (bm, bn, w, s), (name, path) in itertools.product(ATTENTION_TILES,
                                                                       ATTENTION_PATHS.items())
                if not only or name in only]
    tiles = (DECODE_TILES if shape["M"] <= 64 else
             GEGLU_PREFILL_TILES if kind_name == "mlp_geglu" else PREFILL_TILES)
    out = []
    for name, path in PATHS.items():
        if only and name not in only:
            continue
        if name in GLUON_TILES:
            if kind_name not in GLUON_KINDS or shape["M"] <= 64:
                continue
            owns = [{"PROLOGUE": 2}] if kind_name == "norm_linear" else OWN.get(kind_name, [{}])
            grid = GLUON_TILES[name]
        else:
            owns, grid = OWN.get(kind_name, [{}]), tiles
        for (bm, bn, bk, gm, w, s), own in itertools.product(grid, owns):
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": gm, **own,
                        **path, "num_warps": w, "num_stages": s})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--compile", action="store_true",
                    help="also time torch.compile's kernel (max-autotune) on each shape")
    ap.add_argument("--shapes", default="", help="only shape ids containing this text")
    ap.add_argument("--paths", default="", help="only these paths (comma-separated): "
                    + ", ".join(sorted({*PATHS, *ATTENTION_PATHS})))
    ap.add_argument("--out", default="kernel_paths.jsonl")
    args = ap.parse_args()

    import torch
    from triton.testing import do_bench

    from harness import goldens
    from harness import kinds as registry
    from harness.box.bench import _mismatch
    from harness.box.probe import probe
    from harness.cards import DEPLOYABLE, card_from_probe
    from harness.points import make_spec

    only = set(filter(None, args.paths.split(",")))
    if unknown := only - {*PATHS, *ATTENTION_PATHS}:
        ap.error(f"unknown paths {sorted(unknown)}; paths: "
                 + ", ".join(sorted({*PATHS, *ATTENTION_PATHS})))
    card = card_from_probe(probe())
    print(f"card {card.name} cc {card.cc}", flush=True)
    from harness.box.compiler import CompilePool, default_workers

    todo = [(kind_name, g, knobs) for kind_name in args.kinds.split(",")
            for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name]) if args.shapes in g.shape_id
            for knobs in candidates(kind_name, g.shape, only)
            if not registry.get(kind_name).unrealizable(knobs, g.shape, card)]
    compiler = CompilePool(default_workers(), target=("cuda", card.cc[0] * 10 + card.cc[1], 32))
    for kind_name, g, knobs in todo:  # compiled ahead on the box's cores, in measuring order
        compiler.submit(f"{g.shape_id}/{make_spec(knobs)}", kind_name, g.shape, knobs)
    print(f"{len(todo)} configurations, compiling on {compiler.workers} cores", flush=True)
    out = open(args.out, "w")
    summary = []
    t_start = time.time()
    for kind_name in args.kinds.split(","):
        kind = registry.get(kind_name)
        for g in goldens.shapes(DEPLOYABLE, kinds=[kind_name]):
            if args.shapes not in g.shape_id:
                continue
            inputs = kind.make_inputs(g.shape, "cuda", 0)
            ref = kind.reference(g.shape, inputs)
            atol, rtol = kind.tolerance(g.shape["dtype"])
            torch_us = 1e3 * do_bench(functools.partial(kind.torch_op, g.shape, inputs),
                                      return_mode="median")  # do_bench answers in ms
            compile_us = None
            if args.compile:
                try:
                    compiled = kind.baseline("compile", g.shape, inputs)
                    compiled.run()  # compiles (max-autotune) on its first launch
                    compile_us = 1e3 * do_bench(compiled.run, return_mode="median")
                except Exception as exc:  # noqa: BLE001 - a baseline that fails is reported
                    print(f"{g.shape_id}: torch.compile failed: {type(exc).__name__}: "
                          f"{str(exc)[:200]}", flush=True)
            best: dict[str, tuple[float, str]] = {}
            wrong = 0
            for knobs in candidates(kind_name, g.shape, only):
                if kind.unrealizable(knobs, g.shape, card):
                    continue
                path = path_of(kind_name, knobs)
                compiler.wait(f"{g.shape_id}/{make_spec(knobs)}", 600)
                rec = {"kind": kind_name, "shape_id": g.shape_id, "spec": make_spec(knobs),
                       "path": path, "torch_us": torch_us, "compile_us": compile_us}
                try:
                    launch = kind.prepare(knobs, g.shape, inputs)
                    launch.out.fill_(float("nan"))
                    launch.run()
                    torch.cuda.synchronize()
                    err = _mismatch(launch.out, ref, atol, rtol)
                    if err:
                        wrong += 1
                        rec.update(status="wrong", error=err)
                    else:
                        us = 1e3 * do_bench(launch.run, return_mode="median")
                        rec.update(status="ok", us=us)
                        if path not in best or us < best[path][0]:
                            best[path] = (us, rec["spec"])
                except Exception as exc:  # noqa: BLE001 - a failing configuration is a row
                    rec.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:300]}")
                out.write(json.dumps(rec) + "\n")
                out.flush()
            line = {p: round(best[p][0] / torch_us, 3) for p in best}
            if not best:
                print(f"{g.shape_id:52} torch {torch_us:9.1f} us  no configuration of the grid "
                      "ran on this card (see --out for why)", flush=True)
            vs_compile = (round(min(b[0] for b in best.values()) / compile_us, 3)
                          if compile_us and best else None)
            summary.append((kind_name, g.shape_id, torch_us, line, wrong, vs_compile))
            print(f"{g.shape_id:52} torch {torch_us:9.1f} us  " + "  ".join(
                f"{p} {r:.3f}" for p, r in line.items())
                + (f"  best/compile {vs_compile:.3f}" if vs_compile else "")
                + (f"  WRONG {wrong}" if wrong else ""), flush=True)
            inputs = ref = None
            torch.cuda.empty_cache()
    print(f"done in {time.time() - t_start:.0f} s")
    for kind_name in args.kinds.split(","):
        ratios = [min(r.values()) for k, _, _, r, _, _ in summary if k == kind_name and r]
        if ratios:
            print(f"{kind_name:12} best path over torch: median {statistics.median(ratios):.3f} "
                  f"max {max(ratios):.3f} over {len(ratios)} shapes")
        over = [c for k, _, _, _, _, c in summary if k == kind_name and c]
        if over:
            print(f"{kind_name:12} best path over torch.compile: median "
                  f"{statistics.median(over):.3f} max {max(over):.3f} over {len(over)} shapes")
        wrong = sum(w for k, _, _, _, w, _ in summary if k == kind_name)
        print(f"{kind_name:12} wrong results: {wrong}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
