"""Generic ingestor: your own events as Parquet or CSV, named through a :class:`ColumnMapping`.

``source`` is the events file, or a folder holding ``events.parquet`` / ``events.csv``. The
items file is optional (``IngestOptions.items_path``, else ``items.parquet`` / ``items.csv``
beside the events). Without it, items are synthesised from the events (policy: one row per
item, ``title = None``). With it, an event whose item has no row is a DataError naming the
events line (CSV) or row (Parquet, 1-based; reported in the ``line`` slot).

Ids: integer ids are kept. A user or item id column with a value that is not an integer
(``u196``, ``B07``) is mapped (``IngestOptions.map_ids=None``, the default; a note says so):
users and items are numbered 0..n-1 in order of first appearance in the events file (items
only in the items file come after), the original item id kept in
``items.attributes["original_id"]`` and the original user id in ``DatasetInfo.extra["user_ids"]``
(original ids listed by new id), so ``genrec recommend`` takes and shows the source's ids.
``map_ids=True`` (``--map-ids``) maps integer ids too; ``map_ids=False`` (``--no-map-ids``)
refuses a non-integer id with a DataError naming its line.

Timestamps: see :mod:`.timestamps` (ISO 8601 text, epoch seconds or milliseconds, a strptime
pattern, Arrow timestamps and dates; all stored as epoch seconds, the rule in
``DatasetInfo.time_rule``). Errors name the file, the 1-based line and the field, and speak
the CLI's words (``--map-ids``, ``--time-format``).

Impressions (``IngestOptions.impressions_path``, ``--impressions``): a log of the slates users were shown,
one row per shown item; its requests replace the synthesised feedviews. Format and rules:
:mod:`.impressions`.

Notes for the person (ids mapped, timestamps without a zone read as UTC) are listed in
``DatasetInfo.extra["notes"]``; ``genrec data prepare`` prints them.
"""

from __future__ import annotations

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

from genrec.data.ingest.build import ItemRows, build_dataset
from genrec.data.ingest.common import Column, Parsed, file_record, int_col, read_delimited, record_line
from genrec.data.ingest.options import ColumnMapping, IngestOptions
from genrec.data.ingest.timestamps import Where, to_epoch_seconds
from genrec.data.schema import Dataset, DatasetInfo
from genrec.errors import ConfigError, DataError, MissingDataError

DEFAULT_ACTION = "interact"
DEFAULT_SURFACE = "default"
_INT_RE = r"^\s*[+-]?\d+\s*$"


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


def _find(folder: Path, stem: str) -> Path | None:
    for ext in (".parquet", ".csv"):
        if (folder / f"{stem}{ext}").is_file():
            return folder / f"{stem}{ext}"
    return None


def _is_csv(path: Path) -> bool:
    return path.suffix.lower() in (".csv", ".tsv", ".txt")


def _delimiter(path: Path, given: str) -> str:
    """The default "," means a tab for a .tsv file; a delimiter someone chose is kept."""
    return "\t" if given == "," and path.suffix.lower() == ".tsv" else given


def _not_compressed(path: Path) -> None:
    if path.suffix.lower() in (".gz", ".bz2", ".xz", ".zst", ".zip"):
        raise DataError(f"a compressed file ({path.suffix}): decompress it first (e.g. `gunzip -k`); events and "
                        "items are read from .csv / .tsv / .txt or Parquet files", path=path)


def _parquet_array(path: Path, table: pa.Table, name: str) -> pa.Array:
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


def _parquet_column(path: Path, table: pa.Table, col: Column) -> Any:
    """Validate one Parquet column like the CSV reader does; errors name the 1-based row."""
    arr = _parquet_array(path, table, col.name)
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
            ok = pc.match_substring_regex(arr, _INT_RE).to_numpy(zero_copy_only=False)
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
    _not_compressed(path)
    if _is_csv(path):
        parsed = read_delimited(path, columns, delimiter=delimiter, header=True, quoted=True)
        return Loaded(path, dict(parsed.columns), parsed.n, True, parsed)
    table = _read_parquet(path)
    if table.num_rows == 0:
        raise DataError("file has no rows", path=path, line=1, field=columns[0].name)
    return Loaded(path, {c.name: _parquet_array(path, table, c.name) if c.name in raw else
                         _parquet_column(path, table, c) for c in columns}, table.num_rows, False)


def _read_parquet(path: Path, schema_only: bool = False) -> Any:
    try:
        return pq.read_schema(path) if schema_only else pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"not a readable Parquet file (events and items are read from .csv / .tsv / .txt or "
                        f"Parquet files): {e}", path=path) from None


def _check_names(arr: Any, ev: "Loaded", field: str, what: str) -> None:
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


def _first_appearance_codes(values: pa.Array) -> tuple[np.ndarray, list[Any]]:
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


def _ids_hint(e: DataError, id_fields: tuple[str, ...], hint: str) -> DataError:
    """An id that is not an integer (or not one that fits): the message says which flag changes that."""
    if e.field in id_fields and (e.reason.startswith(("not an integer", "integer out of"))
                                 or "non-negative integer" in e.reason):
        return DataError(f"{e.reason} {hint}", path=e.path, line=e.line, field=e.field)
    return e


def _plain_text(arr: Any) -> pa.Array:
    d = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    return d if pa.types.is_string(d.type) else pc.cast(d, pa.string())


def _text_ids(arr: Any, ev: "Loaded", field: str) -> np.ndarray | None:
    """Text ids -> int64 [N] when every value is an integer, else None (they need mapping). Integers read as
    such (a Parquet integer column) come back as they are.

    An empty value is an error either way; an integer beyond int64 or below 0 is an error naming its line.
    """
    if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
        return np.asarray(arr, dtype=np.int64)
    t = pc.utf8_trim_whitespace(_plain_text(arr))  # [N]
    if (empty := pc.equal(t, "").to_numpy(zero_copy_only=False)).any():
        r = int(np.flatnonzero(empty)[0])
        raise DataError("empty value: expected an id", path=ev.path, line=ev.line(r), field=field)
    if not pc.all(pc.match_substring_regex(t, _INT_RE)).as_py():
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


def _first_non_integer(arr: Any) -> tuple[int, str] | None:
    """(row, value) of the first text id that is not an integer; None for an integer column."""
    if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
        return None
    t = _plain_text(arr)
    ok = pc.match_substring_regex(t, _INT_RE).to_numpy(zero_copy_only=False)
    if ok.all():
        return None
    r = int(np.flatnonzero(~ok)[0])
    return r, str(t[r].as_py())


def _as_text(arr: Any) -> pa.Array:
    """Ids as a dictionary of their text: what mapping numbers (an integer column's ids as decimals)."""
    if isinstance(arr, (pa.Array, pa.ChunkedArray)):
        return arr
    return pc.dictionary_encode(pc.cast(pa.array(np.asarray(arr, dtype=np.int64)), pa.string()))


def _locate_items_csv_error(path: Path, n_fields: int, delimiter: str) -> DataError | None:
    """Slow scan of an items CSV for the first record with the wrong number of fields."""
    import csv

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


def read_items_file(path: Path, m: ColumnMapping, *, map_ids: bool, item_codes: dict[Any, int],
                    delimiter: str, hint: str = NO_MAP_HINT) -> ItemRows:
    """Items file -> rows; every column other than id/title/text goes into ``attributes``."""
    _not_compressed(path)
    if _is_csv(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            head_line = f.readline()
        if not head_line.strip():
            raise DataError("file is empty", path=path, line=1, field=m.item)
        import csv

        head = [h.strip() for h in next(csv.reader([head_line.rstrip("\r\n")], delimiter=delimiter))]
        try:
            table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delimiter),
                                   convert_options=pacsv.ConvertOptions(column_types={h: pa.string() for h in head},
                                                                        strings_can_be_null=False))
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise _locate_items_csv_error(path, len(head), delimiter) or DataError(f"could not parse: {e}",
                                                                                  path=path) from None
    else:
        table = _read_parquet(path)
    if m.item not in table.column_names:
        raise DataError(f"column missing; the file has {table.column_names}", path=path, line=1, field=m.item)
    loaded = Loaded(path, {}, table.num_rows, _is_csv(path))
    if loaded.is_csv:
        loaded.parsed = Parsed(path, {}, table.num_rows, True, delimiter)
    ids_raw = table.column(m.item).to_pylist()
    rows, ids = ItemRows.empty(), []
    others = [c for c in table.column_names if c not in (m.item, m.title, m.text)]
    titles = table.column(m.title).to_pylist() if m.title in table.column_names else [None] * table.num_rows
    texts = table.column(m.text).to_pylist() if m.text in table.column_names else [None] * table.num_rows
    other_vals = {c: table.column(c).to_pylist() for c in others}
    next_code = len(item_codes)
    for r, raw in enumerate(ids_raw):
        if raw is None:
            raise DataError("empty item id", path=path, line=loaded.line(r), field=m.item)
        attrs: dict[str, Any] = {c: other_vals[c][r] for c in others}
        if map_ids:
            key = str(raw)
            if key not in item_codes:
                item_codes[key] = next_code
                next_code += 1
            iid = item_codes[key]
            attrs["original_id"] = key
        else:
            s = str(raw).strip()
            if isinstance(raw, float) and raw.is_integer():
                s = str(int(raw))
            if not (s.isdigit() or (s[:1] in "+-" and s[1:].isdigit())):
                raise DataError(f"not an integer: {raw!r} {hint}", path=path, line=loaded.line(r), field=m.item)
            iid = int(s)
        title = titles[r] if titles[r] not in ("", None) else None
        text = texts[r] or ". ".join([title or f"item {raw}"] + [f"{k}: {v}" for k, v in attrs.items()
                                                               if k != "original_id" and v not in (None, "")])
        rows.add(iid, title, str(text), json.loads(json.dumps(attrs, default=str)))
        ids.append(iid)
    if not ids:
        raise DataError("file has no item rows", path=path, line=2, field=m.item)
    seen: dict[int, int] = {}
    for r, iid in enumerate(ids):
        if iid in seen:
            raise DataError(f"duplicate item id {ids_raw[r]!r} (first defined on line {loaded.line(seen[iid])})",
                            path=path, line=loaded.line(r), field=m.item)
        seen[iid] = r
    return rows


def ingest_generic(name: str, source: Path, options: IngestOptions) -> Dataset:
    """Ingest a generic events file (Parquet/CSV) described by ``options.columns``."""
    m = options.columns
    source = Path(source)
    events_path = source if source.is_file() else _find(source, "events")
    if events_path is None:
        raise MissingDataError(f"generic: no events.parquet or events.csv in {source}; give the events file itself "
                               f"as --source, or put it there")
    imp_path = Path(options.impressions_path) if options.impressions_path else None
    if imp_path is not None:
        if m.timestamp is None:
            raise ConfigError("--impressions needs timestamps: request_seq counts the user's events before each "
                              "request, so the events file needs a timestamp column (--time-col)")
        if not imp_path.is_file():
            raise MissingDataError(f"generic: impressions file {imp_path} does not exist")
    is_csv = _is_csv(events_path)
    if options.map_ids is False:
        cols = [int_col(m.user), int_col(m.item)]
    elif options.map_ids or is_csv:
        cols = [Column(m.user, "text"), Column(m.item, "text")]
    else:  # auto, Parquet: a column of numbers is read as integers, one of text as text
        _not_compressed(events_path)
        schema = _read_parquet(events_path, schema_only=True)

        def spec(f: str) -> Column:
            typ = schema.field(f).type if f in schema.names else pa.string()
            return int_col(f) if pa.types.is_integer(typ) or pa.types.is_floating(typ) else Column(f, "text")

        cols = [spec(m.user), spec(m.item)]
    if m.timestamp is not None:
        cols.append(Column(m.timestamp, "text"))  # text from a CSV; the file's own type from Parquet
    if m.action is not None:
        if options.actions is not None:
            vocab = list(options.actions)
            cols.append(Column(m.action, "str", lambda a: np.isin(a, vocab), f"one of {vocab}"))
        else:
            cols.append(Column(m.action, "str"))
    if m.surface is not None:
        cols.append(Column(m.surface, "str"))
    hint = NO_MAP_HINT if options.map_ids is False else INT_HINT
    try:
        ev = load_columns(events_path, cols, _delimiter(events_path, options.delimiter),
                          raw=(m.timestamp,) if m.timestamp is not None else ())
    except DataError as e:
        raise _ids_hint(e, (m.user, m.item), hint) from None

    notes: list[str] = []
    map_ids = bool(options.map_ids)
    user = item = None
    if options.map_ids is None:  # auto: integers stay, text ids are mapped
        user, item = _text_ids(ev.columns[m.user], ev, m.user), _text_ids(ev.columns[m.item], ev, m.item)
        if user is None or item is None:
            f = m.user if user is None else m.item
            r, v = _first_non_integer(ev.columns[f]) or (0, "")
            map_ids = True
            notes.append(f"ids mapped: {f} {v!r} (line {ev.line(r)}) is not an integer, so users and items are "
                         f"numbered 0..n-1 in order of first appearance; `genrec recommend` takes and shows the "
                         f"source's ids (--no-map-ids refuses such ids instead)")
    elif not map_ids:
        user, item = ev.columns[m.user], ev.columns[m.item]
    user_ids: list[Any] | None = None
    item_codes: dict[Any, int] = {}
    if map_ids:
        for f in (m.user, m.item):
            _check_names(_as_text(ev.columns[f]), ev, f, "ids to remap")
        user, user_ids = _first_appearance_codes(_as_text(ev.columns[m.user]))
        item, item_orig = _first_appearance_codes(_as_text(ev.columns[m.item]))
        item_codes = {str(v): i for i, v in enumerate(item_orig)}
    id_rule = ("as given (integers)" if not map_ids else
               "mapped: users and items numbered 0..n-1 in order of first appearance in the events file (items only "
               "in the items file, then ids only in the impressions file, after them); original ids in extra.user_ids "
               "and items.attributes.original_id"
               + (" (--map-ids)" if options.map_ids else " (auto: a non-integer id)"))

    def vocab_codes(arr: pa.Array, fixed: list[str] | None, field: str = "") -> tuple[np.ndarray, list[str]]:
        _check_names(arr, ev, field, "action and surface names")  # "" or "click " would be actions of their own
        values = arr.dictionary.to_pylist()
        names = list(fixed) if fixed is not None else sorted(set(values))
        pos = {v: i for i, v in enumerate(names)}
        remap = np.asarray([pos[v] for v in values], dtype=np.int16)
        return remap[arr.indices.to_numpy()], names

    if m.action is not None:
        action_idx, actions = vocab_codes(ev.columns[m.action], list(options.actions) if options.actions else None,
                                          m.action)
    else:
        action_idx, actions = np.zeros(ev.n, dtype=np.int16), [DEFAULT_ACTION]
    if m.surface is not None:
        surface_idx, surfaces = vocab_codes(ev.columns[m.surface], None, m.surface)
    else:
        surface_idx, surfaces = np.zeros(ev.n, dtype=np.int16), [DEFAULT_SURFACE]
    if len(actions) > 31:
        raise DataError(f"{len(actions)} distinct actions; feedview labels are an int32 bitmask (at most 31)",
                        path=events_path, field=m.action)
    positives = list(options.positive_actions) if options.positive_actions else list(actions)
    for a in positives:
        if a not in actions:
            raise DataError(f"positive action {a!r} is not in the action vocabulary {actions}", path=events_path,
                            field=m.action)
    has_ts = m.timestamp is not None
    if m.timestamp is not None:
        tp = to_epoch_seconds(ev.columns[m.timestamp], options.time_format, Where(events_path, m.timestamp, ev.line))
        timestamp, notes = tp.seconds, notes + tp.notes
        time_rule = f"{tp.rule}; stored as int64 epoch seconds (UTC)"
    else:
        timestamp = np.arange(ev.n, dtype=np.int64)
        time_rule = "no timestamp column: timestamp = position in the events file (file order is time)"

    files = [file_record(events_path, checksum=options.checksum)]
    items_path = Path(options.items_path) if options.items_path else _find(events_path.parent, "items")
    if items_path is not None and not items_path.is_file():
        raise MissingDataError(f"generic: items file {items_path} does not exist")
    def synthesise(i: int) -> tuple[str | None, str, dict[str, Any]]:
        orig = inv.get(i, i)
        attrs: dict[str, Any] = {"synthesised": True}
        if map_ids:
            attrs["original_id"] = orig
        return None, f"item {orig}", attrs

    if items_path is not None:
        items_hint = hint if options.map_ids is False else (
            "(the events file's ids are integers, so the items file's must be too; --map-ids reads both as text)")
        items = read_items_file(items_path, m, map_ids=map_ids, item_codes=item_codes,
                                delimiter=_delimiter(items_path, options.delimiter), hint=items_hint)
        files.append(file_record(items_path, checksum=options.checksum))
    else:
        items = ItemRows.empty()

    impressions = None
    if imp_path is not None:  # after the items file: ids only the impressions name are numbered after its items
        from genrec.data.ingest.impressions import read_impressions

        imp_hint = hint if options.map_ids is False else (
            "(the events file's ids are integers, so the impressions file's must be too; --map-ids reads both as "
            "text)")
        user_codes = {str(v): i for i, v in enumerate(user_ids)} if map_ids and user_ids is not None else None
        impressions, new_users, imp_notes = read_impressions(
            imp_path, m, time_format=options.time_format, delimiter=_delimiter(imp_path, options.delimiter),
            actions=actions, surfaces=surfaces, user_codes=user_codes, item_codes=item_codes if map_ids else None,
            id_hint=imp_hint, default_surface=DEFAULT_SURFACE)
        notes += imp_notes
        if user_ids is not None:
            user_ids = list(user_ids) + new_users
        files.append(file_record(imp_path, checksum=options.checksum))
        if items_path is not None:  # an item the items file lacks is an error, as for events
            imp, inv_items = impressions, {v: k for k, v in item_codes.items()}

            def missing_shown(j: int) -> DataError:
                i = int(imp.item[j])
                return DataError(f"item {inv_items.get(i, i)!r} is not in the items file {items_path}", path=imp.path,
                                 line=imp.line(int(imp.row[j])), field=m.item)

            impressions.missing_item = missing_shown
    inv = {v: k for k, v in item_codes.items()}

    def missing_item(r: int) -> DataError:
        orig = ev.columns[m.item][r]
        orig = orig.as_py() if hasattr(orig, "as_py") else int(orig)
        return DataError(f"item {orig!r} is not in the items file {items_path}", path=events_path,
                         line=ev.line(r), field=m.item)

    info = DatasetInfo(
        name=name,
        actions=actions,
        positive_actions=positives,
        surfaces=surfaces,
        feedview_rule="",
        action_rule=f"actions as given in column {m.action!r}" if m.action else
        f"no action column: every event is {DEFAULT_ACTION!r}",
        has_timestamps=has_ts,
        extra={"columns": options.columns.__dict__, "map_ids": map_ids, "id_rule": id_rule, "notes": notes,
               **({"user_ids": user_ids} if user_ids is not None else {})},
        time_rule=time_rule,
    )
    return build_dataset(
        info,
        user=np.asarray(user),
        item=np.asarray(item),
        timestamp=np.asarray(timestamp),
        action_idx=action_idx,
        surface_idx=surface_idx,
        items=items,
        source={"dataset": name, "folder": str(events_path.parent), "files": files},
        slate_size=options.slate_size,
        missing_item=missing_item if items_path is not None else None,
        synthesise=synthesise if items_path is None else None,
        impressions=impressions,
    )
