"""Feedviews from a logged impressions file (``genrec data prepare generic --impressions FILE``).

The synthesised feedviews (:mod:`.feedviews`) are chunks of the interactions, so none of their slate
items is impression-only. A log of what users were *shown* gives real slates: items shown and not
engaged with carry label 0. When an impressions file is given its requests REPLACE the synthesised
feedviews, and ``DatasetInfo.feedview_rule`` states the rule below (``DatasetInfo.impressions`` is True).

The file: CSV (a header line names the columns; ``.tsv`` with tabs, ``--delimiter``) or Parquet, long
format, one row per shown item::

    request_id,user_id,item_id,timestamp,position,action
    r1,u196,m242,1997-12-04T15:50:00Z,1,like
    r1,u196,m86,1997-12-04T15:50:00Z,2,
    r1,u196,m302,1997-12-04T15:50:00Z,3,view|like

Columns (the names are the events file's, ``ColumnMapping``; extra columns are ignored):

* ``request_id`` (``--request-col``): one feedview per distinct value.
* ``user_id``, ``item_id`` (``--user-col``, ``--item-col``): ids, mapped exactly as the events file's
  (``--map-ids``): the same numbers for the same ids. An id the events file never names gets the next
  number (users after the events' users, items after the events' and the items file's); an item that is
  not in a given items file is an error, as for events; without an items file it gets a synthesised row.
  When the events' ids are integers kept as they are, the impressions' ids must be integers too.
* ``timestamp`` (``--time-col``, read with ``--time-format`` like the events'): when the request was
  served. Required: the events need a timestamp column too.
* ``position`` (``--position-col``): a non-negative integer; the slate is ordered by it.
* ``action`` (``--action-col``; ``action`` when the events have no action column): what the user did
  with the shown item: empty (or null in Parquet) = shown, not engaged (label 0); an action of the
  events' vocabulary (``DatasetInfo.actions``; ``--actions`` fixes it); several actions as several rows
  of the same request and position or as one ``|``-separated value (``click|like``; a Parquet list
  column works too). An action outside the vocabulary is an error.
* ``surface`` (``--surface-col``; ``surface`` when the events have none): optional; the request's surface.
  Without it every request is on the ``default`` surface. Surfaces the events never name are added to
  ``DatasetInfo.surfaces``.

Grouping: every row of a request must name the same user, timestamp (after parsing) and surface;
rows with the same request and position are one shown item (they must name the same item; their
actions are OR-ed). ``labels[j]`` is the bitmask ``OR 1 << index(action)``, ``request_ts`` the
request's timestamp, ``request_seq`` the number of the user's events with a timestamp strictly
before ``request_ts``: **an event at the request's own timestamp counts as after it**, so a slate's
history never holds its own engagements. Engagement comes from the action column only; the events
file is not searched for it.

Errors name the file, the 1-based line (CSV; the row for Parquet) and the field, in the CLI's words.
:func:`feedview_table` is the vectorised grouping, :func:`impressions_reference` its slow twin.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.data.ingest.columns import (Loaded, as_text, check_names, first_appearance_codes, ids_hint, is_csv,
                                        load_columns, not_compressed, parquet_array, parquet_column, plain_text,
                                        read_parquet)
from genrec.data.ingest.common import Column, int_col
from genrec.data.ingest.feedviews import action_bits_text
from genrec.data.ingest.timestamps import Where, to_epoch_seconds
from genrec.data.schema import FEEDVIEWS_SCHEMA
from genrec.errors import DataError

SEPARATOR = "|"
"""Separates several actions of one shown item in one action value."""


def rule_text(path: Path | str, actions: list[str], *, request: str, position: str, action: str,
              surface: str) -> str:
    """The precise English statement stored in ``DatasetInfo.feedview_rule``."""
    bits = action_bits_text(actions)
    return (
        f"From the impressions file {path}: one request per value of column {request!r}; its slate = its rows "
        f"ordered by column {position!r} (rows of one request and position are one shown item, their actions "
        f"OR-ed); labels[j] = OR of 1 << index(action) over the item's actions in column {action!r} ({bits}; "
        f"several as 'a{SEPARATOR}b'), 0 = shown, not engaged (an empty action); request_ts = the request's "
        f"timestamp; request_seq = the number of the user's events with a timestamp strictly before request_ts "
        f"(an event at the request's own timestamp counts as after it); surface = column {surface!r} (else "
        f"'default'). Engagement comes from the impressions file only (the events are not matched at ingest); "
        f"the join attaches a held-out event to the latest slate at or before it that shows its item with its "
        f"action's bit. Impression-only (label 0) items exist."
    )


def events_before(ev_user: np.ndarray, ev_ts: np.ndarray, user: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Per request, the number of its user's events with a timestamp strictly before its own.

    ``ev_user``/``ev_ts``: the events sorted by user (any order within a user), [N]; ``user``/``ts``: the
    requests, [R] -> [R] int64. One merged stable sort: at an equal (user, timestamp) a request sorts
    before the events, so they count as after it."""
    n, r = len(ev_user), len(user)
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    keys_user = np.concatenate([np.asarray(ev_user, np.int64), np.asarray(user, np.int64)])  # [N+R]
    keys_ts = np.concatenate([np.asarray(ev_ts, np.int64), np.asarray(ts, np.int64)])  # [N+R]
    kind = np.concatenate([np.ones(n, np.int8), np.zeros(r, np.int8)])  # requests first at a tie
    order = np.lexsort((kind, keys_ts, keys_user))  # [N+R]
    is_event = (order < n).astype(np.int64)
    before = np.cumsum(is_event) - is_event  # [N+R] events earlier in the merged order
    at = np.flatnonzero(order >= n)  # merged positions of the requests
    out = np.empty(r, dtype=np.int64)
    out[order[at] - n] = before[at]
    return out - np.searchsorted(ev_user, user, side="left")  # minus the events of smaller user ids


@dataclass
class Impressions:
    """An impressions file read and grouped: requests in order of first appearance, slates flattened."""

    path: Path
    user: np.ndarray  # int64 [R]
    request_ts: np.ndarray  # int64 [R]
    surface: np.ndarray  # int32 [R] index into the surfaces vocabulary
    offsets: np.ndarray  # int64 [R+1] slate of request i = [offsets[i], offsets[i+1])
    item: np.ndarray  # int64 [S] slate items
    labels: np.ndarray  # int32 [S] action bitmasks (0 = impression only)
    row: np.ndarray  # int64 [S] a file row of each slate item (errors name its line)
    line: Callable[[int], int]  # file row (0-based) -> 1-based line
    rule: str = ""
    missing_item: Callable[[int], DataError] | None = None
    """Slate item j's item is in no items table: the error (None: synthesise its row)."""

    @property
    def n_requests(self) -> int:
        return len(self.user)

    def table(self, ev_user: np.ndarray, ev_ts: np.ndarray, surfaces: list[str]) -> pa.Table:
        """The feedviews table (FEEDVIEWS_SCHEMA), request_seq counted in the events ``ev_user``/``ev_ts``
        (sorted by user)."""
        seq = events_before(ev_user, ev_ts, self.user, self.request_ts)
        surf = pa.DictionaryArray.from_arrays(pa.array(self.surface.astype(np.int32)),
                                              pa.array(surfaces, pa.string())).cast(pa.string())
        offsets = pa.array(self.offsets.astype(np.int32 if len(self.item) < 2 ** 31 else np.int64))
        list_cls = pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray
        return pa.Table.from_arrays(
            [pa.array(self.user.astype(np.int64)), pa.array(self.request_ts.astype(np.int64)),
             pa.array(seq.astype(np.int32)), surf,
             list_cls.from_arrays(offsets, pa.array(self.item.astype(np.int64))).cast(
                 FEEDVIEWS_SCHEMA.field("item_ids").type),
             list_cls.from_arrays(offsets, pa.array(self.labels.astype(np.int32))).cast(
                 FEEDVIEWS_SCHEMA.field("labels").type)],
            schema=FEEDVIEWS_SCHEMA)


def action_mask(value: str, index: dict[str, int]) -> int | str:
    """One action value -> its label bitmask (0 for an empty value), or why it is refused (a string)."""
    if not value.strip():
        return 0
    mask = 0
    for part in value.split(SEPARATOR):
        name = part.strip()
        if not name:
            return f"empty action name in {value!r} (several actions are written 'a{SEPARATOR}b')"
        if name not in index:
            return (f"action {name!r} is not in the action vocabulary {list(index)} (the events file's actions; "
                    f"--actions sets them; an empty value means shown, not engaged)")
        mask |= 1 << index[name]
    return mask


def group(*, path: Path, line: Callable[[int], int], request: np.ndarray, request_text: Callable[[int], str],
          user: np.ndarray, ts: np.ndarray, surface: np.ndarray, position: np.ndarray, item: np.ndarray,
          labels: np.ndarray, fields: dict[str, str], shown: dict[str, Callable[[int], Any]]) -> Impressions:
    """Group file rows into requests. ``request``: dense request codes 0..R-1 in order of first appearance;
    every other array is a per-row value [M]. ``fields`` names the columns (keys request, user, timestamp,
    surface, position, item) for errors; ``shown[key](row)`` is a row's value as the file has it."""
    m = len(request)
    first = np.full(int(request.max()) + 1 if m else 0, m, dtype=np.int64)
    np.minimum.at(first, request, np.arange(m, dtype=np.int64))  # [R] first row of each request
    f_of = first[request]  # [M]
    for key, arr in (("user", user), ("timestamp", ts), ("surface", surface)):
        bad = np.flatnonzero(arr != arr[f_of])
        if bad.size:
            r = int(bad[0])
            f = int(f_of[r])
            raise DataError(f"request {request_text(r)!r} has {fields[key]} {shown[key](r)!r} here but "
                            f"{shown[key](f)!r} on line {line(f)}: every row of a request names the same user, "
                            f"timestamp and surface", path=path, line=line(r), field=fields[key])
    rows = np.arange(m, dtype=np.int64)
    order = np.lexsort((rows, position, request))  # [M] by request, position, file order
    req_o, pos_o, item_o = request[order], position[order], item[order]
    new = np.ones(m, dtype=bool)  # [M] first row of a shown item (request, position)
    new[1:] = (req_o[1:] != req_o[:-1]) | (pos_o[1:] != pos_o[:-1])
    clash = np.flatnonzero(~new[1:] & (item_o[1:] != item_o[:-1]))
    if clash.size:
        j = int(clash[0]) + 1
        r, p = int(order[j]), int(order[j - 1])
        raise DataError(f"request {request_text(r)!r} shows {shown['item'](r)!r} at {fields['position']} "
                        f"{int(position[r])}, where line {line(p)} shows {shown['item'](p)!r}: one item per position "
                        f"(several actions on one item: several rows of that item, or 'a{SEPARATOR}b')",
                        path=path, line=line(r), field=fields["position"])
    starts = np.flatnonzero(new)  # [S]
    lab = np.bitwise_or.reduceat(labels[order].astype(np.int32), starts) if m else np.zeros(0, np.int32)
    req_s = req_o[starts]  # [S] request of each shown item, sorted
    n_req = len(first)
    offsets = np.searchsorted(req_s, np.arange(n_req + 1), side="left").astype(np.int64)  # [R+1]
    return Impressions(path=path, user=user[first].astype(np.int64), request_ts=ts[first].astype(np.int64),
                       surface=surface[first].astype(np.int32), offsets=offsets,
                       item=item_o[starts].astype(np.int64), labels=lab.astype(np.int32),
                       row=order[starts].astype(np.int64), line=line)


def impressions_reference(rows: list[dict[str, Any]], events: list[dict[str, Any]],
                          actions: list[str]) -> list[dict[str, Any]]:
    """Slow twin of the whole rule, with plain loops. ``rows``: ``{request, user_id, item_id, timestamp, position,
    action, surface}`` (action: a text value as in the file), ``events``: ``{user_id, timestamp}``. Feedview
    dicts (FEEDVIEWS_SCHEMA's fields), sorted by (user_id, request_ts, request_seq, item_ids)."""
    index = {a: i for i, a in enumerate(actions)}
    by_req: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        by_req.setdefault(r["request"], []).append(r)
    out = []
    for rs in by_req.values():
        u, ts = rs[0]["user_id"], rs[0]["timestamp"]
        assert all(r["user_id"] == u and r["timestamp"] == ts and r["surface"] == rs[0]["surface"] for r in rs)
        slate: dict[int, list[Any]] = {}
        for r in rs:
            mask = 0
            if r["action"].strip():
                for name in r["action"].split(SEPARATOR):
                    mask |= 1 << index[name.strip()]
            if r["position"] in slate:
                assert slate[r["position"]][0] == r["item_id"]
                slate[r["position"]][1] |= mask
            else:
                slate[r["position"]] = [r["item_id"], mask]
        out.append({
            "user_id": u, "request_ts": ts,
            "request_seq": sum(1 for e in events if e["user_id"] == u and e["timestamp"] < ts),
            "surface": rs[0]["surface"],
            "item_ids": [slate[p][0] for p in sorted(slate)],
            "labels": [slate[p][1] for p in sorted(slate)],
        })
    return sorted(out, key=lambda f: (f["user_id"], f["request_ts"], f["request_seq"], f["item_ids"], f["labels"]))


def csv_header(path: Path, delimiter: str) -> list[str]:
    """The column names on line 1 of a delimited file (empty for an empty file)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        first = f.readline().removeprefix("\ufeff").rstrip("\r\n")
    if not first.strip():
        return []
    if len(delimiter) > 1:
        return [h.strip() for h in first.split(delimiter)]
    return [h.strip() for h in next(csv.reader([first], delimiter=delimiter))]


def _load_parquet(path: Path, cols: list[Any], raw: tuple[str, ...], nullable: tuple[str, ...]) -> Any:
    """Like :func:`genrec.data.ingest.generic.load_columns` for Parquet, except that the ``nullable`` columns
    (the action) may hold nulls (read as ``""``) and lists of names (joined with ``|``)."""

    table = read_parquet(path)
    if table.num_rows == 0:
        raise DataError("file has no rows", path=path, line=1, field=cols[0].name)
    out: dict[str, Any] = {}
    for c in cols:
        if c.name in nullable:
            if c.name not in table.column_names:
                raise DataError(f"column missing; the file has {table.column_names}", path=path, field=c.name)
            arr = table.column(c.name).combine_chunks()
            if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
                arr = pc.binary_join(pc.cast(arr, pa.list_(pa.string())), SEPARATOR)
            try:
                out[c.name] = pc.fill_null(pc.cast(arr, pa.string()), "")
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise DataError(f"expected action names (text), found type {arr.type}", path=path,
                                field=c.name) from None
        elif c.name in raw:
            out[c.name] = parquet_array(path, table, c.name)
        else:
            out[c.name] = parquet_column(path, table, c)
    return Loaded(path, out, table.num_rows, False)


def _py(arr: Any, r: int) -> Any:
    v = arr[r]
    return v.as_py() if hasattr(v, "as_py") else v.item() if hasattr(v, "item") else v


def read_impressions(path: Path, m: Any, *, time_format: str, delimiter: str, actions: list[str],
                     surfaces: list[str], user_codes: dict[str, int] | None, item_codes: dict[str, int] | None,
                     id_hint: str, default_surface: str = "default") -> tuple[Impressions, list[str], list[str]]:
    """Read and group the impressions file at ``path`` (columns named by the ColumnMapping ``m``).

    ``user_codes``/``item_codes``: the events' id mapping (source id text -> number), extended in place with
    the ids the events never name (next numbers, in order of first appearance here); None for both: ids are
    integers, kept (a non-integer is a DataError, ``id_hint`` says which flag changes that). ``surfaces`` is
    extended in place with surfaces the events never name. Returns (impressions, the new users' source ids in
    number order, notes for the person)."""

    assert m.timestamp is not None, "the caller checks that the events have timestamps"
    not_compressed(path)
    csv_file = is_csv(path)
    names = csv_header(path, delimiter) if csv_file else list(read_parquet(path, schema_only=True).names)
    action_col = m.action or "action"
    surface_col = m.surface or "surface"
    has_surface = surface_col in names
    mapped = user_codes is not None and item_codes is not None
    if not mapped:
        id_cols = [int_col(m.user), int_col(m.item)]
    elif csv_file:
        id_cols = [Column(m.user, "text"), Column(m.item, "text")]
    else:  # as the events' Parquet ids: a column of numbers is read as integers (then numbered by their text)
        schema = read_parquet(path, schema_only=True)

        def spec(f: str) -> Any:
            typ = schema.field(f).type if f in schema.names else pa.string()
            return int_col(f) if pa.types.is_integer(typ) or pa.types.is_floating(typ) else Column(f, "text")

        id_cols = [spec(m.user), spec(m.item)]
    cols = [Column(m.request, "text"), *id_cols, Column(m.timestamp, "text"), int_col(m.position),
            Column(action_col, "text")] + ([Column(surface_col, "str")] if has_surface else [])
    try:
        if csv_file:
            ld = load_columns(path, cols, delimiter, raw=(m.timestamp,))
        else:
            ld = _load_parquet(path, cols, raw=(m.request, m.timestamp), nullable=(action_col,))
    except DataError as e:
        raise ids_hint(e, (m.user, m.item), id_hint) from None
    n = ld.n
    notes: list[str] = []

    # requests: dense codes in order of first appearance
    req_text = plain_text(ld.columns[m.request])
    check_names(req_text, ld, m.request, "request ids")
    request, _ = first_appearance_codes(req_text)

    # ids: the events' numbers; new ones after them
    new_users: list[str] = []
    if mapped:
        assert user_codes is not None and item_codes is not None
        ids: dict[str, np.ndarray] = {}
        for f, table, new in ((m.user, user_codes, new_users), (m.item, item_codes, None)):
            text = as_text(ld.columns[f])
            check_names(text, ld, f, "ids to remap")
            codes, originals = first_appearance_codes(text)
            number = np.empty(len(originals), dtype=np.int64)
            for k, orig in enumerate(originals):
                key = str(orig)
                if key not in table:
                    table[key] = len(table)
                    if new is not None:
                        new.append(key)
                number[k] = table[key]
            ids[f] = number[codes]
        user, item = ids[m.user], ids[m.item]
        if new_users:
            notes.append(f"impressions: {len(new_users)} user(s) have impressions but no events (the first: "
                         f"{new_users[0]!r}); they are numbered after the events' users")
    else:
        user, item = np.asarray(ld.columns[m.user], np.int64), np.asarray(ld.columns[m.item], np.int64)

    tp = to_epoch_seconds(ld.columns[m.timestamp], time_format, Where(path, m.timestamp, ld.line))
    notes += [f"impressions: {x}" for x in tp.notes]
    position = np.asarray(ld.columns[m.position], dtype=np.int64)

    # actions -> label bitmasks, one parse per distinct value
    act = pc.dictionary_encode(plain_text(ld.columns[action_col]))
    index = {a: i for i, a in enumerate(actions)}
    masks = [action_mask(v, index) for v in act.dictionary.to_pylist()]
    codes = act.indices.to_numpy(zero_copy_only=False)
    bad = [k for k, v in enumerate(masks) if isinstance(v, str)]
    if bad:
        r = int(np.flatnonzero(np.isin(codes, bad))[0])
        raise DataError(str(masks[int(codes[r])]), path=path, line=ld.line(r), field=action_col)
    labels = np.asarray(masks, dtype=np.int32)[codes] if masks else np.zeros(n, np.int32)

    # surfaces: indices into the events' vocabulary, extended
    if has_surface:
        sarr = ld.columns[surface_col]
        check_names(sarr, ld, surface_col, "action and surface names")
        for v in sarr.dictionary.to_pylist():
            if v not in surfaces:
                surfaces.append(v)
        pos = {s: i for i, s in enumerate(surfaces)}
        surface = np.asarray([pos[v] for v in sarr.dictionary.to_pylist()], np.int32)[
            sarr.indices.to_numpy(zero_copy_only=False)]
    else:
        if default_surface not in surfaces:
            surfaces.append(default_surface)
        surface = np.full(n, surfaces.index(default_surface), dtype=np.int32)

    def raw(col: str) -> Callable[[int], Any]:
        return lambda r: _py(ld.columns[col], r)

    fields = {"request": m.request, "user": m.user, "timestamp": m.timestamp, "surface": surface_col,
              "position": m.position, "item": m.item}
    shown = {"user": raw(m.user), "timestamp": raw(m.timestamp), "item": raw(m.item),
             "surface": (lambda r: surfaces[int(surface[r])])}
    imp = group(path=path, line=ld.line, request=request, request_text=lambda r: str(req_text[r].as_py()),
                user=user, ts=tp.seconds, surface=surface, position=position, item=item, labels=labels,
                fields=fields, shown=shown)
    imp.rule = rule_text(path, actions, request=m.request, position=m.position, action=action_col,
                         surface=surface_col)
    return imp, new_users, notes
