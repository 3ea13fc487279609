"""Measure one point: compile, check against the torch reference, then time A/B.

Runs inside the bench worker (``python -m harness.box worker``), a child of the sweep, so a
kernel that breaks the CUDA context ends only the worker.  The worker reads one JSON request
per line on stdin and answers one JSON result per line on stdout.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from harness import kinds as registry
from harness.box import process_age_s
from harness.contract import ToolsSpec
from harness.shipped import BASELINE_KNOB

# Errors after which the CUDA context cannot be trusted: the worker answers and exits.
_CONTEXT_FATAL = ("illegal memory access", "unspecified launch failure", "misaligned address",
                  "illegal instruction", "device-side assert", "CUDA error: an illegal",
                  "cudaErrorLaunchFailure", "context is destroyed")
EXIT_CONTEXT_LOST = 3
# the phases of one timing (``Bencher._time_ab``), in ``Bencher.phase_s``
_TIMING_PHASES = ("warmup", "guard_calibration", "timed")


class Bencher:
    """Holds the inputs of the current shape and measures configurations of it."""

    def __init__(self, device: str, warmup: int, iters: int, seed: int = 0,
                 max_cv: float = ToolsSpec.max_cv, remeasure: int = ToolsSpec.remeasure) -> None:
        self.device = device
        self.warmup = warmup
        self.iters = iters
        self.seed = seed
        self.max_cv = max_cv  # a point whose timed calls vary more than this is timed again
        self.remeasure = remeasure  # ... at most this many more times
        self._cycles_us: float | None = None
        self._calibration: tuple[Any, Any] | None = None  # an event pair not read yet
        self._calibrated_at = 0.0
        self._flush_us: float | None = None
        self._host_us: list[float] = []
        self.guard_us = 0.0
        self._shape_key: str | None = None
        self._cache: OrderedDict[str, tuple[dict[str, Any], Any, int]] = OrderedDict()
        self.inputs_made = 0
        self._inputs: dict[str, Any] = {}
        self._ref: Any = None
        self._flush: Any = None
        self.phase_s: dict[str, float] = dict.fromkeys(_TIMING_PHASES, 0.0)

    def start(self) -> float:
        """Import torch and Triton and start the CUDA context now, before the first point
        arrives (the sweep starts its worker early, so this overlaps the first compiles);
        returns the seconds since the process started."""
        import torch
        import triton  # noqa: F401

        if self.device != "cpu":
            torch.cuda.init()
            self._flush_buffer()
            torch.cuda.synchronize()
        return round(process_age_s(), 3)

    # -- inputs -------------------------------------------------------------------------------
    # A sweep draws each batch's shape anew, so a job goes back and forth between a handful of
    # shapes: their inputs and reference outputs are kept (least recently used dropped first)
    # up to ``INPUT_CACHE_FRACTION`` of the device's memory, instead of being made again.
    INPUT_CACHE_FRACTION = 0.25

    def _load_shape(self, kind_name: str, shape: dict[str, Any]) -> None:
        key = json.dumps([kind_name, shape], sort_keys=True)
        if key == self._shape_key:
            return
        if key in self._cache:
            self._cache.move_to_end(key)
            self._inputs, self._ref, _ = self._cache[key]
            self._shape_key = key
            return
        import torch

        self._inputs, self._ref, self._shape_key = {}, None, None
        kind = registry.get(kind_name)
        inputs = kind.make_inputs(shape, self.device, self.seed)
        ref = kind.reference(shape, inputs)
        size = sum(t.numel() * t.element_size() for t in [*inputs.values(), ref]
                   if isinstance(t, torch.Tensor))
        self._cache[key] = (inputs, ref, size)
        self.inputs_made += 1
        limit = self._cache_limit()
        while len(self._cache) > 1 and sum(v[2] for v in self._cache.values()) > limit:
            self._cache.popitem(last=False)
            if self.device != "cpu":
                torch.cuda.empty_cache()
        self._inputs, self._ref, self._shape_key = inputs, ref, key

    def _cache_limit(self) -> float:
        if self.device == "cpu":
            return 2 * 2**30
        import torch

        return torch.cuda.get_device_properties(0).total_memory * self.INPUT_CACHE_FRACTION

    def _flush_buffer(self) -> Any:
        if self._flush is None and self.device != "cpu":
            import torch

            l2 = torch.cuda.get_device_properties(0).L2_cache_size or 64 * 2**20
            self._flush = torch.empty(max(2 * l2, 64 * 2**20) // 4, dtype=torch.int32,
                                      device=self.device)
        return self._flush

    # -- one point ----------------------------------------------------------------------------
    def measure(self, req: dict[str, Any]) -> dict[str, Any]:
        kind = registry.get(req["kind"])
        shape, knobs = req["shape"], req["knobs"]
        res: dict[str, Any] = {"status": "error", "value_us": None, "ref_us": None,
                               "variance": None, "n_samples": None, "error": None,
                               "compile_s": None, "bench_s": None, "compile": {},
                               "first_launch_s": None, "cv": None, "remeasured": 0}
        ahead = req.get("compiled_ahead")
        # where the worker's time on this point went (seconds by phase; summed by the job)
        self.phase_s = phase = {"prepare": 0.0, "first_launch": 0.0, "check": 0.0,
                                "warmup": 0.0, "guard_calibration": 0.0, "timed": 0.0,
                                "remeasure": 0.0}
        t = time.perf_counter()
        try:
            self._load_shape(req["kind"], shape)
            base = knobs.get(BASELINE_KNOB)
            launch = (kind.baseline(base, shape, self._inputs) if base
                      else kind.prepare(knobs, shape, self._inputs))
            # the output buffer is shared by every point of the shape: a kernel that leaves any
            # of it unwritten must not pass on an earlier point's result
            if launch.out is not None and launch.out.is_floating_point():
                launch.out.fill_(float("nan"))
            t0 = time.perf_counter()
            phase["prepare"] = t0 - t
            handle = launch.run()  # first launch compiles
            self._sync()
            res["first_launch_s"] = round(time.perf_counter() - t0, 4)
            phase["first_launch"] = time.perf_counter() - t0
            # compiled in the pool: the first launch only loaded it from Triton's cache
            res["compile_s"] = (ahead["compile_s"] if ahead and "error" not in ahead
                                else res["first_launch_s"])
            res["compile"] = _compile_facts(handle)
            t = time.perf_counter()
            atol, rtol = kind.tolerance(shape.get("dtype", "fp32"))
            if base:  # torch's ops in the input dtype round where the fp32 reference does not
                atol, rtol = BASELINE_SLACK * atol, BASELINE_SLACK * rtol
            err = _mismatch(launch.out, self._ref, atol, rtol)
            phase["check"] = time.perf_counter() - t
            if err:
                res.update(status="bench_fail", error=err)
                return res
            t1 = time.perf_counter()
            cand, ref = self._time_ab(launch.run, lambda: kind.reference(shape, self._inputs))
            cv = _cv(cand)
            # noise policy: a point timed in a noisy window is timed again (bounded); the
            # quietest window's samples are kept
            first = dict(phase)
            while (_noisy(cand, cv, self.max_cv)
                   and res["remeasured"] < self.remeasure):
                res["remeasured"] += 1
                again = self._time_ab(launch.run, lambda: kind.reference(shape, self._inputs))
                if _cv(again[0]) < cv:
                    (cand, ref), cv = again, _cv(again[0])
            if res["remeasured"]:  # the timings after the first are counted as re-measuring
                phase["remeasure"] = sum(phase[k] - first[k] for k in _TIMING_PHASES)
                phase.update({k: first[k] for k in _TIMING_PHASES})
            res["bench_s"] = round(time.perf_counter() - t1, 4)
            res.update(status="ok", value_us=statistics.median(cand), ref_us=statistics.median(ref),
                       variance=statistics.variance(cand) if len(cand) > 1 else 0.0,
                       n_samples=len(cand), cv=round(cv, 5), guard_us=round(self.guard_us, 1))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a row, never a crash
            res.update(_classify(exc))
        return res

    def _sync(self) -> None:
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize()

    # -- the launch-gap guard ---------------------------------------------------------------
    # A timed call is recorded between two CUDA events.  When the GPU finishes the L2 flush
    # before Python has launched the kernel (a few µs of kernel, tens of µs of launch), the
    # start event fires early and the launch latency is timed too: small kernels then read
    # slower than they are, by an amount that varies with the CPU's load.  So the GPU is kept
    # busy (``torch.cuda._sleep``) for a few times the host's launch time before each start
    # event: by the time the event fires, the kernel is already queued behind it.  The L2
    # flush before it already keeps the GPU busy for a while, so the guard covers only the rest
    # of twice the host's launch time; candidate and reference each get their own.
    CALIBRATION_CYCLES = 200_000  # about 0.1 ms of busy-wait: the event pair resolves ~0.5 µs
    GUARD_MIN_US = 10.0
    GUARD_SLACK_US = 20.0  # the host's enqueueing of the flush, the guard and the start event

    CALIBRATE_EVERY_S = 1.0  # the SM clock moves slowly: a new reading at most this often

    def _cycles_per_us(self) -> float:
        """SM cycles per µs: a known busy-wait between two events.  The pair is read once it
        has run, without waiting for it (the host never stalls on the GPU for this); a new one
        is queued at most every ``CALIBRATE_EVERY_S``.  Only the first reading is waited for."""
        import torch

        pending = self._calibration
        if pending is not None and pending[1].query():
            a, b = pending
            self._cycles_us = self.CALIBRATION_CYCLES / max(a.elapsed_time(b) * 1e3, 1e-3)
            self._calibration = None
        now = time.perf_counter()
        if self._calibration is None and (self._cycles_us is None
                                          or now - self._calibrated_at > self.CALIBRATE_EVERY_S):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)
            a.record()
            torch.cuda._sleep(self.CALIBRATION_CYCLES)
            b.record()
            self._calibration, self._calibrated_at = (a, b), now
        if self._cycles_us is None:  # the first reading: waited for
            torch.cuda.synchronize()
            return self._cycles_per_us()
        return self._cycles_us

    def _flush_time_us(self) -> float:
        """The GPU's time for one L2 flush (µs; measured once)."""
        if self._flush_us is None:
            import torch

            flush = self._flush_buffer()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(6)]
            for e in ev:
                e.record()
                flush.zero_()
            torch.cuda.synchronize()
            self._flush_us = statistics.median(a.elapsed_time(b) * 1e3 for a, b in itertools.pairwise(ev))
        return self._flush_us

    def _guard_cycles(self) -> tuple[int, int]:
        """Cycles of GPU busy-wait before the candidate's and the reference's timed calls:
        twice each one's host launch time plus ``GUARD_SLACK_US``, less the flush's own time,
        within [``GUARD_MIN_US``, 1 ms]; 0 where ``torch.cuda._sleep`` is missing.
        ``guard_us`` keeps the larger."""
        self.guard_us = 0.0
        if not self._host_us:
            return 0, 0
        try:
            per_us = self._cycles_per_us()
        except (AttributeError, RuntimeError):
            return 0, 0
        flush_us = self._flush_time_us()
        us = [min(1000.0, max(self.GUARD_MIN_US, 2 * h + self.GUARD_SLACK_US - flush_us))
              for h in self._host_us]
        self.guard_us = max(us)
        return int(us[0] * per_us), int(us[1] * per_us)

    def _busy(self, cycles: int) -> None:
        if cycles:
            import torch

            torch.cuda._sleep(cycles)

    def _time_ab(self, cand: Callable[[], Any], ref: Callable[[], Any]) -> tuple[list[float], list[float]]:
        """Candidate and reference interleaved, L2 flushed before each timed call (µs).  Its
        wall time is added to ``phase_s`` by phase."""
        t0 = time.perf_counter()
        host_c, host_r = [], []
        for _ in range(self.warmup):
            t = time.perf_counter()
            cand()
            host_c.append((time.perf_counter() - t) * 1e6)
            t = time.perf_counter()
            ref()
            host_r.append((time.perf_counter() - t) * 1e6)
        # the host's time to launch each call (its median over the warm-up)
        self._host_us = ([statistics.median(host_c), statistics.median(host_r)]
                         if host_c else [])
        t1 = time.perf_counter()
        self.phase_s["warmup"] += t1 - t0
        if self.device == "cpu":
            c_us, r_us = [], []
            for _ in range(self.iters):
                t = time.perf_counter()
                cand()
                c_us.append((time.perf_counter() - t) * 1e6)
                t = time.perf_counter()
                ref()
                r_us.append((time.perf_counter() - t) * 1e6)
            self.phase_s["timed"] += time.perf_counter() - t1
            return c_us, r_us
        import torch

        flush = self._flush_buffer()
        guard_c, guard_r = self._guard_cycles()
        t2 = time.perf_counter()
        self.phase_s["guard_calibration"] += t2 - t1
        ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(self.iters)]
        # no wait for the warm-up calls to drain: the timed calls queue behind them (a start
        # event fires only after the flush and the guard before it)
        for e in ev:
            flush.zero_()
            self._busy(guard_c)
            e[0].record()
            cand()
            e[1].record()
            flush.zero_()
            self._busy(guard_r)
            e[2].record()
            ref()
            e[3].record()
        torch.cuda.synchronize()
        self.phase_s["timed"] += time.perf_counter() - t2
        return ([e[0].elapsed_time(e[1]) * 1e3 for e in ev],
                [e[2].elapsed_time(e[3]) * 1e3 for e in ev])


# A baseline's result may be this many times further from the fp32 reference than a kernel's
# (torch's ops in the input dtype round their intermediates)
BASELINE_SLACK = 4.0

# A spread of the timed calls under this (twice the resolution of CUDA's event timer) is at
# the limit of what the events can time: timing such a point again does not narrow it.
NOISE_FLOOR_US = 1.0


def _noisy(samples: list[float], cv: float, max_cv: float) -> bool:
    """The noise policy's test: a coefficient of variation above ``max_cv`` whose spread is
    also above the timer's floor."""
    return cv > max_cv and cv * statistics.fmean(samples) > NOISE_FLOOR_US


def _cv(samples: list[float]) -> float:
    """Coefficient of variation of timed calls (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / mean if mean > 0 else 0.0


def _compile_facts(handle: Any) -> dict[str, Any]:
    """Registers, spills and shared memory of the compiled kernel (none under the interpreter)."""
    if handle is None:
        return {}
    facts = {}
    for name, attr in (("C_n_regs", "n_regs"), ("C_n_spills", "n_spills")):
        v = getattr(handle, attr, None)
        if isinstance(v, int):
            facts[name] = v
    shared = getattr(getattr(handle, "metadata", None), "shared", None)
    if isinstance(shared, int):
        facts["C_shared_bytes"] = shared
    return facts


def _mismatch(out: Any, ref: Any, atol: float, rtol: float) -> str | None:
    import torch

    o, r = out.float(), ref.float()
    if o.shape != r.shape:
        return f"wrong result: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
    if not torch.isfinite(o).all():
        return "wrong result: non-finite values"
    diff = (o - r).abs()
    bad = diff > atol + rtol * r.abs()
    if bool(bad.any()):
        return (f"wrong result: {int(bad.sum())}/{bad.numel()} elements off, "
                f"max abs err {float(diff.max()):.3g} (atol {atol}, rtol {rtol})")
    return None


def _classify(exc: BaseException) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}"
    names = {c.__name__ for c in type(exc).__mro__}
    if any(s in text for s in _CONTEXT_FATAL):
        return {"status": "crash", "error": text[:2000], "fatal": True}
    if names & {"OutOfResources", "CompilationError", "CompileTimeAssertionFailure"}:
        return {"status": "bench_fail", "error": text[:2000]}
    if "out of memory" in text.lower():
        return {"status": "bench_fail", "error": text[:2000]}
    tb = "".join(traceback.format_exception(exc)[-3:])
    return {"status": "error", "error": (text + "\n" + tb)[:2000]}


def serve(device: str, warmup: int, iters: int, seed: int, max_cv: float,
          remeasure: int) -> int:
    """The worker loop: one request line in, one result line out, until stdin closes."""
    bencher = Bencher(device, warmup, iters, seed, max_cv=max_cv, remeasure=remeasure)
    ready_s: float | None = bencher.start()
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        res = bencher.measure(req)
        res["phase_s"] = {k: round(v, 5) for k, v in bencher.phase_s.items()}
        if ready_s is not None:  # the first answer says how long the worker took to start
            res["worker_ready_s"], ready_s = ready_s, None
        fatal = res.pop("fatal", False)
        for k in ("value_us", "ref_us", "variance", "cv"):
            if isinstance(res.get(k), float) and not math.isfinite(res[k]):
                res[k] = None
        out.write(json.dumps(res) + "\n")
        out.flush()
        if fatal:
            return EXIT_CONTEXT_LOST
    return 0
