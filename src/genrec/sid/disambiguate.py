"""Collision handling: one extra SID level that makes every item's full code unique.

TIGER / PinGER append a final level to the semantic code: items that share the same
semantic prefix are numbered 0, 1, 2, ... Here the numbering order is fixed, so a rebuild on the
same inputs gives the same codes: ascending item_id, or (``popularity`` given) the most popular
item first, ties by ascending item_id -- then code 0 of the last level means "the most popular item
of its prefix" in every prefix, a meaning the model can learn once, where an id order gives the
last level no meaning shared across prefixes.

Non-standard here: :func:`extend_disambiguation` numbers NEW items against a frozen set
of existing full codes (PinGER: a new item is retrievable as soon as it has a code). A
new item gets ``1 + max(existing final code in its prefix)``, so old codes never change
and, because items are never removed, that is also the smallest free code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from genrec.errors import DataError

__all__ = ["Disambiguated", "collision_rate", "disambiguate", "extend_disambiguation", "check_item_ids",
           "lex_order"]


@dataclass(frozen=True)
class Disambiguated:
    """Full codes with the appended level, plus what the collisions looked like."""

    codes: np.ndarray  # int32[n, L+1]
    final_size: int  # size of the appended level's codebook (= largest collision group)
    max_group: int  # largest number of items sharing one semantic code
    collision_rate: float  # 1 - distinct semantic codes / n, before disambiguation


def check_item_ids(item_ids: object, n: int | None = None, *, name: str = "item_ids") -> np.ndarray:
    """int64[n] of distinct ids; DataError names a duplicate."""
    ids = np.asarray(item_ids)
    if ids.ndim != 1:
        raise DataError(f"expected a 1-D array, got shape {ids.shape}", field=name)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise DataError(f"expected integer ids, got dtype {ids.dtype}", field=name)
    ids = ids.astype(np.int64, copy=False)
    if n is not None and ids.shape[0] != n:
        raise DataError(f"has {ids.shape[0]} ids but there are {n} rows", field=name)
    s = np.sort(ids)
    dup = s[1:][s[1:] == s[:-1]]
    if dup.size:
        raise DataError(f"item id {int(dup[0])} appears more than once ({dup.size} duplicates)", field=name)
    return ids


def check_codes(codes: object, *, name: str = "codes") -> np.ndarray:
    """int64[n, L] of non-negative codes."""
    arr = np.asarray(codes)
    if arr.ndim != 2:
        raise DataError(f"expected a 2-D array [n, L], got shape {arr.shape}", field=name)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"expected integer codes, got dtype {arr.dtype}", field=name)
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        row = int(np.flatnonzero((arr < 0).any(axis=1))[0])
        raise DataError(f"row {row} has a negative code", field=name)
    return arr


def lex_order(codes: np.ndarray, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Permutation sorting the rows of ``codes`` [n, L] lexicographically (then by ``tiebreak``)."""
    keys = [codes[:, j] for j in range(codes.shape[1] - 1, -1, -1)]  # np.lexsort: last key is primary
    if tiebreak is not None:
        keys.insert(0, tiebreak)
    if not keys:
        return np.arange(codes.shape[0]) if tiebreak is None else np.argsort(tiebreak, kind="stable")
    return np.lexsort(keys)


def _group_starts(sorted_codes: np.ndarray) -> np.ndarray:
    """bool[n]: row i of the sorted codes starts a new group of identical rows."""
    n = sorted_codes.shape[0]
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = (sorted_codes[1:] != sorted_codes[:-1]).any(axis=1)
    return starts


def collision_rate(codes: object) -> float:
    """``1 - (#distinct rows / #rows)``: the share of items that a code table cannot tell apart."""
    arr = check_codes(codes)
    if arr.shape[0] == 0:
        return 0.0
    distinct = int(_group_starts(arr[lex_order(arr)]).sum())
    return 1.0 - distinct / arr.shape[0]


def disambiguate(codes: object, item_ids: object, popularity: object | None = None) -> Disambiguated:
    """Append a final level numbering items that share a semantic code by ascending item_id, or, with
    ``popularity`` (a number per item, e.g. its train interactions), by descending popularity, then id."""
    sem = check_codes(codes)
    ids = check_item_ids(item_ids, sem.shape[0])
    n = sem.shape[0]
    if popularity is None:
        order = lex_order(sem, tiebreak=ids)  # groups contiguous, ascending item_id inside
    else:
        pop = np.asarray(popularity, dtype=np.float64)
        if pop.shape != (n,) or not np.isfinite(pop).all():
            raise DataError(f"expected {n} finite numbers, got shape {pop.shape}", field="popularity")
        # np.lexsort: the last key is primary -- the semantic levels, then descending popularity, then id
        order = np.lexsort([ids, -pop, *(sem[:, j] for j in range(sem.shape[1] - 1, -1, -1))])
    s = sem[order]
    starts = _group_starts(s)
    group_first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))  # index of group start
    rank = np.arange(n) - group_first  # [n] 0,1,2,... within a group
    final = np.empty(n, dtype=np.int64)
    final[order] = rank
    max_group = int(rank.max()) + 1 if n else 0
    distinct = int(starts.sum())
    full = np.concatenate([sem, final[:, None]], axis=1).astype(np.int32)  # [n, L+1]
    return Disambiguated(codes=full, final_size=max(max_group, 1), max_group=max_group,
                         collision_rate=(1.0 - distinct / n) if n else 0.0)


def extend_disambiguation(existing: object, new_codes: object, new_item_ids: object) -> np.ndarray:
    """Final-level codes for new items, continuing each prefix's numbering in ``existing``.

    ``existing``: int[m, L+1] full codes already handed out. ``new_codes``: int[n, L]
    semantic codes of the new items. Returns int32[n, L+1]: inside one prefix the new
    items are numbered after the existing ones, in ascending item_id order.
    """
    old = check_codes(existing, name="existing")
    sem = check_codes(new_codes, name="new_codes")
    ids = check_item_ids(new_item_ids, sem.shape[0], name="new_item_ids")
    if old.shape[0] and old.shape[1] != sem.shape[1] + 1:
        raise DataError(f"existing codes have {old.shape[1]} levels, new semantic codes {sem.shape[1]} "
                        f"(expected {old.shape[1] - 1})", field="new_codes")
    n = sem.shape[0]
    if n == 0:
        return np.zeros((0, sem.shape[1] + 1), dtype=np.int32)
    # Next free final code per existing prefix: rows sorted by (prefix, final) -> last of group.
    if old.shape[0]:
        o = old[lex_order(old)]
        o_pref = o[:, :-1]
        last = np.ones(o.shape[0], dtype=bool)
        last[:-1] = (o_pref[1:] != o_pref[:-1]).any(axis=1)
        pref_u = o_pref[last]  # [g, L] sorted lexicographically
        next_free = o[last, -1] + 1  # [g]
    else:
        pref_u = np.zeros((0, sem.shape[1]), dtype=np.int64)
        next_free = np.zeros(0, dtype=np.int64)
    # Locate each new prefix among the existing ones: sort both together.
    both = np.concatenate([pref_u, sem], axis=0)
    src = np.concatenate([np.zeros(pref_u.shape[0], np.int64), np.ones(n, np.int64)])
    tie = np.concatenate([np.full(pref_u.shape[0], np.iinfo(np.int64).min), ids])
    order = lex_order(both, tiebreak=tie)  # [g+n]; the existing row (if any) first in its group
    b = both[order]
    starts = _group_starts(b)
    gid = np.cumsum(starts) - 1  # group index per sorted row
    is_old = src[order] == 0
    base = np.zeros(int(gid[-1]) + 1, dtype=np.int64)
    old_pos = order[is_old]  # indices into pref_u
    base[gid[is_old]] = next_free[old_pos]
    group_first = np.maximum.accumulate(np.where(starts, np.arange(b.shape[0]), 0))
    # within a group the existing row (if any) comes first, so subtract it from the rank
    has_old = np.zeros_like(base, dtype=bool)
    has_old[gid[is_old]] = True
    rank = np.arange(b.shape[0]) - group_first - has_old[gid].astype(np.int64)
    final_sorted = base[gid] + rank
    final = np.empty(n, dtype=np.int64)
    new_mask = ~is_old
    final[order[new_mask] - pref_u.shape[0]] = final_sorted[new_mask]
    return np.concatenate([sem, final[:, None]], axis=1).astype(np.int32)
