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

from genrec.data.schema import EVENTS_SCHEMA, FEEDVIEWS_SCHEMA, ITEMS_SCHEMA, Dataset, DatasetInfo
from genrec.errors import ConfigError, DataError, GenrecError
from genrec.workdir import MANIFEST, WorkDir, atomic_write_json, manifest, read_json

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
                 *, namespace: str = "genrec") -> None:
        self.tables_dir = Path(tables_dir).expanduser().resolve()
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
            from pyiceberg.catalog import load_catalog

            if self._catalog_conf is None:
                from pyiceberg.catalog.sql import SqlCatalog

                from genrec.data.relocate import recorded_roots, relocation_properties

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
        from genrec.data.relocate import relocate

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
        from pyiceberg.exceptions import NamespaceAlreadyExistsError

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
            )
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
        return dict(self.manifest()["counts"])

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
        from pyiceberg.expressions import AlwaysTrue, EqualTo, Reference
        from pyiceberg.expressions.literals import literal

        row_filter: Any = AlwaysTrue()
        if bucket is not None:
            if name not in _BUCKETED:
                raise ValueError(f"table {name!r} is not bucketed")
            if not (isinstance(bucket, (int, np.integer)) and 0 <= int(bucket) < self.n_buckets):
                raise ValueError(f"bucket must be an int in [0, {self.n_buckets}), got {bucket!r}")
            row_filter = EqualTo(term=Reference(BUCKET), value=literal(int(bucket)))
        fields = tuple(columns) if columns is not None else ("*",)
        return self.table(name).scan(row_filter=row_filter, selected_fields=fields)

    def planned_files(self, name: str, bucket: int | None = None) -> list[str]:
        """Data files a read of ``name`` (one bucket or all) would open: shows partition pruning."""
        return [self._local(task.file.file_path) for task in self._scan(name, bucket).plan_files()]

    def _read(self, name: str, bucket: int | None, columns: list[str] | None) -> pa.Table:
        schema = _SCHEMAS[name]
        if columns is not None:
            unknown = [c for c in columns if c not in schema.names]
            if unknown:
                raise ValueError(f"unknown column(s) {unknown} for table {name!r}; has {schema.names}")
            schema = pa.schema([schema.field(c) for c in columns])
        raw = self._scan(name, bucket, columns).to_arrow()
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
