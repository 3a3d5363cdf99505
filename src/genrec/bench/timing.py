"""Timing and checking helpers shared by the benchmarks (:mod:`genrec.bench.kernels`, :mod:`genrec.bench.decode`,
``benchmarks/bench_serve.py``): the median of a call's time (CUDA events on a GPU, the wall clock on the CPU), a CUDA
graph of repeated calls, a call under ``trusted_inputs``, the relative error of a fast path against its reference,
and the machine a figure came from (:func:`machine`)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Callable

import torch

from genrec.validation import trusted_inputs

__all__ = ["capture", "machine", "median_ms", "rel_err", "trusted"]


def machine() -> dict[str, Any]:
    """The platform, the CPU's model name and count, and the GPU's name (None without one) -- for a results file:
    a host-bound figure depends on the host's CPU as much as on the GPU."""
    cpu = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"machine": platform.platform(), "cpu_model": cpu, "cpus": os.cpu_count(), "gpu": gpu}


def median_ms(fn: Callable[[], Any], warmup: int, iters: int, device: str) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs after ``warmup`` runs: CUDA events on a
    GPU (``device`` "cuda"), the wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    if device == "cpu":
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def trusted(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` called under ``trusted_inputs`` (no value-check syncs), as genrec's own callers run it."""
    def call() -> Any:
        with trusted_inputs():
            return fn()

    return call


def capture(fn: Callable[[], Any], reps: int) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of ``reps`` calls of ``fn`` (warmed up once on a side stream, as capture needs),
    captured under ``trusted_inputs``."""
    with trusted_inputs():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
    return graph


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """The relative L2 error of ``a`` against the reference ``b``."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
