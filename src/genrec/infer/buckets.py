"""Static shapes for batched serving: batch sizes and history lengths padded to a few buckets.

The serving stages replay CUDA graphs captured per shape (:mod:`genrec.model.graphs`,
:mod:`genrec.decode.graphs`). Their history dimension is already bucketed (powers of two of item
slots); the batch dimension was not: a micro-batch of 5 requests captured a graph for batch 5, one of
6 another, and the graphs' LRUs (8-16 entries) then evicted and recaptured shapes under mixed load.
:class:`ShapeBuckets` fixes both dimensions to a small grid -- batch sizes (default 1, 2, 4, 8, 16,
32) and the slot buckets -- so each stage captures at most once per grid cell and then only replays.

Padding never changes a real row's answer:

* **batch rows**: a batch of ``b`` requests is padded to the smallest bucket >= ``b`` with copies of
  its first row. Every shape the batch already has -- the longest history, the most excluded items,
  the widest candidate union -- stays what it was, and every stage works row by row (attention within
  a row, beams per row, one ANN query per row, each candidate seeing only its history), so the real
  rows compute what they would without the copies; the copies' results are dropped. A batch larger
  than the largest bucket is split into chunks of the largest.
* **history slots**: right padding to the slot bucket (the graphed encoder's own rule,
  :func:`slot_bucket`): PAD tokens, which no attention sees.

:class:`HistoryBuffers` holds the host side of those shapes: one int64 array per (thread, batch
bucket, slot bucket), pinned on CUDA, refilled request after request and copied to the device
without blocking the host (the next fill of the same buffer first waits for that copy).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from genrec.errors import ConfigError
from genrec.model.graphs import bucket_length

__all__ = ["BATCH_BUCKETS", "HistoryBuffers", "ShapeBuckets", "resolve_buckets", "slot_bucket"]

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
HISTORY_COLUMNS = ("rows", "actions", "surfaces", "ts")  # a parsed history's per-item arrays, in buffer order


def slot_bucket(n: int, max_items: int, min_slots: int = 64) -> int:
    """The item slots a history of ``n`` items is padded to: the smallest power of two >= max(n,
    ``min_slots``), capped at ``max_items`` -- :class:`genrec.model.graphs.GraphedEncoder`'s bucket."""
    return min(bucket_length(n, min_slots), max_items)


@dataclass(frozen=True)
class ShapeBuckets:
    """The batch sizes a batch of requests is padded to, and the smallest slot bucket of a history."""

    batch_sizes: tuple[int, ...] = BATCH_BUCKETS
    min_slots: int = 64

    def __post_init__(self) -> None:
        bs = tuple(self.batch_sizes)
        if not bs or any(type(b) is not int or b < 1 for b in bs) or list(bs) != sorted(set(bs)):
            raise ConfigError(f"batch buckets: distinct positive integers in increasing order, got {list(bs)}")
        if self.min_slots < 1:
            raise ConfigError(f"batch buckets: min_slots must be >= 1, got {self.min_slots}")

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def batch(self, b: int) -> int:
        """The bucket a batch of ``b`` rows is padded to (``b`` <= :attr:`max_batch`; see :meth:`chunks`)."""
        for s in self.batch_sizes:
            if s >= b:
                return s
        raise ValueError(f"a batch of {b} is larger than the largest bucket {self.max_batch}: split it (chunks)")

    def chunks(self, b: int) -> list[tuple[int, int]]:
        """``[start, stop)`` of each chunk of a batch of ``b`` rows: at most :attr:`max_batch` rows each."""
        m = self.max_batch
        return [(i, min(i + m, b)) for i in range(0, b, m)]

    def slots(self, n: int, max_items: int) -> int:
        """The slot bucket of a batch whose longest history has ``n`` items (:func:`slot_bucket`)."""
        return slot_bucket(n, max_items, self.min_slots)

    def slot_grid(self, max_items: int) -> list[int]:
        """Every slot bucket a history of 1..``max_items`` items can take, smallest first."""
        out, n = [], 1
        while True:
            s = self.slots(n, max_items)
            out.append(s)
            if s >= max_items:
                return out
            n = s + 1

    def up_to(self, b: int) -> list[int]:
        """The batch buckets a batch of at most ``b`` rows can take (warm-up: the micro-batch's)."""
        return [s for s in self.batch_sizes if s <= self.batch(min(max(b, 1), self.max_batch))]

    @classmethod
    def parse(cls, text: str) -> "ShapeBuckets":
        try:
            sizes = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise ConfigError(f"batch buckets: a comma-separated list of batch sizes, e.g. 1,2,4,8, got {text!r}") \
                from None
        return cls(sizes)


def resolve_buckets(spec: str | None, graphed: bool) -> ShapeBuckets | None:
    """The buckets a Recommender pads batches to: ``spec``, else ``$GENREC_BATCH_BUCKETS``, else "auto".
    "auto": :data:`BATCH_BUCKETS` when a serving stage replays CUDA graphs (``graphed``), else none --
    without graphs a padded row is only extra work; "off": none; "1,2,4,8": those batch sizes."""
    raw = (spec or os.environ.get("GENREC_BATCH_BUCKETS") or "auto").strip().lower()
    if raw == "auto":
        return ShapeBuckets() if graphed else None
    if raw in ("off", "0", "none"):
        return None
    return ShapeBuckets.parse(raw)


class HistoryBuffers:
    """Reusable host arrays for a batch's history tensors, one per (thread, batch size, slot count).

    :meth:`fill` writes parsed histories (:mod:`genrec.infer.history`) right-padded with 0 into the
    buffer -- one masked assignment per column, no loop over items -- and returns the device tensors.
    On CUDA the buffer is pinned and copied without blocking the host; a CUDA event recorded after the
    copy is waited for before the buffer is written again. Elsewhere the tensors are a copy of the buffer
    (a batch never aliases memory its thread will overwrite). ``allocations`` counts buffers made."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.allocations = 0

    def _buffer(self, b: int, n: int) -> list[Any]:
        bufs: dict[tuple[int, int], list[Any]] | None = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = {}
        ent = bufs.get((b, n))
        if ent is None:
            host = torch.zeros(len(HISTORY_COLUMNS) * b * n + 2 * b, dtype=torch.int64, pin_memory=self.cuda)
            ent = bufs[(b, n)] = [host, None]
            with self._lock:
                self.allocations += 1
        return ent

    def fill(self, parsed: Sequence[dict[str, Any]], n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(columns [4, B, n] -- rows, actions, surfaces, timestamps; lengths [B]; each history's last
        surface [B]) on the device, for ``B = len(parsed)`` histories of at most ``n`` items."""
        b = len(parsed)
        lengths = np.fromiter((len(p["rows"]) for p in parsed), np.int64, b)
        if b == 0 or lengths.min() < 1 or lengths.max() > n:
            raise ValueError(f"history buffers: {b} histories of 1..{n} items expected, got lengths "
                             f"{lengths.tolist()[:8]}")
        ent = self._buffer(b, n)
        host, done = ent
        if done is not None:
            done.synchronize()  # the previous copy out of this buffer has finished
        flat = host.numpy()
        c = len(HISTORY_COLUMNS)
        cols = flat[:c * b * n].reshape(c, b, n)
        meta = flat[c * b * n:].reshape(2, b)
        cols.fill(0)
        at = np.arange(n)[None, :] < lengths[:, None]
        for i, key in enumerate(HISTORY_COLUMNS):
            cols[i][at] = np.concatenate([p[key] for p in parsed])
        meta[0] = lengths
        meta[1] = cols[2, np.arange(b), lengths - 1]  # the request surface default: the last item's
        if self.cuda:
            dev = host.to(self.device, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            ent[1] = ev
        else:
            dev = host.clone()
        t = dev[:c * b * n].view(c, b, n)
        m = dev[c * b * n:].view(2, b)
        return t, m[0], m[1]
