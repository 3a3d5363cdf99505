"""Per-stage timing of the serving path: the one place its timing hooks live.

``with stage("encode", t): ...`` times a stage of the funnel on the host (``perf_counter``) and writes
the milliseconds into ``t`` (the ``timings_ms`` a result carries; ``t`` None: nothing written). While a
:func:`profiling` block is active in the calling thread, every stage is also added to its
:class:`StageProfile`: host milliseconds, and on CUDA the device milliseconds between two CUDA events
recorded on the current stream at the stage's entry and exit (the GPU's span of the stage's work,
including any time the GPU sat idle waiting for the host to issue it). Outside a profiling block a
stage costs one context-variable lookup and nothing else happens: no events, no syncs.

Stages nest (:attr:`StageProfile.depth`); sub-stages are named ``"rank.decode"``. ``sync=True`` synchronises the
device at each stage's entry and exit, so a stage's host time is its whole latency (its own device work
waited for, and none of an earlier stage's); without it, a host time is what the host spent issuing the
stage plus any wait the stage itself makes (a device-to-host copy waits for everything queued before it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

__all__ = ["StageProfile", "profiling", "stage"]

_ACTIVE: ContextVar["StageProfile | None"] = ContextVar("genrec_stage_profile", default=None)


class StageProfile:
    """Host and device milliseconds per stage name, summed over the stages run while it was active."""

    def __init__(self, device: str | torch.device = "cpu", *, sync: bool = False) -> None:
        self.cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        self.sync = sync and self.cuda
        self.host: dict[str, float] = {}  # in the order the stages started
        self.depth: dict[str, int] = {}  # how many stages enclosed each when it first ran
        self._open = 0
        self._events: list[tuple[str, Any, Any]] = []

    def add(self, name: str, ms: float, events: tuple[Any, Any] | None) -> None:
        self.host[name] = self.host.get(name, 0.0) + ms
        if events is not None:
            self._events.append((name, *events))

    def device(self) -> dict[str, float]:
        """Device milliseconds per stage (empty off CUDA); synchronises once."""
        if not self._events:
            return {}
        torch.cuda.synchronize()
        out: dict[str, float] = {}
        for name, a, b in self._events:
            out[name] = out.get(name, 0.0) + float(a.elapsed_time(b))
        return out


@contextmanager
def profiling(device: str | torch.device = "cpu", *, sync: bool = False) -> Iterator[StageProfile]:
    """Collect every :class:`stage` this thread runs inside the block into a new :class:`StageProfile`."""
    prof = StageProfile(device, sync=sync)
    token = _ACTIVE.set(prof)
    try:
        yield prof
    finally:
        _ACTIVE.reset(token)


class stage:  # noqa: N801 - used as a context manager, like contextlib's lower-case ones
    """Time one stage: host milliseconds into ``into[name]`` (when given) and, inside :func:`profiling`,
    into the active profile (with CUDA events on a GPU)."""

    __slots__ = ("name", "into", "t0", "prof", "ev")

    def __init__(self, name: str, into: dict[str, float] | None = None) -> None:
        self.name, self.into = name, into
        self.prof: StageProfile | None = None
        self.ev: Any = None
        self.t0 = 0.0

    def __enter__(self) -> "stage":
        prof = self.prof = _ACTIVE.get()
        if prof is not None:
            prof.host.setdefault(self.name, 0.0)  # listed in the order the stages start
            prof.depth.setdefault(self.name, prof._open)
            prof._open += 1
        if prof is not None and prof.cuda:
            if prof.sync:
                torch.cuda.synchronize()
            self.ev = torch.cuda.Event(enable_timing=True)
            self.ev.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        prof = self.prof
        end = None
        if prof is not None and self.ev is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            if prof.sync:
                torch.cuda.synchronize()
        ms = (time.perf_counter() - self.t0) * 1000.0
        if self.into is not None:
            self.into[self.name] = ms
        if prof is not None:
            prof._open -= 1
            prof.add(self.name, ms, None if end is None else (self.ev, end))
