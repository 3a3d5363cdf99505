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

from genrec.data.ingest.build import ItemRows, build_dataset
from genrec.data.ingest.columns import (INT_HINT, NO_MAP_HINT, Loaded, as_text, check_names, find_file,
                                        first_appearance_codes, first_non_integer, ids_hint, is_csv, load_columns,
                                        locate_items_csv_error, not_compressed, pick_delimiter, read_parquet,
                                        text_ids)
from genrec.data.ingest.common import Column, Parsed, file_record, int_col, read_delimited, record_line
from genrec.data.ingest.impressions import read_impressions
from genrec.data.ingest.options import ColumnMapping, IngestOptions
from genrec.data.ingest.timestamps import Where, to_epoch_seconds
from genrec.data.schema import Dataset, DatasetInfo
from genrec.errors import ConfigError, DataError, MissingDataError

DEFAULT_ACTION = "interact"
DEFAULT_SURFACE = "default"
def read_items_file(path: Path, m: ColumnMapping, *, map_ids: bool, item_codes: dict[Any, int],
                    delimiter: str, hint: str = NO_MAP_HINT) -> ItemRows:
    """Items file -> rows; every column other than id/title/text goes into ``attributes``."""
    not_compressed(path)
    if is_csv(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            head_line = f.readline()
        if not head_line.strip():
            raise DataError("file is empty", path=path, line=1, field=m.item)
        head = [h.strip() for h in next(csv.reader([head_line.rstrip("\r\n")], delimiter=delimiter))]
        try:
            table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delimiter),
                                   convert_options=pacsv.ConvertOptions(column_types={h: pa.string() for h in head},
                                                                        strings_can_be_null=False))
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise locate_items_csv_error(path, len(head), delimiter) or DataError(f"could not parse: {e}",
                                                                                  path=path) from None
    else:
        table = read_parquet(path)
    if m.item not in table.column_names:
        raise DataError(f"column missing; the file has {table.column_names}", path=path, line=1, field=m.item)
    loaded = Loaded(path, {}, table.num_rows, is_csv(path))
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
    events_path = source if source.is_file() else find_file(source, "events")
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
    events_csv = is_csv(events_path)
    if options.map_ids is False:
        cols = [int_col(m.user), int_col(m.item)]
    elif options.map_ids or events_csv:
        cols = [Column(m.user, "text"), Column(m.item, "text")]
    else:  # auto, Parquet: a column of numbers is read as integers, one of text as text
        not_compressed(events_path)
        schema = read_parquet(events_path, schema_only=True)

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
        ev = load_columns(events_path, cols, pick_delimiter(events_path, options.delimiter),
                          raw=(m.timestamp,) if m.timestamp is not None else ())
    except DataError as e:
        raise ids_hint(e, (m.user, m.item), hint) from None

    notes: list[str] = []
    map_ids = bool(options.map_ids)
    user = item = None
    if options.map_ids is None:  # auto: integers stay, text ids are mapped
        user, item = text_ids(ev.columns[m.user], ev, m.user), text_ids(ev.columns[m.item], ev, m.item)
        if user is None or item is None:
            f = m.user if user is None else m.item
            r, v = first_non_integer(ev.columns[f]) or (0, "")
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
            check_names(as_text(ev.columns[f]), ev, f, "ids to remap")
        user, user_ids = first_appearance_codes(as_text(ev.columns[m.user]))
        item, item_orig = first_appearance_codes(as_text(ev.columns[m.item]))
        item_codes = {str(v): i for i, v in enumerate(item_orig)}
    id_rule = ("as given (integers)" if not map_ids else
               "mapped: users and items numbered 0..n-1 in order of first appearance in the events file (items only "
               "in the items file, then ids only in the impressions file, after them); original ids in extra.user_ids "
               "and items.attributes.original_id"
               + (" (--map-ids)" if options.map_ids else " (auto: a non-integer id)"))

    def vocab_codes(arr: pa.Array, fixed: list[str] | None, field: str = "") -> tuple[np.ndarray, list[str]]:
        check_names(arr, ev, field, "action and surface names")  # "" or "click " would be actions of their own
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
    items_path = Path(options.items_path) if options.items_path else find_file(events_path.parent, "items")
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
                                delimiter=pick_delimiter(items_path, options.delimiter), hint=items_hint)
        files.append(file_record(items_path, checksum=options.checksum))
    else:
        items = ItemRows.empty()

    impressions = None
    if imp_path is not None:  # after the items file: ids only the impressions name are numbered after its items

        imp_hint = hint if options.map_ids is False else (
            "(the events file's ids are integers, so the impressions file's must be too; --map-ids reads both as "
            "text)")
        user_codes = {str(v): i for i, v in enumerate(user_ids)} if map_ids and user_ids is not None else None
        impressions, new_users, imp_notes = read_impressions(
            imp_path, m, time_format=options.time_format, delimiter=pick_delimiter(imp_path, options.delimiter),
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
