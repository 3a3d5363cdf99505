"""Timing and checking helpers shared by the benchmarks (:mod:`genrec.bench.kernels`, :mod:`genrec.bench.decode`):
the median of a call's time (CUDA events on a GPU, the wall clock on the CPU), a CUDA graph of repeated calls,
a call under ``trusted_inputs``, and the relative error of a fast path against its reference."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from genrec.validation import trusted_inputs

__all__ = ["capture", "median_ms", "rel_err", "trusted"]


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
