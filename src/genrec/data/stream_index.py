"""What streaming training needs to know before it reads a single example: per-bucket counts (issue 40).

A streaming trainer (:mod:`genrec.train.stream`) maps a step to (epoch, bucket window, offset) and gives every
data-parallel rank the same number of steps; both need the number of training examples in each bucket. The
model needs, before training, which items the training histories show and how often (ID vectors, popularity
negatives). Joining every bucket to count them would cost an epoch; this pass reads four integer columns
(``user_id``, ``item_id``, ``seq``, ``timestamp``) per bucket instead and applies the join's train rule:

* a user's train history is the events with ``seq < train_end`` (:func:`genrec.data.splits.compute_cutoffs`),
  whole (the trainer joins with an unbounded ``context_len`` and cuts at batch time);
* a user is a training example when that history has at least ``min_len`` events (the trainer's
  :func:`genrec.train.batches.materialise` drops shorter ones; feedviews never make a history longer, so they do
  not change the count).

``tests/data/test_stream_index.py`` checks it against the join itself (the slow twin). The result is cached
beside the tables (``TABLES/stream_index/<namespace>-<split>-min<N>.npz``, written atomically; a new table
version gets a new file and older versions' files are removed), so a resumed run or another rank reads it in
milliseconds. Ranks that start together may each compute it once; they write the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genrec.data.splits import SplitSpec, compute_cutoffs
from genrec.data.join import BucketSource
from genrec.data.store import TableStore
from genrec.errors import ConfigError
from genrec.workdir import atomic_write_bytes

__all__ = ["StreamIndex", "build_stream_index", "stream_index"]

_COLUMNS = ["user_id", "item_id", "seq", "timestamp"]


@dataclass(frozen=True)
class StreamIndex:
    """Training examples per bucket and item occurrences in their histories."""

    examples: np.ndarray  # int64 [n_buckets]: users with >= min_len train events, per bucket
    item_ids: np.ndarray  # int64 [M], sorted: items in those users' train histories
    item_counts: np.ndarray  # int64 [M]: occurrences of each

    @property
    def n_buckets(self) -> int:
        return int(self.examples.size)

    @property
    def total(self) -> int:
        return int(self.examples.sum())

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, examples=self.examples, item_ids=self.item_ids, item_counts=self.item_counts)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "StreamIndex":
        with np.load(io.BytesIO(data)) as z:
            return cls(z["examples"].astype(np.int64), z["item_ids"].astype(np.int64),
                       z["item_counts"].astype(np.int64))


def bucket_counts(store: BucketSource, bucket: int, split: SplitSpec, min_len: int) -> tuple[int, np.ndarray]:
    """(examples, item ids of their train histories [E]) of one bucket; ``split`` resolved."""
    events = store.read_events(bucket, columns=_COLUMNS)
    if events.num_rows == 0:
        return 0, np.zeros(0, dtype=np.int64)
    cut = compute_cutoffs(events, split)
    user = events.column("user_id").to_numpy().astype(np.int64)
    seq = events.column("seq").to_numpy().astype(np.int64)
    ui = cut.index(user)  # [N] each event's user row
    train = seq < cut.train_end[ui]  # [N]
    ok = np.bincount(ui[train], minlength=len(cut)) >= min_len  # [U] users with a long enough history
    keep = train & ok[ui]
    return int(ok.sum()), events.column("item_id").to_numpy().astype(np.int64)[keep]


def build_stream_index(store: BucketSource, split: SplitSpec, *, min_len: int = 2,
                       buckets: Sequence[int] | None = None) -> StreamIndex:
    """Count every bucket (or ``buckets``; the others count 0). ``split`` must be resolved (a temporal cut
    placed over all events, as :class:`genrec.data.join.BucketJoinReader` does)."""
    if split.kind == "temporal" and split.cut_ts is None:
        raise ConfigError("build_stream_index: resolve the temporal split over all events first (cut_ts is None)")
    n = store.n_buckets
    examples = np.zeros(n, dtype=np.int64)
    ids, counts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]  # per bucket: distinct items, occurrences
    for b in range(n) if buckets is None else buckets:
        examples[b], items = bucket_counts(store, int(b), split, min_len)
        u, c = np.unique(items, return_counts=True)
        ids.append(u)
        counts.append(c)
    item_ids, inverse = np.unique(np.concatenate(ids), return_inverse=True)  # at most items x buckets
    item_counts = np.bincount(inverse, weights=np.concatenate(counts), minlength=item_ids.size)
    return StreamIndex(examples, item_ids.astype(np.int64), item_counts.astype(np.int64))


def _cache_path(store: TableStore, split: SplitSpec, min_len: int) -> Path:
    ns = str(store.manifest()["namespace"])
    tag = split.kind if split.kind == "loo" else f"temporal{int(split.cut_ts or 0)}"
    return store.tables_dir / "stream_index" / f"{ns}-{tag}-min{min_len}.npz"


def stream_index(store: TableStore, split: SplitSpec, *, min_len: int = 2) -> StreamIndex:
    """The cached :class:`StreamIndex` of the store's current table version, built on first use."""
    path = _cache_path(store, split, min_len)
    if path.exists():
        idx = StreamIndex.from_bytes(path.read_bytes())
        if idx.n_buckets == store.n_buckets:
            return idx
    idx = build_stream_index(store, split, min_len=min_len)
    atomic_write_bytes(path, idx.to_bytes())
    ns = str(store.manifest()["namespace"])
    for old in path.parent.glob("*.npz"):  # other table versions' indexes: never read again
        if not old.name.startswith(f"{ns}-"):
            old.unlink(missing_ok=True)
    return idx
