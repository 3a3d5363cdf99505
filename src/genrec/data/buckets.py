"""How the canonical tables are stored: the ``bucket`` column (the Iceberg spec's ``bucket[n](user_id)``), the
stored schemas and sort order, and the check every written chunk passes (:func:`conform`). Used by
:mod:`genrec.data.store` (which re-exports these names) and :mod:`genrec.data.append`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.data.schema import EVENTS_SCHEMA, FEEDVIEWS_SCHEMA, ITEMS_SCHEMA
from genrec.errors import DataError

BUCKET = "bucket"
TABLES = ("events", "feedviews", "items")
_SCHEMAS = {"events": EVENTS_SCHEMA, "feedviews": FEEDVIEWS_SCHEMA, "items": ITEMS_SCHEMA}
_BUCKETED = ("events", "feedviews")
_STORED_SCHEMAS = {name: _SCHEMAS[name].append(pa.field(BUCKET, pa.int32(), nullable=False)) if name in _BUCKETED
                   else _SCHEMAS[name] for name in TABLES}
_SORT_KEYS = {
    "events": [("user_id", "ascending"), ("seq", "ascending")],
    "feedviews": [("user_id", "ascending"), ("request_seq", "ascending")],
    "items": [("item_id", "ascending")],
}

# ----------------------------------------------------------------------------- hashing

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def _rotl32(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def murmur3_int64(values: np.ndarray) -> np.ndarray:
    """Vectorised 32-bit MurmurHash3 (x86, seed 0) of each int64's 8 little-endian bytes.

    This is the hash the Iceberg spec uses for ``bucket[N]`` of ``long`` columns
    (spec test vector: ``34 -> 2017239379``). Returns int32 (signed, like Java).
    """
    v = np.ascontiguousarray(values, dtype="<i8").view("<u4").reshape(-1, 2)  # [N, 2] lo, hi words
    h = np.zeros(v.shape[0], dtype=np.uint32)
    with np.errstate(over="ignore"):
        for j in range(2):
            k = v[:, j].astype(np.uint32) * _C1
            k = _rotl32(k, 15) * _C2
            h = h ^ k
            h = _rotl32(h, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        h = h ^ np.uint32(8)  # total length in bytes
        h = _fmix32(h)
    return h.view(np.int32)


def user_bucket(user_ids: np.ndarray | pa.Array | pa.ChunkedArray, n_buckets: int) -> np.ndarray:
    """Iceberg ``bucket[n_buckets](user_id)``: ``(murmur3(user_id) & 0x7FFFFFFF) % n_buckets`` as int32."""
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    if isinstance(user_ids, (pa.Array, pa.ChunkedArray)):
        user_ids = user_ids.to_numpy()
    h = murmur3_int64(np.asarray(user_ids, dtype=np.int64)).astype(np.int64)  # [N]
    return ((h & 0x7FFFFFFF) % n_buckets).astype(np.int32)


# ----------------------------------------------------------------------------- validation


def conform(table: pa.Table, name: str) -> pa.Table:
    """Select and cast ``table`` to the canonical schema of ``name``; bad input raises DataError."""
    schema = _SCHEMAS[name]
    cols = []
    for f in schema:
        if f.name not in table.column_names:
            raise DataError(f"missing column (has {table.column_names})", path=name, field=f.name)
        col = table.column(f.name)
        try:
            col = col.cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise DataError(f"cannot convert {col.type} to {f.type}: {e}", path=name, field=f.name) from e
        if not f.nullable and col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"null value in row {row} (column must not be null)", path=name, field=f.name)
        cols.append(col)
    out = pa.Table.from_arrays(cols, schema=schema)
    if name == "feedviews" and out.num_rows:
        n_items = pc.list_value_length(out.column("item_ids")).to_numpy()
        n_labels = pc.list_value_length(out.column("labels")).to_numpy()
        bad = np.flatnonzero(n_items != n_labels)
        if bad.size:
            r = int(bad[0])
            raise DataError(
                f"row {r}: {n_labels[r]} labels for {n_items[r]} slate items", path=name, field="labels"
            )
        if pc.any(pc.equal(n_items, 0)).as_py():
            r = int(np.flatnonzero(n_items == 0)[0])
            raise DataError(f"row {r}: empty slate", path=name, field="item_ids")
    return out


def layout(table: pa.Table, name: str, n_buckets: int) -> pa.Table:
    """A conformed table as it is stored: events/feedviews gain the ``bucket`` column; rows sorted by
    (bucket,) user and seq (items: by item_id)."""
    if name not in _BUCKETED:
        return table.sort_by(_SORT_KEYS[name])
    b = pa.array(user_bucket(table.column("user_id"), n_buckets), pa.int32())
    table = table.append_column(pa.field(BUCKET, pa.int32(), nullable=False), b)
    return table.sort_by([(BUCKET, "ascending"), *_SORT_KEYS[name]])
