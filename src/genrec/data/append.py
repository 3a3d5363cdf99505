"""``genrec data append``: a new day's logs added to prepared tables as one new data version.

The new logs are ingested on their own, by the tables' ingestor (:func:`genrec.data.ingest.prepare_dataset`),
then fitted onto what is stored (:func:`plan_append`) and committed (:func:`commit_append`):

* **Order.** A user's appended events follow their stored ones: ``seq`` goes on from the user's stored count,
  the appended events ordered among themselves as ingest orders them (timestamp, then file order). With
  timestamps, an appended event older than its user's last stored event is refused (``seq`` order is time
  order, which the splits rely on); a dataset without timestamps (``timestamp`` = position) has the appended
  events' positions moved to follow the user's stored ones.
* **Duplicates.** An appended event equal to a stored one in ``(user_id, item_id, surface, action,
  timestamp)`` is a duplicate: by default the append is refused, naming the first (appending the same log
  twice changes nothing); ``skip_duplicates`` appends the others only.
* **Feedviews.** Synthesised from the appended events by the tables' rule and slate size, the chunks starting
  at each user's first appended event; logged ones (``--impressions``) keep their slates, their
  ``request_seq`` counted in the user's whole history.
* **Vocabularies.** The tables' action and surface vocabularies stay as they are (the model's heads are sized
  by them): an action or surface they lack is refused. Ids are the tables' own: tables whose ids ``data
  prepare`` numbered (``--map-ids``) cannot be appended to.
* **Items.** Items the tables lack are added; an item already stored keeps its stored row (its text is what
  its content vector and SID were built from): rows that differ are counted and left out.
* **Atomic.** Each table gets one Iceberg append (a new snapshot); the manifest, rewritten last, names the
  snapshot every reader reads (:class:`genrec.data.store.TableStore`) and records the new data version in its
  ``history``. A failure before that rolls each table back to the manifest's snapshot; until it is rewritten
  readers see the tables as they were, and a later append first rolls back what a killed one left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.data.buckets import conform, layout, user_bucket
from genrec.data.ingest.build import seq_within_user
from genrec.data.ingest.common import RatingRule
from genrec.data.ingest.feedviews import DEFAULT_SLATE_SIZE, build_feedviews
from genrec.data.ingest.impressions import events_before
from genrec.data.ingest.options import ColumnMapping, IngestOptions
from genrec.data.schema import FEEDVIEWS_SCHEMA, Dataset, DatasetInfo
from genrec.data.store import TABLES, TableStore, snapshot_id
from genrec.errors import ConfigError, DataError, GenrecError
from genrec.workdir import atomic_write_json, manifest

__all__ = ["AppendPlan", "DUPLICATE_KEY", "append_dataset", "append_options", "commit_append", "plan_append"]

DUPLICATE_KEY = ("user_id", "item_id", "surface", "action", "timestamp")
"""Columns on which an appended event equal to a stored one is a duplicate."""

APPEND_RULE = (" Events appended later (`genrec data append`) are cut the same way, their chunks starting at each "
               "user's first appended event.")


@dataclass
class AppendPlan:
    """What an append adds: the three tables' new rows, laid out as stored, and what to record."""

    base_version: int  # the data version the plan was made against
    namespace: str
    events: pa.Table
    feedviews: pa.Table
    items: pa.Table
    info: DatasetInfo  # the tables' info after the append
    added: dict[str, int]  # new rows: events, feedviews, items, users (new users), duplicates skipped, ...
    totals: dict[str, int]  # the manifest's counts after the append
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.events.num_rows == 0 and self.feedviews.num_rows == 0 and self.items.num_rows == 0


def _vocab_index(col: pa.ChunkedArray | pa.Array, vocab: list[str], what: str, where: str) -> np.ndarray:
    """Each value's index in ``vocab`` (int64 [N]); a value it lacks is a DataError naming it."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    idx = pc.index_in(col, value_set=pa.array(vocab, pa.string()))
    if idx.null_count:
        r = int(np.flatnonzero(idx.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{what} {col[r].as_py()!r} is not in the tables' {what} vocabulary {vocab} (the model is "
                        f"sized by it): prepare the tables again from all the logs to add it", path=where, field=what)
    return idx.to_numpy(zero_copy_only=False).astype(np.int64)


def _stored_state(store: TableStore, users: np.ndarray) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
    """The stored events of ``users`` (only their buckets are read), and per user (sorted ids [U]): how many
    events are stored and the last stored timestamp (-1 / int64 min for a new user)."""
    cols = list(DUPLICATE_KEY)
    buckets = np.unique(user_bucket(users, store.n_buckets)) if users.size else np.zeros(0, np.int32)
    parts = [store.read_events(int(b), columns=cols) for b in buckets]
    stored = pa.concat_tables(parts) if parts else store.read_events(columns=cols).slice(0, 0)
    stored = stored.filter(pc.is_in(stored.column("user_id"), value_set=pa.array(users, pa.int64())))
    su = stored.column("user_id").to_numpy()
    st = stored.column("timestamp").to_numpy()
    count = np.zeros(len(users), np.int64)
    last = np.full(len(users), np.iinfo(np.int64).min, np.int64)
    if su.size:
        pos = np.searchsorted(users, su)  # [S] row of each stored event's user
        np.add.at(count, pos, 1)
        np.maximum.at(last, pos, st)
    return stored, users, count, last


def plan_append(store: TableStore, ds: Dataset, *, skip_duplicates: bool = False, where: str = "source"
                ) -> AppendPlan:
    """Fit the separately ingested ``ds`` onto ``store``'s tables (the rules in the module docstring); nothing
    is written. ``where`` names the source in errors."""
    info = store.info()
    m = store.manifest()
    if ds.info.name != info.name:
        raise ConfigError(f"{where} was read as {ds.info.name!r}, the tables hold {info.name!r}: append logs of the "
                          f"same kind")
    if info.extra.get("map_ids") or ds.info.extra.get("map_ids"):
        raise ConfigError("the tables' ids were numbered by `genrec data prepare` (string ids or --map-ids): an "
                          "append would number the new logs' ids afresh. Prepare the tables again from all the logs")
    if bool(ds.info.impressions) != bool(info.impressions):
        had = "logged impressions" if info.impressions else "feedviews synthesised from the events"
        raise ConfigError(f"the tables hold {had}; {where} {'has' if ds.info.impressions else 'has no'} impressions "
                          f"file: append logs of the same form")
    if ds.events.num_rows == 0:
        raise DataError("no events to append", path=where)
    ev = ds.events  # sorted by (user, seq within the new logs)
    act = _vocab_index(ev.column("action"), info.actions, "action", where)
    surf = _vocab_index(ev.column("surface"), info.surfaces, "surface", where)
    user = ev.column("user_id").to_numpy()
    item = ev.column("item_id").to_numpy()
    ts = ev.column("timestamp").to_numpy().astype(np.int64)
    fv = ds.feedviews
    users = np.unique(np.concatenate([user, fv.column("user_id").to_numpy()]) if info.impressions else user)
    stored, users, count, last = _stored_state(store, users)
    urow = np.searchsorted(users, user)  # [N] each event's user row

    # duplicates of stored events (a semi join on the key columns)
    new_keys = pa.table({c: ev.column(c) for c in DUPLICATE_KEY}).append_column("_row", pa.array(np.arange(len(ts))))
    dup_rows = np.sort(new_keys.join(stored.group_by(list(DUPLICATE_KEY)).aggregate([]), list(DUPLICATE_KEY),
                                     join_type="left semi").column("_row").to_numpy())
    keep = np.ones(len(ts), bool)
    notes: list[str] = []
    if dup_rows.size:
        r = int(dup_rows[0])
        if not skip_duplicates:
            raise DataError(f"{dup_rows.size} of its {len(ts)} events are in the tables already (the same "
                            f"{', '.join(DUPLICATE_KEY)}), the first: user {int(user[r])}, item {int(item[r])}, "
                            f"timestamp {int(ts[r])}. Appending a log twice is refused; --skip-duplicates appends "
                            f"the other events only", path=where, field="events")
        keep[dup_rows] = False
        notes.append(f"{dup_rows.size} events already in the tables were skipped (--skip-duplicates)")

    # time order: after each user's stored events
    if info.has_timestamps:
        late = np.flatnonzero(keep & (ts < last[urow]))
        if late.size:
            r = int(late[0])
            raise DataError(f"{late.size} events are older than their user's last stored event, the first: user "
                            f"{int(user[r])}, item {int(item[r])}, timestamp {int(ts[r])} < {int(last[urow[r]])}. "
                            f"Appended events must follow each user's stored history (its seq order is time order); "
                            f"prepare the tables again from all the logs to insert older events", path=where,
                            field="timestamp")
    else:  # positions: moved after the user's stored ones, order kept
        first = np.full(len(users), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, urow[keep], ts[keep])
        ts = np.where(keep, np.maximum(last[urow], -1) + 1 + ts - first[urow], ts)
    user, item, ts, act, surf, urow = user[keep], item[keep], ts[keep], act[keep], surf[keep], urow[keep]
    seq = (count[urow] + seq_within_user(user)).astype(np.int32)  # rows still sorted by (user, new seq)
    events = pa.Table.from_arrays(
        [pa.array(user, pa.int64()), pa.array(item, pa.int64()), pa.array(np.asarray(info.surfaces)[surf], pa.string()),
         pa.array(np.asarray(info.actions)[act], pa.string()), pa.array(ts, pa.int64()), pa.array(seq, pa.int32())],
        schema=ev.schema)

    if not info.impressions:
        slate = int(info.extra.get("slate_size", DEFAULT_SLATE_SIZE))
        feedviews = build_feedviews(user=user, seq=seq, timestamp=ts, item=item, action_idx=act, surface_idx=surf,
                                    surfaces=info.surfaces, slate_size=slate)
    else:
        feedviews = _logged_feedviews(fv, ds.info, info, users, count, user, ts, where)

    items, changed = _new_items(store.read_items(), ds.items)
    if changed:
        notes.append(f"{changed} items of {where} are in the tables already with other text, title or attributes; "
                     f"their stored rows are kept (their content vectors and SIDs were built from them)")
    new_users = int(np.count_nonzero(count[np.unique(urow)] == 0)) if urow.size else 0
    added = {"events": events.num_rows, "feedviews": feedviews.num_rows, "items": items.num_rows,
             "users": new_users, "duplicates_skipped": int(dup_rows.size) if skip_duplicates else 0,
             "items_kept_as_stored": changed}
    before = store.counts()
    totals = {"events": int(before.get("events", 0)) + events.num_rows,
              "feedviews": int(before.get("feedviews", 0)) + feedviews.num_rows,
              "items": int(before.get("items", 0)) + items.num_rows,
              "users": int(before.get("users", 0)) + new_users}
    new_info = _updated_info(info, added, act)
    n = store.n_buckets
    return AppendPlan(base_version=store.data_version, namespace=str(m["namespace"]),
                      events=layout(conform(events, "events"), "events", n),
                      feedviews=layout(conform(feedviews, "feedviews"), "feedviews", n),
                      items=layout(conform(items, "items"), "items", n),
                      info=new_info, added=added, totals=totals, notes=notes)


def _logged_feedviews(fv: pa.Table, new: DatasetInfo, info: DatasetInfo, users: np.ndarray, count: np.ndarray,
                      ev_user: np.ndarray, ev_ts: np.ndarray, where: str) -> pa.Table:
    """Logged slates of the new logs: labels re-coded in the tables' action bits, ``request_seq`` counted in the
    user's whole history (stored events, then the appended ones before the request)."""
    if fv.num_rows == 0:
        return FEEDVIEWS_SCHEMA.empty_table()
    _vocab_index(fv.column("surface"), info.surfaces, "surface", where)
    bits = np.zeros(len(new.actions), np.int64)
    for i, a in enumerate(new.actions):
        if a not in info.actions:
            raise DataError(f"action {a!r} is not in the tables' action vocabulary {info.actions}", path=where,
                            field="action")
        bits[i] = info.actions.index(a)
    labels = pc.list_flatten(fv.column("labels")).to_numpy().astype(np.int64)  # [M] bitmasks in the new vocab
    recoded = np.zeros_like(labels)
    for i, b in enumerate(bits):
        recoded |= ((labels >> i) & 1) << b
    offsets = pc.list_value_length(fv.column("labels")).to_numpy().cumsum()
    lists = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], offsets]).astype(np.int32)),
                                     pa.array(recoded.astype(np.int32)))
    f_user = fv.column("user_id").to_numpy()
    seq = count[np.searchsorted(users, f_user)] + events_before(ev_user, ev_ts, f_user,
                                                                fv.column("request_ts").to_numpy())
    fv = fv.set_column(fv.schema.get_field_index("request_seq"), "request_seq", pa.array(seq.astype(np.int32)))
    return fv.set_column(fv.schema.get_field_index("labels"), "labels",
                         lists.cast(FEEDVIEWS_SCHEMA.field("labels").type))


def _new_items(stored: pa.Table, offered: pa.Table) -> tuple[pa.Table, int]:
    """Rows of ``offered`` whose item the tables lack, and how many known items it offers with other values."""
    known = pc.is_in(offered.column("item_id"), value_set=stored.column("item_id"))
    fresh = offered.filter(pc.invert(known))
    again = offered.filter(known)
    if again.num_rows == 0:
        return fresh, 0
    cols = ["item_id", "title", "text", "attributes"]
    same = again.select(cols).join(stored.select(cols), cols, join_type="left semi")
    return fresh, again.num_rows - same.num_rows


def _updated_info(info: DatasetInfo, added: dict[str, int], act: np.ndarray) -> DatasetInfo:
    """The tables' info after the append: counts moved on, the feedview rule saying how appends are cut."""
    extra = json.loads(json.dumps(info.extra))  # a deep copy
    counts = extra.get("counts")
    if isinstance(counts, dict):
        for key, k in (("events", "events"), ("users", "users"), ("items", "items"), ("requests", "feedviews")):
            if key in counts:
                counts[key] = int(counts[key]) + int(added[k])
        if isinstance(counts.get("actions"), dict):
            for a, c in zip(info.actions, np.bincount(act, minlength=len(info.actions))):
                counts["actions"][a] = int(counts["actions"].get(a, 0)) + int(c)
    rule = info.feedview_rule
    if not info.impressions and APPEND_RULE not in rule:
        rule += APPEND_RULE
    return replace(info, extra=extra, feedview_rule=rule)


@contextlib.contextmanager
def _locked(store: TableStore) -> Iterator[None]:
    """One append at a time per tables folder (fcntl)."""
    store.tables_dir.mkdir(parents=True, exist_ok=True)
    with open(store.tables_dir / ".append.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _roll_back(table: Any, base: int | None) -> None:
    """Make ``base`` (the snapshot the manifest names) ``table``'s current snapshot again; an empty base: delete
    whatever a killed append left."""
    if snapshot_id(table) == base:
        return
    if base is None:
        from pyiceberg.expressions import AlwaysTrue  # (pyiceberg: loaded on use, as in genrec.data.store)

        table.delete(AlwaysTrue())
    else:
        table.manage_snapshots().set_current_snapshot(base).commit()


def commit_append(store: TableStore, plan: AppendPlan, *, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Append ``plan``'s rows (one Iceberg snapshot per table that gains rows), then rewrite the manifest --
    the commit point -- with the new snapshots, counts and history entry; returns the manifest. Any failure
    first rolls the tables back (the module docstring)."""
    with _locked(store):
        store._manifest = None  # re-read: another process may have appended since the plan
        m = store.manifest()
        if m.get("snapshots") is None:
            raise GenrecError(f"{store.tables_dir} was prepared before genrec recorded table versions: prepare it "
                              f"again to append to it")
        if m["namespace"] != plan.namespace or int(m.get("data_version", 1)) != plan.base_version:
            raise GenrecError(f"{store.tables_dir} changed since the append was planned (now "
                              f"{m['namespace']}.{m.get('data_version', 1)}): run the append again")
        base = {k: (None if v is None else int(v)) for k, v in m["snapshots"].items()}
        tables = {name: store.table(name) for name in TABLES}
        rows = {"events": plan.events, "feedviews": plan.feedviews, "items": plan.items}
        try:
            for name in TABLES:
                _roll_back(tables[name], base[name])  # what a killed append may have left
            for name in TABLES:
                if rows[name].num_rows:
                    store._append(tables[name], rows[name], name)
            snaps = {name: snapshot_id(tables[name]) for name in TABLES}
            version = plan.base_version + 1
            tv = f"{plan.namespace}.{version}"
            stamp = manifest("append", inputs=inputs or {}, params={}, counts=plan.added)
            entry = {"data_version": version, "tables_version": tv, "snapshots": snaps, "counts": plan.totals,
                     "created": stamp["created"], "kind": "append", "added": plan.added, "inputs": inputs or {},
                     "notes": plan.notes}
            body = {**m, "counts": plan.totals, "info": plan.info.to_dict(), "snapshots": snaps,
                    "data_version": version, "tables_version": tv, "history": [*store.history(), entry]}
            atomic_write_json(store.manifest_path, body)  # the commit point
        except BaseException:
            for name in TABLES:
                with contextlib.suppress(Exception):
                    _roll_back(store.table(name), base[name])
            raise
        store._manifest = body
        return body


def append_dataset(store: TableStore, ds: Dataset, *, skip_duplicates: bool = False, where: str = "source",
                   inputs: dict[str, Any] | None = None) -> tuple[dict[str, Any], AppendPlan]:
    """:func:`plan_append` then :func:`commit_append`; nothing new (every event a skipped duplicate, no new
    item) writes nothing. Returns the manifest and the plan."""
    plan = plan_append(store, ds, skip_duplicates=skip_duplicates, where=where)
    if plan.empty:
        plan.notes.append("nothing new: the tables are unchanged")
        return store.manifest(), plan
    return commit_append(store, plan, inputs=inputs if inputs is not None else dict(ds.source)), plan


def append_options(info: DatasetInfo, *, columns: dict[str, Any] | None = None, **given: Any) -> IngestOptions:
    """The ingest options for logs appended to tables holding ``info``: the tables' rating rule, slate size,
    action vocabulary and (generic) column mapping -- the rules the stored rows were made by -- with
    ``columns`` (column names) and ``given`` (e.g. ``items_path``, ``impressions_path``, ``time_format``,
    ``delimiter``) for what the new files need. Ids are never numbered (:func:`plan_append`)."""
    kw: dict[str, Any] = {"slate_size": int(info.extra.get("slate_size", DEFAULT_SLATE_SIZE)), "map_ids": False}
    if isinstance(info.extra.get("rating_rule"), dict):
        kw["rating_rule"] = RatingRule(**info.extra["rating_rule"])
    got = info.extra.get("columns")
    stored_cols: dict[str, Any] = got if isinstance(got, dict) else {}
    kw["columns"] = ColumnMapping(**{**stored_cols, **(columns or {})})
    if info.name == "generic":
        kw["actions"], kw["positive_actions"] = tuple(info.actions), tuple(info.positive_actions)
    return IngestOptions(**{**kw, **{k: v for k, v in given.items() if v is not None}})
