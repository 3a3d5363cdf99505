"""Streaming training input: each rank reads only its buckets, a window of buckets at a time (issue 40).

:class:`genrec.train.batches.BatchStream` materialises every example of the table on every rank. Here a rank
reads, joins and materialises one *window* of ``window_buckets`` buckets at a time, shuffles it, and cuts it
into batches; memory is bounded by the window (plus one batch carried across a window's end), not by the table.

**The order** -- a pure function of the per-bucket example counts (:mod:`genrec.data.stream_index`), the
seed, the epoch, the rank, the world size and the window size:

* rank ``r`` of ``W`` owns the buckets ``b`` with ``b % W == r`` (users never meet across ranks);
* epoch ``e``: the rank's buckets in the order ``rng(seed, e, r, 1).permutation(own)``, cut into windows of
  ``window_buckets`` consecutive buckets (the last may be shorter);
* window ``w``: its buckets' examples one bucket after the other in that order, each bucket's in the join's
  order (user id), then permuted by ``rng(seed, e, r, 2, w)``;
* the rank's epoch is its windows' permuted examples one after the other; its batch ``i`` of the epoch is
  positions ``[i*P, (i+1)*P)``, ``P = batch_size / W`` (a batch may straddle two windows);
* every rank takes ``steps_per_epoch = min over ranks of (rank's examples // P)`` steps per epoch (DDP needs
  the same count on every rank); a rank's examples past that are not seen that epoch -- another tail every
  epoch, as the order changes.

(``rng(k...)`` is ``numpy.random.default_rng([k...])``; the tags 1 and 2 keep the two draws apart: a
seed sequence pads a short key with zeros, so ``(s, e, r)`` and ``(s, e, r, 0)`` would be one draw.) Buckets are
hash partitions of the users, so a window is already a uniform sample of them: shuffling within it is close to a
global shuffle at any window size.
The batch itself is :func:`genrec.train.batches.collate` of its examples, as in ``BatchStream``.

**Resume**: step ``s`` is epoch ``s // steps_per_epoch``, position ``(s % steps_per_epoch) * P``; the window
holding that position is found from the counts alone, so a resumed stream reads no earlier window.

**Engines**: a window is turned into its batches by :func:`window_pieces` (read, check the count, permute,
collate the batches that lie inside the window; the examples of a batch that straddles its edge are passed on
as a partial piece). :class:`EmbeddedEngine` runs it in the trainer's process (pyiceberg + the join);
:class:`genrec.train.ray_engine.RayEngine` runs the same function on Ray workers -- the same pieces in the same
order, so the two engines give equal batches (tested).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Protocol, Union

import numpy as np

from genrec.catalog import ItemCatalog
from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.data.store import TableStore
from genrec.data.stream_index import StreamIndex
from genrec.errors import ConfigError, DataError
from genrec.train.batches import CollateOptions, TrainBatch, TrainExample, materialise

__all__ = ["CollateOptions", "EmbeddedEngine", "Partial", "StreamBatches", "StreamSpec", "WindowPlan", "WindowReader",
           "WindowTask", "row_counts", "window_pieces"]

_MASK63 = (1 << 63) - 1


@dataclass
class Partial:
    """The examples (in order) of a batch that a window's edge cuts; the next window's piece completes it."""

    epoch: int
    examples: list[TrainExample]


Piece = Union[TrainBatch, Partial]


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([int(k) & _MASK63 for k in key])


@dataclass(frozen=True)
class StreamSpec:
    """What turning a window into batches needs besides its examples (sent to every worker once)."""

    seed: int
    rank: int
    per_rank: int  # P: examples per batch on this rank
    options: CollateOptions


@dataclass(frozen=True)
class WindowTask:
    """One window of one epoch, and which of its positions to emit."""

    epoch: int
    window: int
    buckets: tuple[int, ...]
    start: int  # position of the window's first example in the rank's epoch order
    size: int  # the window's examples (the stream index's count)
    lo: int  # emit positions [lo, hi) (epoch order; within [start, start + size))
    hi: int


class WindowPlan:
    """The module's order as arithmetic on the per-bucket example counts (nothing is read)."""

    def __init__(self, counts: Sequence[int] | np.ndarray, *, batch_size: int, seed: int, rank: int = 0,
                 world: int = 1, window_buckets: int = 1) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        n = int(counts.size)
        if world < 1 or not 0 <= rank < world:
            raise ConfigError(f"rank {rank} of world size {world}")
        if batch_size % world:
            raise DataError(f"global batch size {batch_size} is not divisible by world size {world}",
                            field="batch_size")
        if window_buckets < 1:
            raise ConfigError(f"config key 'data.window_buckets': must be >= 1, got {window_buckets}")
        if n < world:
            raise ConfigError(f"streaming gives each of the {world} ranks its own buckets, and the tables have "
                              f"{n}: write them with at least {world} buckets (`--buckets`)")
        self.counts = counts
        self.seed, self.rank, self.world, self.window_buckets = seed, rank, world, window_buckets
        self.per_rank = batch_size // world
        self.own = [b for b in range(n) if b % world == rank]
        totals = [int(counts[r::world].sum()) for r in range(world)]
        if min(totals) < self.per_rank:
            r = int(np.argmin(totals))
            raise DataError(f"rank {r}'s buckets hold {totals[r]} training examples, fewer than one batch share "
                            f"({self.per_rank} = batch_size {batch_size} / {world} ranks)"
                            if totals[r] else "no training examples (every user has fewer than 2 train events?)")
        self.steps_per_epoch = min(totals) // self.per_rank

    def windows(self, epoch: int) -> list[tuple[int, ...]]:
        order = _rng(self.seed, epoch, self.rank, 1).permutation(np.asarray(self.own, dtype=np.int64))
        k = self.window_buckets
        return [tuple(int(b) for b in order[i:i + k]) for i in range(0, len(order), k)]

    def tasks(self, epoch: int, first_step: int = 0) -> list[WindowTask]:
        """The windows to read for steps ``first_step ..`` of ``epoch`` (those holding no position of them
        are left out: the skipped head on resume, the unseen tail)."""
        lo, hi = first_step * self.per_rank, self.steps_per_epoch * self.per_rank
        out, start = [], 0
        for w, buckets in enumerate(self.windows(epoch)):
            size = int(self.counts[list(buckets)].sum())
            a, b = max(lo, start), min(hi, start + size)
            if a < b:
                out.append(WindowTask(epoch, w, buckets, start, size, a, b))
            start += size
        return out


def window_pieces(task: WindowTask, examples: list[TrainExample], spec: StreamSpec) -> Iterator[Piece]:
    """The pieces of ``task``'s positions ``[lo, hi)``: whole batches collated, and the examples of a batch cut
    by the window's edge (or by ``lo``/``hi``) as a :class:`Partial`. ``examples``: the window's, in the module's
    order."""
    if len(examples) != task.size:
        raise DataError(f"buckets {list(task.buckets)}: {len(examples)} training examples read, the stream index "
                        f"counted {task.size}: the tables changed since it was built (remove TABLES/stream_index/)")
    perm = _rng(spec.seed, task.epoch, spec.rank, 2, task.window).permutation(task.size)
    per = spec.per_rank
    pos = task.lo
    while pos < task.hi:
        end = min(task.hi, (pos // per + 1) * per)  # the end of the batch holding ``pos``, or of the window
        exs = [examples[int(j)] for j in perm[pos - task.start:end - task.start]]
        yield spec.options.collate(exs, epoch=task.epoch, seed=spec.seed) if end - pos == per \
            else Partial(task.epoch, exs)
        pos = end


def assemble(pieces: Iterable[Piece], spec: StreamSpec) -> Iterator[TrainBatch]:
    """Batches from pieces in order: partial pieces are joined until a batch is whole (an epoch ends on a
    batch boundary, so a batch never mixes epochs)."""
    buf: list[TrainExample] = []
    for p in pieces:
        if isinstance(p, TrainBatch):
            if buf:
                raise RuntimeError("a whole batch arrived while a straddling one was incomplete")
            yield p
            continue
        buf.extend(p.examples)
        if len(buf) == spec.per_rank:
            yield spec.options.collate(buf, epoch=p.epoch, seed=spec.seed)
            buf = []


class WindowEngine(Protocol):
    """Turns the windows of successive epochs (a list per epoch, endless) into their pieces, in order."""

    def run(self, epochs: Iterator[list[WindowTask]], spec: StreamSpec) -> Iterator[Piece]: ...


class WindowReader:
    """A window's examples from the tables: the join of each bucket in turn, materialised."""

    def __init__(self, store: TableStore, split: SplitSpec, catalog: ItemCatalog, *, seed: int,
                 min_len: int = 2) -> None:
        self.reader = BucketJoinReader(store, split=split, role="train", context_len=10 ** 9, seed=seed)
        self.catalog, self.min_len = catalog, min_len

    def read(self, buckets: Sequence[int]) -> list[TrainExample]:
        return materialise(chain.from_iterable(self.reader.iter_bucket(b) for b in buckets), self.catalog,
                           min_len=self.min_len)


class EmbeddedEngine:
    """In the trainer's process: one window in memory at a time."""

    def __init__(self, reader: WindowReader) -> None:
        self.reader = reader

    def __enter__(self) -> "EmbeddedEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, epochs: Iterator[list[WindowTask]], spec: StreamSpec) -> Iterator[Piece]:
        for tasks in epochs:
            for t in tasks:
                yield from window_pieces(t, self.reader.read(t.buckets), spec)


class StreamBatches:
    """This rank's batches in the module's order: ``iter_from(step)`` yields global steps ``step, step+1, ...``."""

    def __init__(self, engine: WindowEngine, plan: WindowPlan, options: CollateOptions) -> None:
        self.engine, self.plan = engine, plan
        self.spec = StreamSpec(plan.seed, plan.rank, plan.per_rank, options)
        self.steps_per_epoch = plan.steps_per_epoch

    def iter_from(self, step: int) -> Iterator[TrainBatch]:
        return assemble(self.engine.run(self._epochs(step), self.spec), self.spec)

    def _epochs(self, step: int) -> Iterator[list[WindowTask]]:
        epoch, first = divmod(step, self.steps_per_epoch)
        while True:
            yield self.plan.tasks(epoch, first)
            epoch, first = epoch + 1, 0


def row_counts(index: StreamIndex, catalog: ItemCatalog) -> np.ndarray:
    """int64 [len(catalog)]: occurrences of each catalogue row in the training histories (as the materialised
    examples' rows would count them; an item the catalogue lacks raises, as ``materialise`` does)."""
    return np.bincount(catalog.rows(index.item_ids), weights=index.item_counts,
                       minlength=len(catalog)).astype(np.int64)
