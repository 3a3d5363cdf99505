"""From parsed columns to a canonical :class:`~genrec.data.schema.Dataset`.

Every ingestor ends here, so the ordering rule lives in one place: per user, events are
sorted by (timestamp, original file order) -- a stable sort -- and ``seq`` = 0..n-1; the
events table is sorted by (user_id, seq). Feedviews follow :mod:`.feedviews`, or, given an
impressions file, :mod:`.impressions` (its requests replace the synthesised ones).

Referential integrity: an event whose item is not in the items table is either an error
(``missing_item`` returns the DataError naming the line) or, for datasets whose items are
defined by the events (Amazon without a text row, Taobao), gets a synthesised minimal row
(``synthesise`` returns it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from genrec.data.ingest.feedviews import DEFAULT_SLATE_SIZE, build_feedviews, feedview_rule_text
from genrec.data.ingest.impressions import Impressions
from genrec.data.schema import EVENTS_SCHEMA, ITEMS_SCHEMA, Dataset, DatasetInfo
from genrec.errors import DataError


@dataclass
class ItemRows:
    """Items table under construction (one entry per item, in any order)."""

    item_id: list[int]
    title: list[str | None]
    text: list[str]
    attributes: list[dict[str, Any]]

    @classmethod
    def empty(cls) -> "ItemRows":
        return cls([], [], [], [])

    def add(self, item_id: int, title: str | None, text: str, attributes: dict[str, Any]) -> None:
        self.item_id.append(int(item_id))
        self.title.append(title)
        self.text.append(text)
        self.attributes.append(attributes)

    def __len__(self) -> int:
        return len(self.item_id)


def check_unique_ids(ids: list[int], lines: list[int], *, path: Any, field: str) -> None:
    """Duplicate item ids in an items file -> DataError on the second occurrence's line."""
    seen: dict[int, int] = {}
    for i, line in zip(ids, lines):
        if i in seen:
            raise DataError(f"duplicate item id {i} (first defined on line {seen[i]})", path=path, line=line,
                            field=field)
        seen[i] = line


def items_table(rows: ItemRows | pa.Table) -> pa.Table:
    """Rows (or an already-built table, e.g. vectorised Taobao items) -> ITEMS_SCHEMA sorted by item_id."""
    if isinstance(rows, pa.Table):
        return rows.cast(ITEMS_SCHEMA).sort_by("item_id")
    order = np.argsort(np.asarray(rows.item_id, dtype=np.int64), kind="stable")
    return pa.Table.from_arrays(
        [
            pa.array([rows.item_id[i] for i in order], pa.int64()),
            pa.array([rows.title[i] for i in order], pa.string()),
            pa.array([rows.text[i] for i in order], pa.string()),
            pa.array([json.dumps(rows.attributes[i], ensure_ascii=False, sort_keys=True) for i in order], pa.string()),
        ],
        schema=ITEMS_SCHEMA,
    )


def order_events(user: np.ndarray, timestamp: np.ndarray) -> np.ndarray:
    """Permutation sorting by (user, timestamp, original position). [N] -> [N] int64.

    Fast path: (user, timestamp) packed into one int64 key and sorted once with a stable
    sort (timsort exploits the user-sorted runs most logs already have); an already
    sorted log costs one comparison pass. Fallback: ``np.lexsort`` (also stable).
    """
    n = len(user)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    umin, umax = int(user.min()), int(user.max())
    tmin, tmax = int(timestamp.min()), int(timestamp.max())
    span = tmax - tmin + 1
    if (umax - umin + 1) * span < 2**62:
        key = (user - umin) * span + (timestamp - tmin)  # [N] int64, order-preserving
        if bool(np.all(key[1:] >= key[:-1])):
            return np.arange(n, dtype=np.int64)
        return np.argsort(key, kind="stable")
    return np.lexsort((timestamp, user)).astype(np.int64)


def member(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    """``np.isin(values, known)`` via a lookup table when the id range is small. [N] -> [N] bool."""
    if len(known) == 0 or len(values) == 0:
        return np.zeros(len(values), dtype=bool)
    lo, hi = int(known.min()), int(known.max())
    if hi - lo < max(4 * (len(values) + len(known)), 1 << 20):
        lut = np.zeros(hi - lo + 1, dtype=bool)
        lut[known - lo] = True
        inside = (values >= lo) & (values <= hi)
        out = np.zeros(len(values), dtype=bool)
        out[inside] = lut[values[inside] - lo]
        return out
    return np.isin(values, known)


def count_distinct(values: np.ndarray) -> int:
    """Number of distinct ints in ``values`` (a bitmap when the range is small)."""
    if len(values) == 0:
        return 0
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < max(4 * len(values), 1 << 20):
        seen = np.zeros(hi - lo + 1, dtype=bool)
        seen[values - lo] = True
        return int(np.count_nonzero(seen))
    return int(len(np.unique(values)))


def seq_within_user(user_sorted: np.ndarray) -> np.ndarray:
    """0..n-1 per user for a user-sorted array. [N] -> [N] int32."""
    n = len(user_sorted)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    start = np.ones(n, dtype=bool)
    start[1:] = user_sorted[1:] != user_sorted[:-1]
    first = np.flatnonzero(start)  # [U]
    counts = np.diff(np.append(first, n))  # [U]
    return (np.arange(n, dtype=np.int64) - np.repeat(first, counts)).astype(np.int32)


def vocab_column(idx: np.ndarray, vocab: list[str]) -> pa.Array:
    """Indices into ``vocab`` -> the string column. [N] -> [N]."""
    return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)), pa.array(vocab, pa.string())).cast(
        pa.string())


def events_table(user: np.ndarray, item: np.ndarray, surface_idx: np.ndarray, action_idx: np.ndarray,
                 timestamp: np.ndarray, seq: np.ndarray, info: DatasetInfo) -> pa.Table:
    """The events table from [N] columns already sorted by (user, seq); surfaces and actions as indices into
    ``info``'s vocabularies."""
    return pa.Table.from_arrays(
        [pa.array(user), pa.array(item), vocab_column(surface_idx, info.surfaces),
         vocab_column(action_idx, info.actions), pa.array(timestamp), pa.array(seq)],
        schema=EVENTS_SCHEMA,
    )


def build_dataset(
    info: DatasetInfo,
    *,
    user: np.ndarray,
    item: np.ndarray,
    timestamp: np.ndarray,
    action_idx: np.ndarray,
    surface_idx: np.ndarray | None,
    items: ItemRows | pa.Table,
    source: dict[str, Any],
    slate_size: int = DEFAULT_SLATE_SIZE,
    missing_item: Callable[[int], DataError] | None = None,
    synthesise: Callable[[int], tuple[str | None, str, dict[str, Any]]] | None = None,
    impressions: Impressions | None = None,
) -> Dataset:
    """Sort, number, check and package one dataset. Event arrays are [N] in file order. ``impressions``: logged
    slates that replace the synthesised feedviews (their items are checked / synthesised like the events')."""
    n = len(user)
    if not (len(item) == len(timestamp) == len(action_idx) == n):
        raise ValueError("event columns differ in length")
    if surface_idx is None:
        surface_idx = np.zeros(n, dtype=np.int8)
    user = np.asarray(user, dtype=np.int64)
    item = np.asarray(item, dtype=np.int64)
    timestamp = np.asarray(timestamp, dtype=np.int64)

    known = (items.column("item_id").to_numpy() if isinstance(items, pa.Table)
             else np.asarray(items.item_id, dtype=np.int64))
    bad = ~member(item, known)  # [N]
    bad_shown = ~member(impressions.item, known) if impressions is not None else np.zeros(0, dtype=bool)  # [S]
    n_synth = 0
    if bad.any() or bad_shown.any():
        if synthesise is None:
            if bad.any():
                r = int(np.flatnonzero(bad)[0])
                if missing_item is not None:
                    raise missing_item(r)
                raise DataError(f"event {r} refers to item {int(item[r])}, which is not in the items table")
            assert impressions is not None
            j = int(np.flatnonzero(bad_shown)[0])
            if impressions.missing_item is not None:
                raise impressions.missing_item(j)
            raise DataError(f"item {int(impressions.item[j])} is not in the items table", path=impressions.path,
                            line=impressions.line(int(impressions.row[j])))
        extra = ItemRows.empty()
        missing = item[bad] if impressions is None else np.concatenate([item[bad], impressions.item[bad_shown]])
        for i in np.unique(missing).tolist():
            title, text, attrs = synthesise(int(i))
            extra.add(int(i), title, text, attrs)
            n_synth += 1
        if isinstance(items, pa.Table):
            items = pa.concat_tables([items.cast(ITEMS_SCHEMA), items_table(extra)])
        else:
            for k in range(len(extra)):
                items.add(extra.item_id[k], extra.title[k], extra.text[k], extra.attributes[k])

    order = order_events(user, timestamp)  # [N]
    u, it, ts = user[order], item[order], timestamp[order]
    act, surf = action_idx[order], surface_idx[order]
    seq = seq_within_user(u)

    events = events_table(u, it, surf, act, ts, seq, info)
    if impressions is None:
        feedviews = build_feedviews(user=u, seq=seq, timestamp=ts, item=it, action_idx=act, surface_idx=surf,
                                    surfaces=info.surfaces, slate_size=slate_size)
        info.feedview_rule = feedview_rule_text(slate_size, info.actions)
        fv_counts: dict[str, Any] = {"slate_size": slate_size}
    else:
        feedviews = impressions.table(u, ts, info.surfaces)
        info.feedview_rule, info.impressions = impressions.rule, True
        fv_counts = {}
    items_tab = items_table(items)
    info.extra.update(
        {
            **fv_counts,
            "counts": {
                "events": int(n),
                "users": int(1 + np.count_nonzero(u[1:] != u[:-1])) if n else 0,
                "items": items_tab.num_rows,
                "interacted_items": count_distinct(it),
                "requests": feedviews.num_rows,
                "synthesised_items": n_synth,
                **({} if impressions is None else {"shown_items": int(len(impressions.item)),
                                                   "impression_only_items": int(np.count_nonzero(
                                                       impressions.labels == 0))}),
                "actions": {a: int(c) for a, c in zip(info.actions, np.bincount(act, minlength=len(info.actions)))},
            },
        }
    )
    return Dataset(info=info, events=events, items=items_tab, feedviews=feedviews, source=source)
