"""``roofline``: an analytical time estimate from the card, the shape and the knobs.

    time = launches × launch + max(SM time, memory time)

- *SM time*: the busiest SM runs ``ceil(programs / H_sm_count)`` programs, ``resident`` at a
  time (limited by warps and shared memory per SM), in waves.  In a wave every loop
  iteration costs max(resident × one iteration's MMA/ALU time, (DRAM round trip + that
  time) / pipeline stages): co-resident programs and ``num_stages`` hide the latency, and
  once hidden the SM's share of the peak is the limit.  The MMA time counts padded work
  (tiles past the problem's edge) and a tile's efficiency (too small a tile cannot feed the
  tensor cores from shared memory; too many accumulators per thread spill).
- *memory time* = DRAM bytes / (bandwidth × memory-level parallelism × SM utilization):
  tiled kernels re-read operands once per tile row / column (L2 catches part, more with
  GROUP_M); a two-pass row kernel reads its input twice (the second read often from L2);
  too few bytes in flight per SM cannot cover the DRAM latency.

Every constant is a rough Hopper-class figure; what matters is that the estimate moves with
the knobs the way the hardware does, so it ranks the configurations of one shape.  On the
CPU interpreter (no peak, no bandwidth) time is essentially programs × loop iterations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.kinds.base import DTYPE_BYTES
from harness.priors import Row, row_knobs

LAUNCH_US = 2.5  # one kernel launch, host and device side
DRAM_LATENCY_US = 0.7  # one dependent global-memory round trip, with its surrounding work
SMEM_BYTES_PER_CLK = 128.0  # shared-memory bandwidth of one SM
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
TENSOR_CORE_KINDS = ("matmul", "norm_linear", "mlp_geglu", "linear_norm", "attention")
# The interpreter (peak 0): a loop iteration of tl ops costs milliseconds of Python and numpy.
INTERPRET_ITER_US = 3000.0
INTERPRET_ELEM_US = 0.01


def _cdiv(a: float, b: float) -> int:
    return -(-int(a) // max(1, int(b)))


def _num(value: Any, default: float) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


class _Card:
    def __init__(self, f: Mapping[str, Any]) -> None:
        self.sm = max(1, int(_num(f.get("H_sm_count"), 1)))
        self.smem = _num(f.get("H_smem_per_sm"), 228 * 1024) or 228 * 1024
        self.l2 = _num(f.get("H_l2_bytes"), 0.0)
        self.bw = _num(f.get("H_mem_bw_gbs"), 0.0) * 1e9  # B/s
        self.peak16 = _num(f.get("H_peak_fp16_tflops"), 0.0) * 1e12
        self.peak32 = _num(f.get("H_peak_fp32_tflops"), 0.0) * 1e12
        self.interpreter = self.peak32 <= 0 or self.bw <= 0
        # Bytes in flight per SM that hide DRAM latency (Little's law).
        self.inflight_needed = self.bw * DRAM_LATENCY_US * 1e-6 / self.sm


def estimate(features: Mapping[str, Any], knobs: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The estimate for one row's features: ``R_time_us`` and the facts it was built from."""
    f = features
    k = {**{n: v for n, v in f.items() if not n.startswith(("H_", "S_", "C_"))}, **(knobs or {})}
    card = _Card(f)
    kind = str(f.get("S_kind", ""))
    elem = DTYPE_BYTES.get(str(f.get("S_dtype", "")), 2)
    flops = _num(f.get("S_flops"), 0.0)
    nbytes = _num(f.get("S_bytes"), 0.0)
    warps = max(1, int(_num(k.get("num_warps"), 4)))
    stages = max(1, int(_num(k.get("num_stages"), 1)))
    if "BLOCK_M" in k and "BLOCK_N" in k:
        t = _tiled(kind, f, k, card, elem, flops, nbytes, warps, stages)
    else:
        t = _rows(kind, f, k, card, elem, flops, nbytes, warps, stages)
    programs, iters, launches = t["R_programs"], t["R_iters"], t["R_launches"]
    if card.interpreter:
        padded = flops / max(t["R_pad_eff"], 1e-6)
        time = programs * iters * INTERPRET_ITER_US + padded * INTERPRET_ELEM_US
        t.update(R_sm_us=time, R_memory_us=0.0)
    else:
        peak = card.peak16 if kind in TENSOR_CORE_KINDS and elem == 2 else card.peak32
        resident = _resident(card, warps, t["R_smem_block"])
        per_sm = _cdiv(programs, card.sm)  # programs the busiest SM runs
        full, rest = divmod(per_sm, resident)
        # Last-wave quantization: the busiest SM sets the time, the others idle at the end.
        sm_util = programs / (card.sm * per_sm)
        # One loop iteration of one program on the SM's share of the peak: its MMA / ALU time.
        t_iter = flops / max(t["R_pad_eff"], 1e-6) / programs / max(iters, 1) \
            / (peak / card.sm * t["R_mma_eff"]) * 1e6
        pipeline = min(stages, max(1, int(iters)))

        def round_us(blocks: int) -> float:
            # ``blocks`` co-resident programs share the SM; each waits one memory round trip
            # per iteration, which ``pipeline`` stages in flight and the others' work hide.
            return max(blocks * t_iter, (DRAM_LATENCY_US + t_iter) / pipeline)

        sm_time = iters * (full * round_us(resident) + (round_us(rest) if rest else 0.0))
        in_flight = min(resident, per_sm) * t["R_bytes_per_iter"] * pipeline
        mem_eff = min(1.0, in_flight / card.inflight_needed) if card.inflight_needed else 1.0
        # One SM can pull about twice its fair share of DRAM bandwidth.
        memory = t["R_dram_bytes"] / (card.bw * max(mem_eff, 0.02) * min(1.0, 2 * sm_util)) * 1e6
        time = LAUNCH_US * launches + max(sm_time, memory)
        t.update(R_resident=float(resident), R_waves=float(full + (rest > 0)),
                 R_sm_util=sm_util, R_mem_eff=mem_eff, R_sm_us=sm_time, R_memory_us=memory)
    t["R_time_us"] = time
    return t


def _resident(card: _Card, warps: int, smem_block: float) -> int:
    """Programs one SM holds at once: limited by warps, shared memory and the block limit."""
    by_smem = card.smem // smem_block if smem_block > 0 else MAX_BLOCKS_PER_SM
    return max(1, min(MAX_BLOCKS_PER_SM, MAX_WARPS_PER_SM // warps, int(by_smem)))


def _tile_traffic(card: _Card, k: Mapping[str, Any], programs: int, tiles_m: int, tiles_n: int,
                  bm: int, bn: int, kk: int, elem: int, operands: int, resident: int,
                  nbytes: float) -> float:
    """DRAM bytes of a tiled matmul: each wave of co-resident tiles reads the A row panels and
    W column panels it touches once (L2 serves the rest).  GROUP_M orders the tiles so that a
    wave spans GROUP_M tile rows and more columns, rather than whole rows of tiles."""
    if _num(k.get("ROW_PROGRAM"), 0):
        return nbytes + elem * operands * kk * (tiles_n * bn) * max(0, tiles_m - 1) * 0.5
    wave = max(1, min(programs, card.sm * resident))
    group = max(1, int(_num(k.get("GROUP_M"), 1)))
    if group > 1 and wave / group <= tiles_n:
        rows, cols = min(tiles_m, group), min(tiles_n, _cdiv(wave, group))
    elif group > 1:
        rows, cols = min(tiles_m, group * _cdiv(wave, group * tiles_n)), tiles_n
    else:
        rows, cols = min(tiles_m, _cdiv(wave, tiles_n)), min(tiles_n, wave)
    per_wave = elem * kk * (rows * bm + operands * cols * bn)
    return max(nbytes, per_wave * programs / wave + nbytes * 0.2)


def _tiled(kind: str, f: Mapping[str, Any], k: Mapping[str, Any], card: _Card, elem: int,
           flops: float, nbytes: float, warps: int, stages: int) -> dict[str, float]:
    """Tile kernels: matmul and its fusions, and attention (rows = queries, cols = keys)."""
    bm, bn = int(_num(k.get("BLOCK_M"), 64)), int(_num(k.get("BLOCK_N"), 64))
    launches = 1
    if kind == "attention":
        seq, d = int(_num(f.get("S_seq"), 1)), int(_num(f.get("S_head_dim"), 64))
        bh = int(_num(f.get("S_batch"), 1)) * int(_num(f.get("S_heads"), 1))
        m, n, kk, bk = seq, seq, d, d
        programs = _cdiv(seq, bm) * bh
        iters = _cdiv(seq, bn)
        if _num(f.get("S_causal"), 0):
            iters = max(1, (iters + 1) // 2)
        # K and V stream once per query block.
        dram = nbytes + 2.0 * elem * bh * seq * d * max(0, _cdiv(seq, bm) - 1) * 0.5
        smem_block = (bm * d + 2 * stages * bn * d) * elem
        bytes_per_iter = 2.0 * bn * d * elem
    else:
        m, n = int(_num(f.get("S_M"), 1)), int(_num(f.get("S_N"), 1))
        kk = int(_num(f.get("S_K"), 1))
        bk = int(_num(k.get("BLOCK_K"), 32))
        tiles_m, tiles_n = _cdiv(m, bm), _cdiv(n, bn)
        operands = 2 if kind == "mlp_geglu" else 1  # geglu streams a gate and an up weight
        iters = _cdiv(kk, bk) * (2 if _num(k.get("PROLOGUE"), 0) else 1)
        if _num(k.get("ROW_PROGRAM"), 0):
            programs = tiles_m
            iters = _cdiv(kk, bk) * tiles_n + tiles_n  # every N tile, then the rescale pass
        else:
            programs = tiles_m * tiles_n
        smem_block = stages * (bm * bk + operands * bk * bn) * elem
        dram = _tile_traffic(card, k, programs, tiles_m, tiles_n, bm, bn, kk, elem, operands,
                             _resident(card, warps, smem_block), nbytes)
        if kind == "linear_norm" and not _num(k.get("ROW_PROGRAM"), 0):
            dram += 2.0 * elem * m * n  # the second launch reads and rewrites z
            launches = 2
        bytes_per_iter = float((bm + operands * bn) * bk * elem)
    pad = (m / (_cdiv(m, bm) * bm)) * (n / (_cdiv(n, bn) * bn)) * (kk / (_cdiv(kk, bk) * bk))
    # Flops per byte of shared memory a tile achieves, against what keeps the tensor cores fed.
    need = (card.peak16 / card.sm / 1.8e9) / SMEM_BYTES_PER_CLK if card.peak16 else 32.0
    intensity = 2.0 * bm * bn / ((bm + bn) * elem)
    mma = min(1.0, intensity / need)
    acc_per_thread = bm * bn / (32 * warps)
    if acc_per_thread > 96:
        mma /= 1.0 + (acc_per_thread - 96) / 64  # register pressure, spills at the edge
    if acc_per_thread < 8:
        mma *= 0.5 + acc_per_thread / 16  # warps with too little MMA work each
    # The grid's extent along each output dimension (tile rows, tile columns).
    return {"R_tiles_m": float(_cdiv(m, bm)), "R_tiles_n": float(_cdiv(n, bn)),
            "R_programs": float(programs), "R_iters": float(iters), "R_launches": float(launches),
            "R_pad_eff": pad, "R_mma_eff": mma, "R_dram_bytes": dram,
            "R_smem_block": float(smem_block), "R_bytes_per_iter": bytes_per_iter,
            "R_acc_per_thread": acc_per_thread}


def _rows(kind: str, f: Mapping[str, Any], k: Mapping[str, Any], card: _Card, elem: int,
          flops: float, nbytes: float, warps: int, stages: int) -> dict[str, float]:
    """Row kernels (softmax, rms_norm, reduce): programs own ROWS rows and loop over N."""
    m, n = int(_num(f.get("S_M"), 1)), int(_num(f.get("S_N"), 1))
    bn = int(_num(k.get("BLOCK_N"), 128))
    rows = max(1, int(_num(k.get("ROWS"), 1)))
    split = max(1, int(_num(k.get("SPLIT"), 1)))
    chunk = _cdiv(_cdiv(n, split), bn) * bn
    used = _cdiv(n, chunk)
    programs = _cdiv(m, rows) * used
    one_pass = bool(_num(k.get("ONE_PASS"), 0))
    passes = 1 if one_pass or kind == "reduce" else 2
    iters = _cdiv(chunk, bn) * passes
    launches = 2 if used > 1 else 1  # a split reduction folds its partials in a second launch
    dram = nbytes
    if passes == 2:
        # The second pass re-reads the input; what the resident programs hold fits in L2
        # (a program of a split row holds its chunk of the row).
        live = min(programs, card.sm * 4) * rows * min(chunk, n) * elem
        dram += m * n * elem * (0.3 if card.l2 and live < card.l2 else 1.0)
    if used > 1:
        dram += 2.0 * 4 * m * used
    pad = (n / (_cdiv(n, bn) * bn)) * (m / (_cdiv(m, rows) * rows))
    per_thread = rows * bn / (32 * warps)
    # Too few elements per thread: narrow loads and idle lanes; too many: register pressure.
    lane = min(1.0, per_thread / 4.0) * (1.0 / (1.0 + max(0.0, per_thread - 64) / 64))
    return {"R_tiles_m": float(_cdiv(m, rows)), "R_tiles_n": float(_cdiv(n, bn)),
            "R_programs": float(programs), "R_iters": float(iters), "R_launches": float(launches),
            "R_pad_eff": pad, "R_mma_eff": max(lane, 0.05), "R_dram_bytes": dram,
            "R_smem_block": 0.0, "R_bytes_per_iter": float(rows * bn * elem) * lane,
            "R_acc_per_thread": per_thread}


class RooflinePrior:
    """Scores a row by its :func:`estimate` in µs (lower = predicted faster)."""

    name = "roofline"
    learns = False
    unit = "us"

    def fit(self, train_rows: Sequence[Row]) -> None:
        pass

    def score(self, rows: Sequence[Row]) -> list[float]:
        return [estimate(r.get("features") or {}, row_knobs(r))["R_time_us"] for r in rows]
