"""The bucketed Iceberg table store: ``events``, ``feedviews`` and ``items`` (UniPinRec §3.2).

UniPinRec keeps user action sequences and feedview (request) records in two separate
tables, both hash-bucketed by ``user_id``, and joins them inside the trainer one bucket at
a time (see :mod:`genrec.data.join`), so context length, sampling ratio and filters are
read-time parameters instead of baked into a pre-joined training table.

What is non-standard here:

* **Bucketing is an explicit ``bucket`` int32 column with an identity partition**, not an
  Iceberg ``bucket[N](user_id)`` transform. pyiceberg 0.12 can only *write* bucket
  transforms with the optional Rust extension ``pyiceberg-core``, and a scan cannot
  filter on a transform's partition value anyway; an identity partition on ``bucket``
  lets ``EqualTo("bucket", b)`` prune to exactly that bucket's data files. The column's
  value is nevertheless *the Iceberg spec's bucket function* (:func:`user_bucket`):
  ``(murmur3_x86_32(int64 little-endian bytes, seed 0) & 0x7FFFFFFF) % n_buckets``, so
  any engine (Spark ``bucket(n, user_id)``) computes the same assignment.
* **Writes are staged in a fresh versioned namespace** ``<namespace>_v0001``,
  ``_v0002``, ...; ``tables_dir/manifest.json`` names the namespace in use and is written
  last (atomically). A failed write purges what it staged and leaves the previous version
  (and manifest) untouched; a successful one purges the previous version afterwards.
  Readers only ever follow the manifest, so they see the old tables or the new ones,
  never a mix. A ``TableStore`` object pins the version it first read; an overwrite by
  another process purges that version, so long-lived readers should reopen the store.
* **Readers read the Iceberg snapshot the manifest names**, not a table's current one: ``genrec data append``
  (:mod:`genrec.data.append`) adds each table's new rows as one more snapshot and then rewrites the manifest
  (the commit point) with the new snapshot ids, so a reader sees all three tables before an append or all three
  after it. The manifest's ``history`` lists every data version (1 = as prepared, then one per append) with its
  snapshot ids: :meth:`TableStore.at` reads the tables as they were at one of them (Iceberg time travel), and
  ``tables_version`` (``<namespace>.<data version>``) names what a checkpoint was trained on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# the bucketing and the chunk check live in genrec.data.buckets (re-exported here)
from genrec.data.buckets import (  # noqa: F401
    _BUCKETED,
    _SCHEMAS,
    _SORT_KEYS,
    _STORED_SCHEMAS,
    BUCKET,
    TABLES,
    conform,
    layout,
    murmur3_int64,
    user_bucket,
)
from genrec.data.schema import Dataset, DatasetInfo
from genrec.errors import ConfigError, GenrecError
from genrec.workdir import MANIFEST, WorkDir, atomic_write_json, manifest, read_json

# ----------------------------------------------------------------------------- store


class TableStore:
    """The three canonical tables in an Iceberg catalog, events/feedviews bucketed by user.

    ``catalog=None`` uses a SQLite-backed ``SqlCatalog`` at ``tables_dir/catalog.db`` with
    warehouse ``tables_dir/warehouse``; a dict is passed to
    :func:`pyiceberg.catalog.load_catalog` (``{"type": "rest", "uri": ...}``, Hive, Glue).
    ``tables_dir/manifest.json`` is always local and says which namespace holds the tables. The local catalogue
    records absolute paths; a run directory moved or copied since reads its tables where they lie now
    (:mod:`genrec.data.relocate`).
    """

    def __init__(self, tables_dir: str | Path, catalog: dict[str, Any] | None = None,
                 *, namespace: str = "genrec", data_version: int | None = None) -> None:
        """``data_version``: read the tables as they were at that entry of the manifest's ``history``
        (:meth:`at`); None: as they are now."""
        self.tables_dir = Path(tables_dir).expanduser().resolve()
        self.pinned_version = data_version
        self.namespace = namespace
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", namespace):
            raise ValueError(f"namespace must be an identifier, got {namespace!r}")
        self._catalog_conf = dict(catalog) if catalog is not None else None
        self._catalog: Any = None
        self._manifest: dict[str, Any] | None = None

    # -- catalog ---------------------------------------------------------------

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            # pyiceberg's catalogue modules load SQLAlchemy (~0.9 s): only a store that opens its catalogue pays it
            from pyiceberg.catalog import load_catalog

            if self._catalog_conf is None:
                from pyiceberg.catalog.sql import SqlCatalog  # (see above: SQLAlchemy)

                from genrec.data.relocate import recorded_roots, relocation_properties  # (SQLAlchemy, as above)

                wh = self.tables_dir / "warehouse"
                wh.mkdir(parents=True, exist_ok=True)
                # the warehouse as a plain path, not a file:// URI: pyiceberg does not unquote a URI's path, so a
                # folder named "a b" would have its files written to "a%20b", outside the run directory
                cat = SqlCatalog("genrec", uri=f"sqlite:///{self.tables_dir / 'catalog.db'}", warehouse=str(wh))
                # a moved or copied run directory: its tables are read where they lie now (genrec.data.relocate)
                cat.properties.update(relocation_properties(recorded_roots(cat, self.tables_dir), self.tables_dir))
                self._catalog = cat
            else:
                conf = dict(self._catalog_conf)
                self._catalog = load_catalog(conf.pop("name", "genrec"), **conf)
        return self._catalog

    @property
    def manifest_path(self) -> Path:
        return self.tables_dir / MANIFEST

    def exists(self) -> bool:
        """True when a complete write has finished (its manifest is present)."""
        return self.manifest_path.exists()

    def manifest(self) -> dict[str, Any]:
        if self._manifest is None:
            if not self.manifest_path.exists():
                raise GenrecError(
                    f"no tables at {self.tables_dir} ({self.manifest_path} missing): write a dataset first"
                )
            self._manifest = read_json(self.manifest_path)
        return self._manifest

    # -- versions (appends and time travel) -------------------------------------

    def history(self) -> list[dict[str, Any]]:
        """Every data version of these tables, oldest first: ``data_version`` (1 = as prepared, then one per
        ``genrec data append``), ``tables_version``, ``snapshots`` (the Iceberg snapshot id of each table; None
        for a table still empty), ``counts``, ``created``, ``kind`` (prepare / append). Tables written before
        versions were recorded have one entry without snapshots (their current data)."""
        m = self.manifest()
        if m.get("history"):
            return [dict(h) for h in m["history"]]
        return [{"data_version": 1, "tables_version": f"{m['namespace']}.1", "snapshots": None,
                 "counts": m.get("counts", {}), "created": m.get("created"), "kind": "prepare"}]

    def _entry(self) -> dict[str, Any]:
        """The history entry this store reads: the pinned one, else the newest."""
        hist = self.history()
        if self.pinned_version is None:
            return hist[-1]
        for h in hist:
            if int(h["data_version"]) == int(self.pinned_version):
                return h
        have = ", ".join(str(h["data_version"]) for h in hist)
        raise GenrecError(f"{self.tables_dir}: no data version {self.pinned_version} (these tables have {have}; "
                          f"`genrec data versions` lists them)")

    @property
    def data_version(self) -> int:
        """1 for the tables as prepared, +1 per append (of the version read: :meth:`at` pins an older one)."""
        return int(self._entry()["data_version"])

    @property
    def tables_version(self) -> str:
        """``<namespace>.<data version>``: what checkpoints record and the server names."""
        return str(self._entry()["tables_version"])

    def snapshot_ids(self) -> dict[str, int | None] | None:
        """The Iceberg snapshot each table is read at (None: tables without recorded snapshots, read as they are)."""
        snaps = self._entry().get("snapshots")
        return None if snaps is None else {k: (None if v is None else int(v)) for k, v in snaps.items()}

    def at(self, data_version: int) -> "TableStore":
        """These tables as they were at ``data_version`` (Iceberg time travel through the recorded snapshots):
        a read-only view; its reads return exactly what a reader got then."""
        view = TableStore(self.tables_dir, self._catalog_conf, namespace=self.namespace, data_version=data_version)
        view._catalog, view._manifest = self._catalog, self.manifest()
        view._entry()  # an unknown version fails here, naming the ones there are
        return view

    def _versions(self) -> list[int]:
        pat = re.compile(rf"{re.escape(self.namespace)}_v(\d+)")
        out = []
        for ns in self.catalog.list_namespaces():
            m = pat.fullmatch(".".join(ns))
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def _local(self, location: str) -> str:
        """Where a location recorded in the local catalogue lies now (a moved or copied run directory's tables
        are read under its current ``tables_dir``: :mod:`genrec.data.relocate`); others unchanged."""
        if self._catalog_conf is not None:
            return location
        from genrec.data.relocate import relocate  # it loads pyiceberg's SQL catalogue (SQLAlchemy): see catalog

        return relocate(location, self.catalog.properties)

    def _elsewhere(self, location: str | None) -> bool:
        """With the local catalogue: does a table's metadata ``location`` lie outside this store's ``tables_dir``
        even where the directory was moved or copied (:meth:`_local`)? Remote catalogues own their locations:
        always False."""
        if self._catalog_conf is not None or not location:
            return False
        return not Path(self._local(location).removeprefix("file://")).is_relative_to(self.tables_dir)

    def _purge_namespace(self, ns: str) -> None:
        """Drop every table in ``ns`` (deleting its files) and then ``ns`` itself; best effort. A moved or copied
        run directory deletes its own copies of the files (:meth:`_local`), never those of the place it came
        from; a table whose files lie outside ``tables_dir`` anyway is only dropped from this catalogue."""
        with contextlib.suppress(Exception):
            for ident in self.catalog.list_tables(ns):
                with contextlib.suppress(Exception):
                    if self._elsewhere(self.catalog.load_table(ident).metadata_location):
                        self.catalog.drop_table(ident)
                    else:
                        self.catalog.purge_table(ident)
            self.catalog.drop_namespace(ns)

    def clean_stale(self) -> int:
        """Purge staged namespaces the manifest does not point at (left by killed writers)."""
        current = self.manifest()["namespace"] if self.exists() else None
        n = 0
        for v in self._versions():
            ns = f"{self.namespace}_v{v:04d}"
            if ns != current:
                self._purge_namespace(ns)
                n += 1
        return n

    # -- write -----------------------------------------------------------------

    def _append(self, table: Any, data: pa.Table, name: str) -> None:
        """One Iceberg append (a separate method so tests can inject a failure mid-write)."""
        table.append(data)

    def check_writable(self, n_buckets: int, overwrite: bool) -> None:
        """Raise unless a write of ``n_buckets`` may start (a ConfigError for the count; a GenrecError when
        tables exist and ``overwrite`` is False)."""
        if not isinstance(n_buckets, int) or n_buckets < 1:
            raise ConfigError(f"--buckets: must be a positive integer, got {n_buckets!r}")
        if self.manifest_path.exists() and not overwrite:
            raise GenrecError(f"{self.tables_dir} already holds tables; pass overwrite=True to replace them")

    def write(self, ds: Dataset, n_buckets: int = 16, *, overwrite: bool = False) -> dict[str, Any]:
        """Write ``ds`` as a new table version and return the manifest written.

        The manifest is written last; until then the previous version stays current.
        """
        self.check_writable(n_buckets, overwrite)
        # checked before anything is staged: bad data leaves no namespace behind
        data = {name: layout(conform(getattr(ds, name), name), name, n_buckets) for name in TABLES}
        with self.open_writer(ds.info, n_buckets, source=ds.source, overwrite=overwrite) as w:
            for name in TABLES:
                w.append_laid_out(name, data[name])
        assert w.manifest is not None
        return w.manifest

    @contextlib.contextmanager
    def open_writer(self, info: DatasetInfo, n_buckets: int = 16, *, source: dict[str, Any] | None = None,
                    overwrite: bool = False) -> Iterator["TableWriter"]:
        """A streaming write: ``with store.open_writer(info, 16) as w: w.append("events", chunk); ...``.

        The three tables are created empty in a fresh versioned namespace; each :meth:`TableWriter.append` adds
        one chunk (one Iceberg append). Chunks of ``events``/``feedviews`` must hold *whole users* (all of a
        user's rows in one chunk: ``counts["users"]`` sums the users of each chunk). When the block ends without
        an error the manifest (built from ``w.info`` and ``w.source`` as they are then: a caller may fill in
        ``info.extra`` as it goes) is written -- the commit point, as in :meth:`write` -- and the previous version
        is purged; any exception purges what was staged and leaves the previous version current. The manifest
        written is ``w.manifest`` afterwards.
        """
        self.check_writable(n_buckets, overwrite)
        self._manifest = None  # re-read: another process may have written since
        from pyiceberg.exceptions import NamespaceAlreadyExistsError  # (pyiceberg: loaded on use, see catalog)

        self.tables_dir.mkdir(parents=True, exist_ok=True)
        previous = self.manifest()["namespace"] if self.exists() else None
        self.clean_stale()
        version = max(self._versions(), default=0) + 1
        if previous is not None:
            version = max(version, int(previous.rsplit("_v", 1)[1]) + 1)
        ns = f"{self.namespace}_v{version:04d}"
        try:
            with contextlib.suppress(NamespaceAlreadyExistsError):
                self.catalog.create_namespace(ns)
            tables = {}
            for name in TABLES:
                tables[name] = self.catalog.create_table(f"{ns}.{name}", schema=_STORED_SCHEMAS[name])
                if name in _BUCKETED:
                    with tables[name].update_spec() as spec:
                        spec.add_identity(BUCKET)
            w = TableWriter(self, tables, n_buckets, info, dict(source or {}))
            yield w
            counts = {**w.rows, "users": w.users}
            snapshots = {name: snapshot_id(tables[name]) for name in TABLES}
            body = manifest(
                "tables",
                inputs=w.source,
                params={"n_buckets": n_buckets,
                        "bucket_hash": "iceberg bucket[n](user_id): (murmur3_x86_32 & 0x7FFFFFFF) % n"},
                counts=counts,
                info=w.info.to_dict(),
                n_buckets=n_buckets,
                namespace=ns,
                version=version,
                tables={name: f"{ns}.{name}" for name in TABLES},
                catalog="sqlite" if self._catalog_conf is None else str(self._catalog_conf.get("type", "custom")),
                snapshots=snapshots,
                data_version=1,
                tables_version=f"{ns}.1",
            )
            body["history"] = [{"data_version": 1, "tables_version": f"{ns}.1", "snapshots": snapshots,
                                "counts": counts, "created": body["created"], "kind": "prepare"}]
            atomic_write_json(self.manifest_path, body)  # the commit point
        except BaseException:
            self._purge_namespace(ns)
            raise
        self._manifest = w.manifest = body
        if previous is not None and previous != ns:
            self._purge_namespace(previous)

    # -- read ------------------------------------------------------------------

    def info(self) -> DatasetInfo:
        return DatasetInfo.from_dict(self.manifest()["info"])

    @property
    def n_buckets(self) -> int:
        return int(self.manifest()["n_buckets"])

    def counts(self) -> dict[str, int]:
        return dict(self._entry().get("counts") or self.manifest()["counts"])

    def table(self, name: str) -> Any:
        """The pyiceberg ``Table`` currently holding ``name`` (events / feedviews / items)."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}; expected one of {TABLES}")
        try:
            return self.catalog.load_table(self.manifest()["tables"][name])
        except FileNotFoundError as e:
            if self._catalog_conf is not None:  # a remote catalogue: its own error says it best
                raise
            raise GenrecError(f"the {name} table's files under {self.tables_dir} are missing ({e}); prepare the "
                              f"data again (`genrec data prepare DATASET WORKDIR`)") from e

    def _scan(self, name: str, bucket: int | None, columns: list[str] | None = None) -> Any:
        """The scan of ``name`` at the snapshot this store reads; None when that table was empty then."""
        from pyiceberg.expressions import AlwaysTrue, EqualTo, Reference  # (pyiceberg: loaded on use, see catalog)
        from pyiceberg.expressions.literals import literal

        row_filter: Any = AlwaysTrue()
        if bucket is not None:
            if name not in _BUCKETED:
                raise ValueError(f"table {name!r} is not bucketed")
            if not (isinstance(bucket, (int, np.integer)) and 0 <= int(bucket) < self.n_buckets):
                raise ValueError(f"bucket must be an int in [0, {self.n_buckets}), got {bucket!r}")
            row_filter = EqualTo(term=Reference(BUCKET), value=literal(int(bucket)))
        fields = tuple(columns) if columns is not None else ("*",)
        snaps = self.snapshot_ids()
        if snaps is None:  # tables written before snapshots were recorded: as they are
            return self.table(name).scan(row_filter=row_filter, selected_fields=fields)
        if snaps.get(name) is None:
            return None
        return self.table(name).scan(row_filter=row_filter, selected_fields=fields, snapshot_id=snaps[name])

    def planned_files(self, name: str, bucket: int | None = None) -> list[str]:
        """Data files a read of ``name`` (one bucket or all) would open: shows partition pruning."""
        scan = self._scan(name, bucket)
        return [] if scan is None else [self._local(task.file.file_path) for task in scan.plan_files()]

    def _read(self, name: str, bucket: int | None, columns: list[str] | None) -> pa.Table:
        schema = _SCHEMAS[name]
        if columns is not None:
            unknown = [c for c in columns if c not in schema.names]
            if unknown:
                raise ValueError(f"unknown column(s) {unknown} for table {name!r}; has {schema.names}")
            schema = pa.schema([schema.field(c) for c in columns])
        # after an append a table is several writes' files, each sorted: the rows are sorted again, as prepared
        order = ([(BUCKET, "ascending")] if name in _BUCKETED else []) + _SORT_KEYS[name] \
            if self.data_version > 1 else []
        read = None if columns is None else list(dict.fromkeys([*columns, *(k for k, _ in order)]))
        scan = self._scan(name, bucket, read)
        if scan is None:
            return schema.empty_table()
        raw = scan.to_arrow()
        if order:
            raw = raw.sort_by(order)
        cols = [raw.column(f.name).cast(f.type) for f in schema]
        return pa.Table.from_arrays(cols, schema=schema)

    def read_events(self, bucket: int | None = None, *, columns: list[str] | None = None) -> pa.Table:
        """Events of one bucket (only that bucket's files are scanned) or all; canonical schema."""
        return self._read("events", bucket, columns)

    def read_feedviews(self, bucket: int | None = None, *, columns: list[str] | None = None) -> pa.Table:
        return self._read("feedviews", bucket, columns)

    def read_items(self) -> pa.Table:
        return self._read("items", None, None)

    def iter_buckets(self) -> Iterator[tuple[int, pa.Table, pa.Table]]:
        """``(bucket, events, feedviews)`` for each bucket in turn; one bucket in memory at a time."""
        for b in range(self.n_buckets):
            yield b, self.read_events(b), self.read_feedviews(b)

    def read(self) -> Dataset:
        """The whole dataset back in memory (small data, tests)."""
        m = self.manifest()
        return Dataset(self.info(), self.read_events(), self.read_items(), self.read_feedviews(),
                       source=dict(m.get("inputs", {})))


def snapshot_id(table: Any) -> int | None:
    """The current snapshot id of a pyiceberg ``Table`` (None: no snapshot yet, an empty table)."""
    snap = table.current_snapshot()
    return None if snap is None else int(snap.snapshot_id)


class TableWriter:
    """One open streaming write (:meth:`TableStore.open_writer`); counts what it appended."""

    def __init__(self, store: TableStore, tables: dict[str, Any], n_buckets: int, info: DatasetInfo,
                 source: dict[str, Any]) -> None:
        self._store = store
        self._tables = tables
        self.n_buckets = n_buckets
        self.info = info
        """Saved in the manifest at the commit: may be changed (``info.extra`` filled in) until then."""
        self.source = source
        self.rows = {name: 0 for name in TABLES}
        self.users = 0
        self.manifest: dict[str, Any] | None = None
        """The manifest written, once the ``with`` block has committed."""

    def append(self, name: str, table: pa.Table) -> None:
        """Check (:func:`conform`), bucket, sort and append one chunk of table ``name``."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}; expected one of {TABLES}")
        self.append_laid_out(name, layout(conform(table, name), name, self.n_buckets))

    def append_laid_out(self, name: str, data: pa.Table) -> None:
        """Append a chunk already passed through :func:`conform` and :func:`layout`."""
        self._store._append(self._tables[name], data, name)
        self.rows[name] += data.num_rows
        if name == "events":
            self.users += len(pc.unique(data.column("user_id")))


def catalog_config() -> dict[str, Any] | None:
    """Iceberg catalog settings: ``$GENREC_ICEBERG_CATALOG`` as JSON (e.g. ``{"type": "rest",
    "uri": "https://..."}``, passed to ``pyiceberg.catalog.load_catalog``); unset = the embedded
    SQLite catalog + local warehouse under ``WORKDIR/tables``."""
    raw = os.environ.get("GENREC_ICEBERG_CATALOG")
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"GENREC_ICEBERG_CATALOG is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError("GENREC_ICEBERG_CATALOG must be a JSON object")
    return cfg


def open_store(workdir: str | Path) -> TableStore:
    """The tables of run directory ``workdir`` (``WORKDIR/tables``, under :func:`catalog_config`'s catalog);
    a :class:`GenrecError` naming the command to run when they were never prepared."""
    wd = WorkDir(workdir)
    store = TableStore(wd.tables, catalog_config())
    if not store.exists():
        raise GenrecError(f"{wd.root} has no prepared tables: run `genrec data prepare DATASET {wd.root}` first")
    return store
