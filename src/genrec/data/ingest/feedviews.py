"""Feedviews synthesised from interaction logs (none of the shipped datasets has impressions).

UniPinRec (Masked Action Modeling) trains on *feedviews*: one request, the slate shown,
and per slate item the actions taken. Public logs only hold the interactions, so we form
pseudo-requests: each user's time-ordered events are cut into consecutive chunks of
``slate_size`` starting at ``seq`` 0 (the last chunk may be shorter); a chunk is one request
whose slate is the chunk's items, labelled ``1 << action_index[action]``. A chunk never
spans two surfaces: a change of surface starts a new chunk (irrelevant for the
single-surface datasets, where the rule is exactly "chunks of ``slate_size`` from seq 0").

:func:`build_feedviews` is the vectorised version; :func:`feedviews_reference` is its slow,
obviously-correct twin used by the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from genrec.data.schema import FEEDVIEWS_SCHEMA

DEFAULT_SLATE_SIZE = 8


def action_bits_text(actions: list[str]) -> str:
    """Which label bit each action sets, as the feedview rules state it: ``"like=bit 0, view=bit 1"``."""
    return ", ".join(f"{a}=bit {i}" for i, a in enumerate(actions))


def feedview_rule_text(slate_size: int, actions: list[str]) -> str:
    """The precise English statement stored in ``DatasetInfo.feedview_rule``."""
    bits = action_bits_text(actions)
    return (
        f"Synthesised from interactions (no impression log): each user's events, ordered by seq "
        f"(timestamp, then original file order), are cut into consecutive chunks of {slate_size} "
        f"starting at seq 0; a new chunk also starts where the surface changes, and the last chunk "
        f"of a run may be shorter. Each chunk is one request: request_ts = timestamp of its first "
        f"event, request_seq = seq of its first event, surface = the chunk's surface, item_ids = "
        f"the chunk's items in seq order, labels[j] = 1 << index(action of event j) ({bits}). "
        f"Exactly one bit is set per slate item; there are no impression-only (label 0) items."
    )


def chunk_starts(user: np.ndarray, surface: np.ndarray, slate_size: int) -> np.ndarray:
    """Indices of the first event of every request. Inputs sorted by (user, seq); [N] -> [R]."""
    if slate_size < 1:
        raise ValueError(f"slate_size must be >= 1, got {slate_size}")
    n = len(user)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    run_start = np.ones(n, dtype=bool)  # [N] first event of a (user, surface) run
    run_start[1:] = (user[1:] != user[:-1]) | (surface[1:] != surface[:-1])
    first = np.flatnonzero(run_start)  # [U'] first event of each run
    counts = np.diff(np.append(first, n))  # [U']
    pos = np.arange(n, dtype=np.int64) - np.repeat(first, counts)  # [N] position inside the run
    return np.flatnonzero(pos % slate_size == 0)


def build_feedviews(
    *,
    user: np.ndarray,
    seq: np.ndarray,
    timestamp: np.ndarray,
    item: np.ndarray,
    action_idx: np.ndarray,
    surface_idx: np.ndarray,
    surfaces: list[str],
    slate_size: int = DEFAULT_SLATE_SIZE,
) -> pa.Table:
    """Feedviews table from events already sorted by (user_id, seq). All inputs are [N]."""
    n = len(user)
    starts = chunk_starts(user, surface_idx, slate_size)  # [R]
    offsets = np.append(starts, n).astype(np.int32 if n < 2**31 else np.int64)  # [R+1]
    labels = np.left_shift(np.int32(1), action_idx.astype(np.int32))  # [N]
    surf = pa.DictionaryArray.from_arrays(pa.array(surface_idx[starts].astype(np.int32)),
                                          pa.array(surfaces, pa.string())).cast(pa.string())
    list_cls = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    item_lists = list_cls.from_arrays(pa.array(offsets), pa.array(item.astype(np.int64)))
    label_lists = list_cls.from_arrays(pa.array(offsets), pa.array(labels, pa.int32()))
    return pa.Table.from_arrays(
        [
            pa.array(user[starts].astype(np.int64)),
            pa.array(timestamp[starts].astype(np.int64)),
            pa.array(seq[starts].astype(np.int32)),
            surf,
            item_lists.cast(FEEDVIEWS_SCHEMA.field("item_ids").type),
            label_lists.cast(FEEDVIEWS_SCHEMA.field("labels").type),
        ],
        schema=FEEDVIEWS_SCHEMA,
    )


def feedviews_reference(events: list[dict[str, Any]], actions: list[str], slate_size: int) -> list[dict[str, Any]]:
    """Slow twin: the rule applied with plain loops to rows ``{user_id, seq, timestamp, item_id, action, surface}``."""
    index = {a: i for i, a in enumerate(actions)}
    by_user: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        by_user.setdefault(e["user_id"], []).append(e)
    out: list[dict[str, Any]] = []
    for u in sorted(by_user):
        evs = sorted(by_user[u], key=lambda e: e["seq"])
        current: list[dict[str, Any]] = []
        for e in evs:
            if current and (len(current) == slate_size or current[-1]["surface"] != e["surface"]):
                out.append(_request(u, current, index))
                current = []
            current.append(e)
        if current:
            out.append(_request(u, current, index))
    return out


def _request(user: int, chunk: list[dict[str, Any]], index: dict[str, int]) -> dict[str, Any]:
    return {
        "user_id": user,
        "request_ts": chunk[0]["timestamp"],
        "request_seq": chunk[0]["seq"],
        "surface": chunk[0]["surface"],
        "item_ids": [e["item_id"] for e in chunk],
        "labels": [1 << index[e["action"]] for e in chunk],
    }
