"""Reading a log file's columns and its ids, shared by the events, items and impressions readers.

CSV (streamed, every value checked with its file and line) or Parquet (whole columns, the row
number reported in the ``line`` slot); ids that are not integers are found and numbered in
order of first appearance; the messages speak the CLI's words (``--map-ids``, ``--no-map-ids``).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from genrec.data.ingest.common import Column, Parsed, file_record, int_col, read_delimited, record_line
from genrec.data.ingest.options import ColumnMapping
from genrec.errors import DataError

INT_RE = r"^\s*[+-]?\d+\s*$"


@dataclass
class Loaded:
    """Columns of a generic file plus how to turn a row index into a line number."""

    path: Path
    columns: dict[str, Any]
    n: int
    is_csv: bool
    parsed: Any = None

    def line(self, row: int) -> int:
        if self.is_csv:
            return record_line(self.parsed, row, quoted=True)
        return row + 1


def find_file(folder: Path, stem: str) -> Path | None:
    for ext in (".parquet", ".csv"):
        if (folder / f"{stem}{ext}").is_file():
            return folder / f"{stem}{ext}"
    return None


def is_csv(path: Path) -> bool:
    return path.suffix.lower() in (".csv", ".tsv", ".txt")


def pick_delimiter(path: Path, given: str) -> str:
    """The default "," means a tab for a .tsv file; a delimiter someone chose is kept."""
    return "\t" if given == "," and path.suffix.lower() == ".tsv" else given


def not_compressed(path: Path) -> None:
    if path.suffix.lower() in (".gz", ".bz2", ".xz", ".zst", ".zip"):
        raise DataError(f"a compressed file ({path.suffix}): decompress it first (e.g. `gunzip -k`); events and "
                        "items are read from .csv / .tsv / .txt or Parquet files", path=path)


def parquet_array(path: Path, table: pa.Table, name: str) -> pa.Array:
    """One Parquet column as an Arrow array, present, without nulls, of scalars; errors name the 1-based row."""
    if name not in table.column_names:
        raise DataError(f"column missing; the file has {table.column_names}", path=path, field=name)
    arr = table.column(name).combine_chunks()
    if arr.null_count:
        r = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError("empty value (null)", path=path, line=r + 1, field=name)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_string(arr.type)
            or pa.types.is_large_string(arr.type) or pa.types.is_dictionary(arr.type)
            or pa.types.is_timestamp(arr.type) or pa.types.is_date(arr.type)
            or pa.types.is_boolean(arr.type)):  # lists, structs, binary, ...
        raise DataError(f"expected a column of scalar values, found type {arr.type}", path=path, field=name)
    return arr


def parquet_column(path: Path, table: pa.Table, col: Column) -> Any:
    """Validate one Parquet column like the CSV reader does; errors name the 1-based row."""
    arr = parquet_array(path, table, col.name)
    if col.kind == "text":
        return pc.cast(arr, pa.string())
    if col.kind == "str":
        arr = pc.cast(arr, pa.string()) if not pa.types.is_dictionary(arr.type) else arr
        return arr if pa.types.is_dictionary(arr.type) else pc.dictionary_encode(arr)
    if col.kind == "int":
        if pa.types.is_integer(arr.type):
            raw = arr.to_numpy()
            if raw.dtype == np.uint64 and (big := raw > np.uint64(2 ** 63 - 1)).any():
                r = int(np.flatnonzero(big)[0])
                raise DataError(f"integer out of the int64 range: {int(raw[r])}", path=path, line=r + 1,
                                field=col.name)
            a = raw.astype(np.int64)
        elif pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            ok = pc.match_substring_regex(arr, INT_RE).to_numpy(zero_copy_only=False)
            if not ok.all():
                r = int(np.flatnonzero(~ok)[0])
                raise DataError(f"not an integer: {arr[r].as_py()!r}", path=path, line=r + 1, field=col.name)
            a = pc.cast(pc.utf8_trim_whitespace(arr), pa.int64()).to_numpy()
        elif pa.types.is_floating(arr.type):
            f = arr.to_numpy()
            bad = ~np.isfinite(f) | (f != np.round(f))
            if bad.any():
                r = int(np.flatnonzero(bad)[0])
                why = "empty value (NaN)" if np.isnan(f[r]) else f"not an integer: {f[r].item()!r}"
                raise DataError(why, path=path, line=r + 1, field=col.name)
            a = f.astype(np.int64)
        elif pa.types.is_timestamp(arr.type):
            a = pc.cast(pc.cast(arr, pa.timestamp("s")), pa.int64()).to_numpy()
        else:
            raise DataError(f"expected an integer column, found type {arr.type}", path=path, field=col.name)
    else:
        a = pc.cast(arr, pa.float64()).to_numpy()
    if col.check is not None and not (ok := col.check(a)).all():
        r = int(np.flatnonzero(~ok)[0])
        v = a[r].item() if hasattr(a[r], "item") else a[r]
        raise DataError(f"invalid value {v!r}: expected {col.check_msg}", path=path, line=r + 1, field=col.name)
    return a


def load_columns(path: Path, columns: list[Column], delimiter: str, raw: tuple[str, ...] = ()) -> Loaded:
    """Read ``columns`` from a CSV (header line names them) or a Parquet file. Columns named in ``raw``
    come back from Parquet as Arrow arrays of the file's own type (timestamps, dates, ...), checked only
    for presence, nulls and scalar values; from a CSV they are read by their ``Column`` spec."""
    not_compressed(path)
    if is_csv(path):
        parsed = read_delimited(path, columns, delimiter=delimiter, header=True, quoted=True)
        return Loaded(path, dict(parsed.columns), parsed.n, True, parsed)
    table = read_parquet(path)
    if table.num_rows == 0:
        raise DataError("file has no rows", path=path, line=1, field=columns[0].name)
    return Loaded(path, {c.name: parquet_array(path, table, c.name) if c.name in raw else
                         parquet_column(path, table, c) for c in columns}, table.num_rows, False)


def read_parquet(path: Path, schema_only: bool = False) -> Any:
    try:
        return pq.read_schema(path) if schema_only else pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"not a readable Parquet file (events and items are read from .csv / .tsv / .txt or "
                        f"Parquet files): {e}", path=path) from None


def check_names(arr: Any, ev: "Loaded", field: str, what: str) -> None:
    """Text values that name something (an action, a surface, a remapped id) must be non-empty and trimmed:
    a DataError naming the first row that is not."""
    d = arr if isinstance(arr, (pa.Array, pa.ChunkedArray)) else pa.array(arr)
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    if not pa.types.is_dictionary(d.type):
        d = pc.dictionary_encode(d)
    if not (pa.types.is_string(d.dictionary.type) or pa.types.is_large_string(d.dictionary.type)):
        return  # integer ids: nothing to trim
    values = d.dictionary.to_pylist()
    bad = [i for i, v in enumerate(values) if not v.strip() or v != v.strip()]
    if bad:
        r = int(np.flatnonzero(np.isin(d.indices.to_numpy(zero_copy_only=False), bad))[0])
        v = values[int(d.indices[r].as_py())]
        why = "empty value" if not v.strip() else f"value {v!r} has leading or trailing whitespace"
        raise DataError(f"{why}: {what} must be non-empty and trimmed", path=ev.path, line=ev.line(r), field=field)


def first_appearance_codes(values: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Dense codes 0..K-1 in order of first appearance, and the originals by code. [N] -> [N]."""
    d = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
    idx = d.indices.to_numpy().astype(np.int64)
    uniq, first = np.unique(idx, return_index=True)
    order = np.argsort(first, kind="stable")  # codes by first appearance
    rank = np.empty(len(d.dictionary), dtype=np.int64)
    rank[uniq[order]] = np.arange(len(uniq))
    originals = d.dictionary.take(pa.array(uniq[order])).to_pylist()
    return rank[idx], originals


NO_MAP_HINT = "(--no-map-ids refuses ids that are not integers; without it they are numbered 0..n-1)"
INT_HINT = "(--map-ids reads ids as text and numbers them 0..n-1)"


def ids_hint(e: DataError, id_fields: tuple[str, ...], hint: str) -> DataError:
    """An id that is not an integer (or not one that fits): the message says which flag changes that."""
    if e.field in id_fields and (e.reason.startswith(("not an integer", "integer out of"))
                                 or "non-negative integer" in e.reason):
        return DataError(f"{e.reason} {hint}", path=e.path, line=e.line, field=e.field)
    return e


def plain_text(arr: Any) -> pa.Array:
    d = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    return d if pa.types.is_string(d.type) else pc.cast(d, pa.string())


def text_ids(arr: Any, ev: "Loaded", field: str) -> np.ndarray | None:
    """Text ids -> int64 [N] when every value is an integer, else None (they need mapping). Integers read as
    such (a Parquet integer column) come back as they are.

    An empty value is an error either way; an integer beyond int64 or below 0 is an error naming its line.
    """
    if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
        return np.asarray(arr, dtype=np.int64)
    t = pc.utf8_trim_whitespace(plain_text(arr))  # [N]
    if (empty := pc.equal(t, "").to_numpy(zero_copy_only=False)).any():
        r = int(np.flatnonzero(empty)[0])
        raise DataError("empty value: expected an id", path=ev.path, line=ev.line(r), field=field)
    if not pc.all(pc.match_substring_regex(t, INT_RE)).as_py():
        return None
    try:
        ints = pc.cast(t, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        r = next(i for i, v in enumerate(t.to_pylist()) if not -(2 ** 63) <= int(v) < 2 ** 63)
        raise DataError(f"integer out of the int64 range: {t[r].as_py()!r} {INT_HINT}", path=ev.path,
                        line=ev.line(r), field=field) from None
    if (neg := ints < 0).any():
        r = int(np.flatnonzero(neg)[0])
        raise DataError(f"invalid value {int(ints[r])}: expected a non-negative integer {INT_HINT}", path=ev.path,
                        line=ev.line(r), field=field)
    return ints


def first_non_integer(arr: Any) -> tuple[int, str] | None:
    """(row, value) of the first text id that is not an integer; None for an integer column."""
    if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
        return None
    t = plain_text(arr)
    ok = pc.match_substring_regex(t, INT_RE).to_numpy(zero_copy_only=False)
    if ok.all():
        return None
    r = int(np.flatnonzero(~ok)[0])
    return r, str(t[r].as_py())


def as_text(arr: Any) -> pa.Array:
    """Ids as a dictionary of their text: what mapping numbers (an integer column's ids as decimals)."""
    if isinstance(arr, (pa.Array, pa.ChunkedArray)):
        return arr
    return pc.dictionary_encode(pc.cast(pa.array(np.asarray(arr, dtype=np.int64)), pa.string()))


def locate_items_csv_error(path: Path, n_fields: int, delimiter: str) -> DataError | None:
    """Slow scan of an items CSV for the first record with the wrong number of fields."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        return DataError(f"not UTF-8: {e.reason}", path=path, line=path.read_bytes()[: e.start].count(b"\n") + 1)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    for rec in reader:
        if rec and len(rec) != n_fields:
            return DataError(f"expected {n_fields} fields (as in the header), found {len(rec)}", path=path,
                             line=reader.line_num)
    return None
