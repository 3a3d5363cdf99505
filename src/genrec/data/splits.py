"""Deterministic train / valid / test splits of the events table, as per-user ``seq`` cutoffs.

Two protocols (no randomness in either):

* ``loo`` -- leave-one-out, the SASRec / TIGER / HSTU protocol (PinGER §4.1 follows it on
  the public benchmarks). Per user with ``n`` events in ``seq`` order: the test target is
  the last event, the valid target the one before it, train is everything before the
  valid target. The valid case's history is the train events; the test case's history is
  train + the valid target. Users with fewer than 3 events have no valid/test case and
  all their events are train (the usual practice: SASRec's ``data_partition``).
* ``temporal`` -- a global time cut ``cut_ts`` (given, or the ``cut_quantile`` of all
  event timestamps: the ``floor(q * (N - 1))``-th smallest, so about ``q`` of events are
  before it). Per user, the **test** target is the first event (by ``seq``) with
  ``timestamp >= cut_ts`` and its history everything before it; users with no event
  before the cut (cold start) or none after it have no test case. The **valid** target is
  the user's last pre-cut event (only when the user has at least 2 pre-cut events), with
  the pre-cut events before it as history. Train is the pre-cut events *minus* the valid
  target -- the same shape as leave-one-out, so model selection never trains on valid
  targets. (A second time cut was rejected: it would leave most users without a valid
  case on short-history data such as MovieLens.)

Everything is expressed as three int32 ``seq`` values per user -- train is ``seq <
train_end``; a case's history is ``seq < target_seq`` -- which is what the in-trainer
join (:mod:`genrec.data.join`) needs to cut sequences and feedview slates per bucket.
Events are assumed ordered in time by ``seq`` (the canonical schema guarantees it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import pyarrow as pa

from genrec.errors import ConfigError, DataError

SplitKind = Literal["loo", "temporal"]
SplitRole = Literal["train", "valid", "test"]
NONE = -1


@dataclass(frozen=True)
class SplitSpec:
    """Which protocol, and for ``temporal`` where the cut is."""

    kind: SplitKind = "loo"
    cut_ts: int | None = None
    """Temporal: events with ``timestamp >= cut_ts`` are after the cut. ``None``: use ``cut_quantile``."""
    cut_quantile: float = 0.9

    def __post_init__(self) -> None:
        if self.kind not in ("loo", "temporal"):
            raise ConfigError(f"split.kind must be 'loo' or 'temporal', got {self.kind!r}")
        if not (0.0 < self.cut_quantile < 1.0):
            raise ConfigError(f"split.cut_quantile must be in (0, 1), got {self.cut_quantile!r}")
        if self.kind == "loo" and self.cut_ts is not None:
            raise ConfigError("split.cut_ts only applies to kind='temporal'")

    def resolve(self, timestamps: np.ndarray | pa.Array | pa.ChunkedArray) -> "SplitSpec":
        """This spec with ``cut_ts`` fixed from all ``timestamps`` (no-op for loo or a given cut)."""
        if self.kind != "temporal" or self.cut_ts is not None:
            return self
        ts = _np(timestamps, np.int64)
        if ts.size == 0:
            raise DataError("no events to place a temporal cut in", path="events", field="timestamp")
        k = int(np.floor(self.cut_quantile * (ts.size - 1)))
        cut = int(np.partition(ts, k)[k])
        return replace(self, cut_ts=cut)


@dataclass(frozen=True)
class SplitCutoffs:
    """Per-user cutoffs, users sorted by id. ``-1`` in ``valid_seq`` / ``test_seq`` = no case."""

    user_id: np.ndarray  # int64 [U], sorted ascending
    train_end: np.ndarray  # int32 [U]; train events have seq < train_end
    valid_seq: np.ndarray  # int32 [U]; valid target seq (history: seq < valid_seq) or -1
    test_seq: np.ndarray  # int32 [U]; test target seq (history: seq < test_seq) or -1
    spec: SplitSpec

    def __len__(self) -> int:
        return int(self.user_id.size)

    def index(self, user_ids: np.ndarray) -> np.ndarray:
        """Row of each user in these arrays; raises if a user is unknown."""
        user_ids = np.asarray(user_ids, dtype=np.int64)
        idx = np.searchsorted(self.user_id, user_ids)
        idx_c = np.minimum(idx, max(self.user_id.size - 1, 0))
        if self.user_id.size == 0 or not np.array_equal(self.user_id[idx_c], user_ids):
            raise KeyError("user id(s) not in the split cutoffs")
        return idx_c

    def target_seq(self, role: SplitRole) -> np.ndarray:
        """int32 [U]: the target per user for an eval role; for ``train``, ``train_end`` (exclusive end)."""
        if role == "train":
            return self.train_end
        if role == "valid":
            return self.valid_seq
        if role == "test":
            return self.test_seq
        raise ValueError(f"role must be 'train', 'valid' or 'test', got {role!r}")


@dataclass(frozen=True)
class EvalCases:
    """One row per evaluated user: the target event; its history is that user's ``seq < target_seq``."""

    user_id: np.ndarray  # int64 [C]
    target_item: np.ndarray  # int64 [C]
    target_seq: np.ndarray  # int32 [C]
    target_ts: np.ndarray  # int64 [C]
    target_action: np.ndarray  # object [C] (action names)
    n_history: np.ndarray  # int32 [C]: events with seq < target_seq

    def __len__(self) -> int:
        return int(self.user_id.size)


def _np(a: np.ndarray | pa.Array | pa.ChunkedArray, dtype: type) -> np.ndarray:
    if isinstance(a, (pa.Array, pa.ChunkedArray)):
        a = a.to_numpy()
    return np.asarray(a, dtype=dtype)


def _sorted_events(events: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(order, user, seq, ts, group starts) with rows sorted by (user_id, seq); checks (user, seq) unique."""
    for f in ("user_id", "seq", "timestamp"):
        if f not in events.column_names:
            raise DataError("missing column", path="events", field=f)
    u = _np(events.column("user_id"), np.int64)
    s = _np(events.column("seq"), np.int64)
    order = np.lexsort((s, u))  # [N]
    u, s = u[order], s[order]
    ts = _np(events.column("timestamp"), np.int64)[order]
    dup = np.flatnonzero((u[1:] == u[:-1]) & (s[1:] == s[:-1]))
    if dup.size:
        i = int(dup[0])
        raise DataError(f"user {u[i]} has two events with seq {s[i]}", path="events", field="seq")
    if u.size:
        starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    else:
        starts = np.zeros(0, dtype=np.int64)
    return order, u, s, ts, starts


def compute_cutoffs(events: pa.Table, spec: SplitSpec) -> SplitCutoffs:
    """Per-user cutoffs of ``spec`` over ``events`` (needs ``user_id``, ``seq``, ``timestamp``).

    For ``temporal`` with ``cut_ts=None`` the cut is the quantile of *these* events' timestamps;
    call :meth:`SplitSpec.resolve` on the full table first when ``events`` is one bucket.
    """
    _, u, s, ts, starts = _sorted_events(events)
    spec = spec.resolve(ts)
    if u.size == 0:
        e = np.zeros(0, dtype=np.int32)
        return SplitCutoffs(np.zeros(0, dtype=np.int64), e, e, e, spec)
    ends = np.r_[starts[1:], u.size].astype(np.int64)  # [U] exclusive
    n = ends - starts
    users = u[starts]
    if spec.kind == "loo":
        ok = n >= 3
        last = s[ends - 1]
        second = np.where(ok, s[np.maximum(ends - 2, 0)], NONE)
        test = np.where(ok, last, NONE)
        valid = second
        train_end = np.where(ok, second, last + 1)
    else:
        cut = int(spec.cut_ts)  # type: ignore[arg-type]
        big = np.int64(u.size)
        pos = np.where(ts >= cut, np.arange(u.size, dtype=np.int64), big)  # [N]
        first_post = np.minimum.reduceat(pos, starts)  # [U]
        first_post = np.minimum(first_post, ends)  # == ends when no post-cut event
        n_pre = first_post - starts
        has_test = (first_post < ends) & (n_pre >= 1)
        test = np.where(has_test, s[np.minimum(first_post, u.size - 1)], NONE)
        has_valid = n_pre >= 2
        last_pre = s[np.maximum(first_post - 1, 0)]
        valid = np.where(has_valid, last_pre, NONE)
        first_seq = s[starts]
        train_end = np.where(has_valid, last_pre, np.where(n_pre >= 1, last_pre + 1, first_seq))
    return SplitCutoffs(
        user_id=users.astype(np.int64),
        train_end=np.asarray(train_end, dtype=np.int32),
        valid_seq=np.asarray(valid, dtype=np.int32),
        test_seq=np.asarray(test, dtype=np.int32),
        spec=spec,
    )


def _row_cutoff(events: pa.Table, cut: SplitCutoffs, per_user: np.ndarray) -> np.ndarray:
    idx = cut.index(_np(events.column("user_id"), np.int64))
    return per_user[idx]


def train_events(events: pa.Table, spec: SplitSpec | SplitCutoffs) -> pa.Table:
    """The rows of ``events`` that are train under ``spec`` (order preserved)."""
    cut = spec if isinstance(spec, SplitCutoffs) else compute_cutoffs(events, spec)
    if events.num_rows == 0:
        return events
    end = _row_cutoff(events, cut, cut.train_end)
    keep = _np(events.column("seq"), np.int64) < end
    return events.filter(pa.array(keep))


def history_events(events: pa.Table, spec: SplitSpec | SplitCutoffs, split: Literal["valid", "test"]) -> pa.Table:
    """The rows of ``events`` that ``split``'s cases may read (order preserved): each user's events before their
    ``split`` target, and a user without one their train events. No target of ``split`` is among them."""
    cut = spec if isinstance(spec, SplitCutoffs) else compute_cutoffs(events, spec)
    if events.num_rows == 0:
        return events
    tgt = cut.target_seq(split)
    end = _row_cutoff(events, cut, np.where(tgt >= 0, tgt, cut.train_end))
    return events.filter(pa.array(_np(events.column("seq"), np.int64) < end))


def eval_cases(events: pa.Table, spec: SplitSpec | SplitCutoffs, split: Literal["valid", "test"] = "valid") -> EvalCases:
    """The valid or test targets under ``spec``, one per user that has one, sorted by user id."""
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    cut = spec if isinstance(spec, SplitCutoffs) else compute_cutoffs(events, spec)
    target = cut.target_seq(split)
    order, u, s, ts, starts = _sorted_events(events)
    if u.size == 0:
        e = np.zeros(0, dtype=np.int64)
        return EvalCases(e, e, e.astype(np.int32), e, np.zeros(0, dtype=object), e.astype(np.int32))
    row_target = target[cut.index(u)]  # [N]
    hit = np.flatnonzero(s == row_target)  # rows that are a target (row_target = -1 never matches: seq >= 0)
    hit = hit[s[hit] >= 0]
    starts_of_row = np.repeat(starts, np.diff(np.r_[starts, u.size]))  # [N] group start per sorted row
    item = _np(events.column("item_id"), np.int64)[order]
    action = np.asarray(events.column("action").to_pylist(), dtype=object)[order] if events.num_rows else np.zeros(0, dtype=object)
    return EvalCases(
        user_id=u[hit],
        target_item=item[hit],
        target_seq=s[hit].astype(np.int32),
        target_ts=ts[hit],
        target_action=action[hit],
        n_history=(hit - starts_of_row[hit]).astype(np.int32),
    )


def split_counts(cut: SplitCutoffs) -> dict[str, int]:
    """Users with a valid / test case (cheap summary for manifests and reports)."""
    return {
        "users": len(cut),
        "valid_cases": int((cut.valid_seq >= 0).sum()),
        "test_cases": int((cut.test_seq >= 0).sum()),
    }


__all__ = [
    "EvalCases",
    "SplitCutoffs",
    "SplitSpec",
    "compute_cutoffs",
    "eval_cases",
    "split_counts",
    "train_events",
]
