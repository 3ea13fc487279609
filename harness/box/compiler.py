"""Compile ahead of the GPU: the coming points compile in a process pool on the box's CPU cores.

Each pool process configures a point's kernel exactly as the bench worker will (same kind
code, same shape, same knobs) but on storage-free ``meta`` tensors, and asks Triton to compile
it without launching (``warmup=True``).  The compiled kernel lands in Triton's on-disk cache,
which the pool and the bench worker share (the same ``TRITON_CACHE_DIR``), so the worker's first
launch of that point only loads it.  Nothing here launches on the GPU; given the target (the
compute capability, read through NVML), the pool processes do not even start CUDA.  Nothing
here decides a point's status: a compile that fails, hangs or is not done in time is simply
compiled again by the worker, which classifies the failure as it always does.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

# A compile answer: {"compile_s": float} or {"compile_s": float, "error": "..."}
CompileFn = Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]]


def default_workers() -> int:
    """CPU cores this process may use, less the sweep's own and its bench worker's (at most 16)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(1, min(16, cores - 2))


@contextlib.contextmanager
def _compile_only() -> Iterator[None]:
    """``kernel[grid](...)`` compiles and returns without launching; ``torch.randn`` makes
    storage-free tensors (a kind's inputs are random; only their shapes, strides and dtypes
    reach the compiler)."""
    import torch
    from triton.runtime.jit import JITFunction

    def getitem(self: Any, grid: Any) -> Any:
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=True, **kwargs)

    def randn(*size: Any, generator: Any = None, **kw: Any) -> Any:
        if len(size) == 1 and isinstance(size[0], (tuple, list)):
            size = tuple(size[0])
        kw["device"] = "meta"
        return torch.empty(*size, **kw)

    saved_getitem, saved_randn = JITFunction.__getitem__, torch.randn
    JITFunction.__getitem__, torch.randn = getitem, randn  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        JITFunction.__getitem__, torch.randn = saved_getitem, saved_randn  # type: ignore[method-assign]


_INPUTS: dict[str, Any] = {}


def compile_point(kind_name: str, shape: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """Compile one point into Triton's cache; runs in a pool process."""
    import json

    from harness import kinds as registry

    t0 = time.perf_counter()
    try:
        kind = registry.get(kind_name)
        with _compile_only():
            key = json.dumps([kind_name, shape], sort_keys=True)
            if key not in _INPUTS:
                _INPUTS.clear()
                _INPUTS[key] = kind.make_inputs(shape, "meta", 0)
            kind.prepare(knobs, shape, _INPUTS[key]).run()
    except Exception as exc:  # noqa: BLE001 - the bench worker compiles it again and classifies
        return {"compile_s": round(time.perf_counter() - t0, 4),
                "error": f"{type(exc).__name__}: {exc}"[:500]}
    return {"compile_s": round(time.perf_counter() - t0, 4)}


class _CompileOnlyDriver:
    """What ``JITFunction.run(..., warmup=True)`` asks of Triton's driver (the device, its stream
    and the target), answered without CUDA: a pool process given the target never starts the
    CUDA runtime.  Anything else Triton asks of it raises, and that point is compiled by the
    bench worker instead."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def _warm(target: tuple[str, int, int] | None = None) -> None:
    """Pool process start: yield the CPU to the bench worker (whose launches are timed), import
    torch and triton once, before the first point arrives, and, given the target
    (``("cuda", 90, 32)``), compile for it without CUDA."""
    with contextlib.suppress(OSError):
        os.nice(10)
    import torch  # noqa: F401
    import triton  # noqa: F401

    if target is not None:
        with contextlib.suppress(Exception):  # an unknown Triton: its own driver answers
            from triton.backends.compiler import GPUTarget
            from triton.runtime import driver

            driver.set_active(_CompileOnlyDriver(GPUTarget(*target)))


def _warm_compile() -> None:
    """A first compile in a fresh pool process (errors are the real points' to find).  It makes
    a kind's inputs on ``meta`` the way every point does: torch's first ``meta`` operation
    imports ``torch._dynamo``, seconds that would otherwise fall on the job's first points."""
    with contextlib.suppress(Exception):
        import harness.kinds  # noqa: F401 - the kinds' kernels, as the points will need them
        from harness import kinds as registry

        with _compile_only():
            registry.get("rms_norm").make_inputs({"M": 16, "N": 128, "dtype": "bf16"}, "meta", 0)
    with contextlib.suppress(Exception):
        from harness.box._warm_kernel import compile_once

        compile_once()


class CompilePool:
    """Points submitted in the order they will be measured; ``wait`` hands back the compile
    answer of one, bounded in time.  ``compile_fn`` is a seam for tests of the scheduling."""

    def __init__(self, workers: int, compile_fn: CompileFn = compile_point,
                 target: tuple[str, int, int] | None = None) -> None:
        """``target`` (``("cuda", 90, 32)``: backend, compute capability, warp size) lets the
        pool processes compile without starting CUDA; None: Triton asks the GPU."""
        self.workers = workers
        self.target = target
        ctx = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_warm,
                                         initargs=(target,))
        self._fn = compile_fn
        self._futures: dict[str, Future[dict[str, Any]]] = {}
        self.submitted = 0
        self.broken: str | None = None

    def warm(self) -> None:
        """Start every pool process now, each making a kind's ``meta`` inputs and compiling a
        trivial kernel: torch's and Triton's one-time costs are then paid before the first
        point arrives."""
        for _ in range(self.workers):
            try:
                self._pool.submit(_warm_compile)
            except (BrokenProcessPool, RuntimeError) as exc:
                self.broken = f"{type(exc).__name__}: {exc}"
                return

    def submit(self, key: str, kind: str, shape: dict[str, Any], knobs: dict[str, Any]) -> None:
        """Queue a point; once a pool process has died (a compiler crash, the OOM killer) the
        pool is broken and compile-ahead is off for the rest of the job: the worker compiles."""
        if key in self._futures or self.broken:
            return
        try:
            self._futures[key] = self._pool.submit(self._fn, kind, dict(shape), dict(knobs))
        except (BrokenProcessPool, RuntimeError) as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            return
        self.submitted += 1

    def wait(self, key: str, timeout_s: float) -> dict[str, Any] | None:
        """The point's compile answer, or None when it was never submitted, is not done within
        ``timeout_s`` or its pool process died (the worker then compiles it itself)."""
        fut = self._futures.pop(key, None)
        if fut is None:
            return None
        try:
            return fut.result(timeout=max(0.0, timeout_s))
        except FutureTimeout:
            fut.cancel()
            return None
        except Exception:  # noqa: BLE001 - a broken pool: the worker compiles
            return None

    def forget(self, keys: Iterable[str] | None = None) -> None:
        """Drop what a job queued but never waited for (the service's pool outlives its jobs):
        compiles not yet started are cancelled; the answers of those under way are dropped.
        ``keys``: only those points' (the next job's compiles go on); None: all."""
        for key in list(self._futures) if keys is None else keys:
            fut = self._futures.pop(key, None)
            if fut is not None:
                fut.cancel()

    def close(self) -> None:
        """Drop what is queued and end the pool processes at once (a compile in progress too)."""
        for fut in self._futures.values():
            fut.cancel()
        self._futures.clear()
        procs = list(getattr(self._pool, "_processes", {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(timeout=5)
