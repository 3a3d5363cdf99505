"""The in-trainer join of user sequences and feedviews, one hash bucket at a time (UniPinRec §3.2).

UniPinRec stores action sequences and feedview (request) records in two tables bucketed
by user and joins them in memory inside the trainer, so context length, the sampling
ratio of no-interaction feedviews and user filters are read-time knobs. This reader
streams ONE bucket at a time (read events + feedviews of bucket ``b``, join by
``user_id``, emit :class:`UserExample` per user, free), so peak memory is about one
bucket's worth, not the table's (measured in ``benchmarks/bench_join_memory.py``).

Semantics (all cutoffs are ``seq`` values from :mod:`genrec.data.splits`):

* ``role="train"``: history = the user's train events (``seq < train_end``), optionally
  only positive actions, the last ``context_len`` of them. Feedviews: those with
  ``request_seq < train_end``; a slate crossing the cut is truncated to its first
  ``train_end - request_seq`` items (slate item ``i`` is the event at ``request_seq + i``,
  the feedview rule of every ingested dataset). When the context window dropped older
  history, feedviews requested before the window's first event are dropped too (their
  context is gone). Feedviews with no interaction (OR of the labels has no positive
  action bit) are kept with probability ``feedview_keep_no_interaction`` (default 0.1),
  decided by :func:`keep_uniform` -- a hash of ``(seed, user_id, request_seq)``, so the
  choice is the same on every epoch, machine and bucket count.
* ``role="valid"|"test"``: users with a target only; history = events with ``seq <
  target_seq`` (last ``context_len``); the target event is carried on the example; the
  feedviews are the slates *containing* the target (``request_seq <= target_seq <
  request_seq + len``), whole, never dropped (``history_len`` is 0 for one that starts
  before a truncated window).
* Logged feedviews (``DatasetInfo.impressions``: an impressions file, label 0 = shown only): slate item
  ``j`` is NOT the event ``request_seq + j``, so slates are never cut by position. A slate *holds* an
  event when it was requested at or before it (``request_seq <= seq``), shows its item and has its
  action's bit. Train: the slates with ``request_seq < train_end``, whole, except those holding an
  event at or after ``train_end`` (a held-out label); eval: the latest slate(s) (by ``request_ts``)
  holding the target, whole, asked at their own request (``history_len`` = history events before
  it); a valid slate leaves out its items holding the test target. A target no slate holds has none.
* Feedviews of users with no events in the table produce no example.
* Every feedview carries ``history_len`` = the number of emitted history events with
  ``seq < request_seq``, i.e. the prefix of ``items`` a model may look at to score it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.data.schema import DatasetInfo
from genrec.data.splits import SplitCutoffs, SplitRole, SplitSpec, compute_cutoffs
from genrec.errors import ConfigError, DataError

_MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------- sampling hash


def _splitmix64_py(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def keep_uniform_py(seed: int, user_id: int, request_seq: int) -> float:
    """Reference (scalar, plain ints): ``splitmix64(splitmix64(splitmix64(seed) ^ user) ^ req) >> 11 / 2**53``."""
    h = _splitmix64_py(seed & _MASK64)
    h = _splitmix64_py(h ^ (user_id & _MASK64))
    h = _splitmix64_py(h ^ (request_seq & _MASK64))
    return (h >> 11) / float(1 << 53)


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keep_uniform(seed: int, user_id: np.ndarray | int, request_seq: np.ndarray) -> np.ndarray:
    """Vectorised :func:`keep_uniform_py`: a float64 in [0, 1) per (user, request); keep if ``< p``."""
    with np.errstate(over="ignore"):
        s = np.array([seed & _MASK64], dtype=np.uint64)
        u = np.asarray(user_id, dtype=np.int64).view(np.uint64) if np.ndim(user_id) else \
            np.array([user_id], dtype=np.int64).view(np.uint64)
        r = np.asarray(request_seq, dtype=np.int64).view(np.uint64)
        h = _splitmix64_np(s)
        h = _splitmix64_np(h ^ u)
        h = _splitmix64_np(h ^ r)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


# ----------------------------------------------------------------------------- records


@dataclass
class Feedview:
    """One request: the slate shown and per-item action bitmask labels."""

    request_ts: int
    request_seq: int
    surface: int  # index into DatasetInfo.surfaces
    item_ids: np.ndarray  # int64 [k]
    labels: np.ndarray  # int32 [k], bit c = action c
    history_len: int  # emitted history events before the request: items[:history_len]


@dataclass
class UserExample:
    """One user's joined training / eval record."""

    user_id: int
    items: np.ndarray  # int64 [n]
    actions: np.ndarray  # int32 [n], index into DatasetInfo.actions
    surfaces: np.ndarray  # int32 [n], index into DatasetInfo.surfaces
    timestamps: np.ndarray  # int64 [n]
    seqs: np.ndarray  # int32 [n]
    feedviews: list[Feedview] = field(default_factory=list)
    target_item: int = -1  # eval roles: the held-out event
    target_seq: int = -1
    target_action: int = -1
    target_surface: int = -1
    target_ts: int = -1


class BucketSource(Protocol):
    """What the reader needs from a store (:class:`genrec.data.store.TableStore` has it)."""

    @property
    def n_buckets(self) -> int: ...

    def info(self) -> DatasetInfo: ...

    def read_events(self, bucket: int | None = None, *, columns: list[str] | None = None) -> pa.Table: ...

    def read_feedviews(self, bucket: int | None = None, *, columns: list[str] | None = None) -> pa.Table: ...


# ----------------------------------------------------------------------------- helpers


def _codes(col: pa.ChunkedArray | pa.Array, vocab: list[str], table: str, fld: str) -> np.ndarray:
    """Vocabulary index of each string; unknown values raise DataError naming the row."""
    idx = pc.index_in(col, value_set=pa.array(vocab, pa.string()))
    if idx.null_count:
        bad = np.flatnonzero(idx.is_null().to_numpy(zero_copy_only=False))[0]
        raise DataError(f"row {bad}: {col[int(bad)].as_py()!r} is not in the vocabulary {vocab}",
                        path=table, field=fld)
    return idx.to_numpy(zero_copy_only=False).astype(np.int32)


def _flat_list(col: pa.ChunkedArray, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [R+1], values) of a list column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(arr) == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=dtype)
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype)
    return offsets - offsets[0], values[offsets[0]:offsets[-1]]


def _group_starts(keys: np.ndarray) -> np.ndarray:
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])


# ----------------------------------------------------------------------------- reader


class BucketJoinReader:
    """Iterate :class:`UserExample` records, joining events and feedviews bucket by bucket.

    ``buckets`` restricts the pass to some buckets (e.g. ``range(rank, n, world)`` for one
    data-parallel rank). Output order: bucket, then user id -- deterministic.
    """

    def __init__(
        self,
        store: BucketSource,
        *,
        split: SplitSpec,
        role: SplitRole,
        context_len: int,
        feedview_keep_no_interaction: float | None = None,
        positive_only_history: bool = False,
        user_filter: Callable[[int], bool] | None = None,
        seed: int = 0,
        buckets: Sequence[int] | None = None,
    ) -> None:
        if role not in ("train", "valid", "test"):
            raise ConfigError(f"role must be 'train', 'valid' or 'test', got {role!r}")
        if not isinstance(context_len, (int, np.integer)) or context_len < 1:
            raise ConfigError(f"context_len must be a positive int, got {context_len!r}")
        if feedview_keep_no_interaction is None:
            feedview_keep_no_interaction = 0.1 if role == "train" else 1.0
        p = float(feedview_keep_no_interaction)
        if not 0.0 <= p <= 1.0:
            raise ConfigError(f"feedview_keep_no_interaction must be in [0, 1], got {p}")
        if role != "train" and p != 1.0:
            raise ConfigError(f"feedview_keep_no_interaction must be 1.0 for role={role!r} (eval drops nothing)")
        self.store = store
        self.role: SplitRole = role
        self.context_len = int(context_len)
        self.keep_p = p
        self.positive_only_history = positive_only_history
        self.user_filter = user_filter
        self.seed = int(seed)
        self.info = store.info()
        n = store.n_buckets
        self.buckets = list(range(n)) if buckets is None else [int(b) for b in buckets]
        bad = [b for b in self.buckets if not 0 <= b < n]
        if bad:
            raise ConfigError(f"buckets {bad} out of range [0, {n})")
        if split.kind == "temporal" and split.cut_ts is None:
            # the quantile cut is global: read only the timestamp column of all events
            split = split.resolve(store.read_events(columns=["timestamp"]).column("timestamp"))
        self.split = split
        self._pos_mask = self.info.positive_mask()
        self._pos_action = np.array([(self._pos_mask >> i) & 1 == 1 for i in range(len(self.info.actions))],
                                    dtype=bool)

    def __iter__(self) -> Iterator[UserExample]:
        for b in self.buckets:
            yield from self.iter_bucket(b)

    def iter_buckets(self) -> Iterator[tuple[int, Iterator[UserExample]]]:
        """``(bucket, examples)`` pairs; consume each ``examples`` before the next pair."""
        for b in self.buckets:
            yield b, self.iter_bucket(b)

    def iter_bucket(self, bucket: int) -> Iterator[UserExample]:
        """Read, join and emit one bucket; nothing from other buckets is held."""
        events = self.store.read_events(bucket)
        feedviews = self.store.read_feedviews(bucket)
        yield from self.join(events, feedviews)

    # -- the join of one bucket ------------------------------------------------

    def join(self, events: pa.Table, feedviews: pa.Table) -> Iterator[UserExample]:
        """Join one bucket's ``events`` and ``feedviews`` (every user's rows must be in them)."""
        if events.num_rows == 0:
            return
        cut: SplitCutoffs = compute_cutoffs(events, self.split)
        info = self.info
        # events sorted by (user, seq)                                          [N]
        e_user = events.column("user_id").to_numpy()
        e_seq = events.column("seq").to_numpy().astype(np.int64)
        order = np.lexsort((e_seq, e_user))
        e_user, e_seq = e_user[order], e_seq[order]
        e_item = events.column("item_id").to_numpy()[order]
        e_ts = events.column("timestamp").to_numpy()[order]
        e_act = _codes(events.column("action"), info.actions, "events", "action")[order]
        e_surf = _codes(events.column("surface"), info.surfaces, "events", "surface")[order]
        e_pos = self._pos_action[e_act] if self._pos_action.size else np.zeros(e_act.size, dtype=bool)
        del events, order
        e_starts = _group_starts(e_user)
        e_ends = np.r_[e_starts[1:], e_user.size]
        users = e_user[e_starts]  # [U], sorted; same order as cut.user_id
        # feedviews sorted by (user, request_seq)                                [F]
        f_user = feedviews.column("user_id").to_numpy()
        f_req = feedviews.column("request_seq").to_numpy().astype(np.int64)
        f_order = np.lexsort((f_req, f_user))
        f_user, f_req = f_user[f_order], f_req[f_order]
        f_ts = feedviews.column("request_ts").to_numpy()[f_order]
        f_surf = _codes(feedviews.column("surface"), info.surfaces, "feedviews", "surface")[f_order]
        f_off, f_items = _flat_list(feedviews.column("item_ids"), np.int64)
        l_off, f_labels = _flat_list(feedviews.column("labels"), np.int32)
        if not np.array_equal(f_off, l_off):
            raise DataError("labels and item_ids differ in length", path="feedviews", field="labels")
        f_lo, f_hi = f_off[:-1][f_order], f_off[1:][f_order]  # [F] slate spans in the flat arrays
        del feedviews, f_order
        # feedview rows of each user (users without events have no examples)
        f_first = np.searchsorted(f_user, users, side="left")  # [U]
        f_last = np.searchsorted(f_user, users, side="right")  # [U]
        target = cut.target_seq(self.role)  # [U] (train: train_end)
        # a valid slate stops before the test target: its later items are the test's, never model selection's
        stop = cut.test_seq if self.role == "valid" else np.full(users.size, -1)
        train = self.role == "train"
        for ui in range(users.size):
            uid = int(users[ui])
            t = int(target[ui])
            if not train and t < 0:
                continue
            if self.user_filter is not None and not self.user_filter(uid):
                continue
            a, b = int(e_starts[ui]), int(e_ends[ui])
            k = a + int(np.searchsorted(e_seq[a:b], t, side="left"))  # history rows [a, k)
            hist = np.arange(a, k)
            if self.positive_only_history:
                hist = hist[e_pos[a:k]]
            truncated = hist.size > self.context_len
            hist = hist[-self.context_len:]
            h_seq = e_seq[hist]
            t_ts = int(e_ts[k]) if not train and k < b else 0
            if info.impressions:
                fvs = self._logged_feedviews(uid, t, h_seq, truncated, int(f_first[ui]), int(f_last[ui]), f_req,
                                             f_ts, f_surf, f_lo, f_hi, f_items, f_labels, e_item[k:b], e_act[k:b],
                                             e_seq[k:b], int(stop[ui]))
            else:
                fvs = self._feedviews(uid, t, h_seq, truncated, int(f_first[ui]), int(f_last[ui]),
                                      f_req, f_ts, f_surf, f_lo, f_hi, f_items, f_labels, t_ts, int(stop[ui]))
            if train and hist.size == 0 and not fvs:
                continue
            ex = UserExample(
                user_id=uid,
                items=e_item[hist].astype(np.int64),
                actions=e_act[hist].astype(np.int32),
                surfaces=e_surf[hist].astype(np.int32),
                timestamps=e_ts[hist].astype(np.int64),
                seqs=h_seq.astype(np.int32),
                feedviews=fvs,
            )
            if not train:
                j = k  # the target row: first row with seq >= t, and seq == t by construction
                ex.target_item, ex.target_seq = int(e_item[j]), int(e_seq[j])
                ex.target_action, ex.target_surface, ex.target_ts = int(e_act[j]), int(e_surf[j]), int(e_ts[j])
            yield ex

    def _feedviews(self, uid: int, t: int, h_seq: np.ndarray, truncated: bool, c: int, d: int,
                   f_req: np.ndarray, f_ts: np.ndarray, f_surf: np.ndarray, f_lo: np.ndarray,
                   f_hi: np.ndarray, f_items: np.ndarray, f_labels: np.ndarray, t_ts: int = 0,
                   stop: int = -1) -> list[Feedview]:
        """The user's slates for this role. Slate item j is event ``request_seq + j`` (the feedviews are
        chunks of the events: :mod:`genrec.data.ingest.feedviews`). Train: every slate's items before
        ``t`` (the train end). Eval: the slate holding the target, cut to its held-out part -- the target
        and the later items, before ``stop`` (valid: the test target, >= 0 when there is one) -- and asked at
        the target (history: the case's, ``request_ts``: the target's). Its earlier items were training
        candidates of the same request, with the same history and labels: scoring them would reward
        memorising the training set; a valid slate holding the test target would let
        its label into model selection."""
        if c == d:
            return []
        req = f_req[c:d]  # [f]
        length = f_hi[c:d] - f_lo[c:d]  # [f]
        skip = np.zeros_like(length)
        if self.role == "train":
            keep_len = np.minimum(length, t - req)  # items of the slate inside the train part
            sel = keep_len > 0
            if truncated and h_seq.size:
                sel &= req >= h_seq[0]
        else:
            sel = (req <= t) & (t < req + length)
            skip = np.where(sel, t - req, 0)  # the slate's items before the target: trained on
            keep_len = length - skip
            if stop >= 0:
                keep_len = np.minimum(keep_len, stop - t)
        idx = np.flatnonzero(sel)
        if idx.size == 0:
            return []
        asked = req[idx] + skip[idx]  # train: the slate's request; eval: the target
        hl = np.searchsorted(h_seq, asked, side="left")  # history events before it
        coin = keep_uniform(self.seed, uid, req[idx]) if self.keep_p < 1.0 else None
        out: list[Feedview] = []
        for n, i in enumerate(idx):
            lo = int(f_lo[c + i]) + int(skip[i])
            hi = lo + int(keep_len[i])
            labels = f_labels[lo:hi]
            if coin is not None and not (int(np.bitwise_or.reduce(labels)) & self._pos_mask):
                if not coin[n] < self.keep_p:
                    continue
            out.append(Feedview(
                request_ts=int(f_ts[c + i]) if not skip[i] else t_ts,
                request_seq=int(asked[n]),
                surface=int(f_surf[c + i]),
                item_ids=f_items[lo:hi].astype(np.int64),
                labels=labels.astype(np.int32),
                history_len=int(hl[n]),
            ))
        return out

    def _logged_feedviews(self, uid: int, t: int, h_seq: np.ndarray, truncated: bool, c: int, d: int,
                          f_req: np.ndarray, f_ts: np.ndarray, f_surf: np.ndarray, f_lo: np.ndarray, f_hi: np.ndarray,
                          f_items: np.ndarray, f_labels: np.ndarray, later_item: np.ndarray, later_act: np.ndarray,
                          later_seq: np.ndarray, stop: int = -1) -> list[Feedview]:
        """The user's slates for this role when the feedviews are logged impressions (see the module notes).
        ``later_*``: the user's events with ``seq >= t`` ([L], by seq; eval: the target first)."""
        if c == d:
            return []
        fv = np.arange(c, d)  # [f] this user's feedview rows
        req = f_req[c:d]
        if self.role == "train":
            sel = req < t
            if truncated and h_seq.size:
                sel &= req >= h_seq[0]
            fv = fv[sel]
            fv = fv[~_holding(fv, f_lo, f_hi, f_items, f_labels, later_item, later_act)]
        else:
            assert later_seq.size and later_seq[0] == t, "the target is the first event at or after t"
            fv = fv[req <= t]
            fv = fv[_holding(fv, f_lo, f_hi, f_items, f_labels, later_item[:1], later_act[:1])]
            if fv.size:
                fv = fv[f_ts[fv] == f_ts[fv].max()]  # the latest request holding it (ties: all of them)
        if fv.size == 0:
            return []
        drop_item = drop_bit = -1
        if self.role == "valid" and stop >= 0:  # the test target's label never reaches model selection
            j = int(np.searchsorted(later_seq, stop))
            if j < later_seq.size and later_seq[j] == stop:
                drop_item, drop_bit = int(later_item[j]), 1 << int(later_act[j])
        hl = np.searchsorted(h_seq, f_req[fv], side="left")  # history events before each request
        coin = keep_uniform(self.seed, uid, f_req[fv]) if self.keep_p < 1.0 else None
        out: list[Feedview] = []
        for n, i in enumerate(fv.tolist()):
            items, labels = f_items[f_lo[i]:f_hi[i]], f_labels[f_lo[i]:f_hi[i]]
            if drop_item >= 0:
                keep = ~((items == drop_item) & ((labels & drop_bit) != 0))
                items, labels = items[keep], labels[keep]
                if items.size == 0:
                    continue
            if coin is not None and not (int(np.bitwise_or.reduce(labels)) & self._pos_mask):
                if not coin[n] < self.keep_p:
                    continue
            out.append(Feedview(request_ts=int(f_ts[i]), request_seq=int(f_req[i]), surface=int(f_surf[i]),
                                item_ids=items.astype(np.int64), labels=labels.astype(np.int32),
                                history_len=int(hl[n])))
        return out


def _holding(fv: np.ndarray, f_lo: np.ndarray, f_hi: np.ndarray, f_items: np.ndarray, f_labels: np.ndarray,
             ev_item: np.ndarray, ev_act: np.ndarray) -> np.ndarray:
    """Per feedview row in ``fv`` [f]: does its slate show one of the events' items with that event's action bit?
    (The caller keeps only slates requested at or before the events.) -> [f] bool."""
    out = np.zeros(fv.size, dtype=bool)
    if ev_item.size == 0:
        return out
    for n, i in enumerate(fv.tolist()):
        items, labels = f_items[f_lo[i]:f_hi[i]], f_labels[f_lo[i]:f_hi[i]]
        cand = np.isin(items, ev_item)
        if cand.any():
            it, lab = items[cand], labels[cand].astype(np.int64)
            bit = (lab[:, None] >> ev_act[None, :].astype(np.int64)) & 1  # [k', L]
            out[n] = bool(((it[:, None] == ev_item[None, :]) & (bit == 1)).any())
    return out
