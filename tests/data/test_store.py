"""TableStore: exact round trips, bucket pruning, staged (all-or-nothing) writes, the bucket hash."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genrec.data.schema import EVENTS_SCHEMA, FEEDVIEWS_SCHEMA, ITEMS_SCHEMA, Dataset, DatasetInfo
from genrec.data.store import TableStore, murmur3_int64, user_bucket
from genrec.errors import DataError, GenrecError
from tests.synthetic_datasets import is_synthetic, stats

INFO = DatasetInfo(name="synthetic", actions=["click", "save", "hide"], positive_actions=["click", "save"],
                   surfaces=["home", "search"], feedview_rule="consecutive events, slates of up to 4")


# ----------------------------------------------------------------------------- helpers


def _sorted_rows(t: pa.Table, keys: list[str]) -> list[dict]:
    rows = t.to_pylist()
    return sorted(rows, key=lambda r: tuple(json.dumps(r[k]) for k in keys) + (json.dumps(r, sort_keys=True),))


def assert_same(a: pa.Table, b: pa.Table, keys: list[str]) -> None:
    assert a.schema.equals(b.schema), (a.schema, b.schema)
    assert a.num_rows == b.num_rows
    assert _sorted_rows(a, keys) == _sorted_rows(b, keys)


@st.composite
def datasets(draw: st.DrawFn, max_users: int = 8) -> Dataset:
    uids = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=max_users, unique=True))
    ev: dict[str, list] = {f: [] for f in EVENTS_SCHEMA.names}
    fv: dict[str, list] = {f: [] for f in FEEDVIEWS_SCHEMA.names}
    text = st.text(max_size=6)
    for u in uids:
        n = draw(st.integers(0, 6))
        for s in range(n):
            ev["user_id"].append(u)
            ev["item_id"].append(draw(st.integers(-(2**63), 2**63 - 1)))
            ev["surface"].append(draw(st.sampled_from(INFO.surfaces)))
            ev["action"].append(draw(st.sampled_from(INFO.actions)))
            ev["timestamp"].append(draw(st.integers(-(2**40), 2**40)))
            ev["seq"].append(s)
        for _ in range(draw(st.integers(0, 3))):
            k = draw(st.integers(1, 4))
            fv["user_id"].append(u)
            fv["request_ts"].append(draw(st.integers(0, 2**40)))
            fv["request_seq"].append(draw(st.integers(0, 2**31 - 1)))
            fv["surface"].append(draw(st.sampled_from(INFO.surfaces)))
            fv["item_ids"].append(draw(st.lists(st.integers(0, 2**62), min_size=k, max_size=k)))
            fv["labels"].append(draw(st.lists(st.integers(0, 7), min_size=k, max_size=k)))
    item_ids = draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6, unique=True))
    items = {
        "item_id": item_ids,
        "title": [draw(st.one_of(st.none(), text)) for _ in item_ids],
        "text": [draw(text) for _ in item_ids],
        "attributes": [json.dumps({"g": draw(text)}) for _ in item_ids],
    }
    return Dataset(INFO, pa.table(ev, schema=EVENTS_SCHEMA), pa.table(items, schema=ITEMS_SCHEMA),
                   pa.table(fv, schema=FEEDVIEWS_SCHEMA), source={"kind": "synthetic"})


def small_dataset(n_users: int = 12, shift: int = 0) -> Dataset:
    rng = np.random.default_rng(n_users + shift)
    ev: dict[str, list] = {f: [] for f in EVENTS_SCHEMA.names}
    fv: dict[str, list] = {f: [] for f in FEEDVIEWS_SCHEMA.names}
    for u in range(shift, shift + n_users):
        n = int(rng.integers(1, 6))
        items = rng.integers(0, 30, n).tolist()
        for s in range(n):
            ev["user_id"].append(u), ev["item_id"].append(items[s]), ev["surface"].append("home")
            ev["action"].append("click"), ev["timestamp"].append(100 * u + s), ev["seq"].append(s)
        fv["user_id"].append(u), fv["request_ts"].append(100 * u), fv["request_seq"].append(0)
        fv["surface"].append("home"), fv["item_ids"].append(items), fv["labels"].append([1] * n)
    items_t = pa.table({"item_id": list(range(30)), "title": [f"t{i}" for i in range(30)],
                        "text": [f"x{i}" for i in range(30)], "attributes": ["{}"] * 30}, schema=ITEMS_SCHEMA)
    return Dataset(INFO, pa.table(ev, schema=EVENTS_SCHEMA), items_t, pa.table(fv, schema=FEEDVIEWS_SCHEMA))


# ----------------------------------------------------------------------------- hash


def test_bucket_hash_is_the_iceberg_spec() -> None:
    assert int(murmur3_int64(np.array([34]))[0]) == 2017239379  # Iceberg spec test vector


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20), n=st.integers(1, 1000))
def test_bucket_matches_pyiceberg_transform(ids: list[int], n: int) -> None:
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import LongType

    ref = BucketTransform(n).transform(LongType())  # slow scalar twin (mmh3)
    assert user_bucket(np.array(ids, dtype=np.int64), n).tolist() == [ref(i) for i in ids]


# ----------------------------------------------------------------------------- round trips


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ds=datasets(), n_buckets=st.integers(1, 8))
def test_round_trip_synthetic(tmp_path_factory: pytest.TempPathFactory, ds: Dataset, n_buckets: int) -> None:
    store = TableStore(tmp_path_factory.mktemp("tables"))
    store.write(ds, n_buckets)
    store = TableStore(store.tables_dir)  # a fresh reader sees the same
    assert store.n_buckets == n_buckets and store.info() == INFO
    assert_same(store.read_events(), ds.events, ["user_id", "seq"])
    assert_same(store.read_feedviews(), ds.feedviews, ["user_id", "request_seq"])
    assert_same(store.read_items(), ds.items, ["item_id"])
    # buckets partition the rows, and every row is in its user's bucket
    parts = [store.read_events(b) for b in range(n_buckets)]
    for b, p in enumerate(parts):
        assert (user_bucket(p.column("user_id"), n_buckets) == b).all()
    assert_same(pa.concat_tables(parts), ds.events, ["user_id", "seq"])
    fparts = [store.read_feedviews(b) for b in range(n_buckets)]
    assert_same(pa.concat_tables(fparts), ds.feedviews, ["user_id", "request_seq"])
    m = store.manifest()
    assert m["counts"]["events"] == ds.events.num_rows and m["counts"]["feedviews"] == ds.feedviews.num_rows


def movielens_events(path: Path) -> pa.Table:
    """u.data -> canonical events: seq = order by (timestamp, line) per user."""
    raw = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=["u", "i", "r", "t"]),
                         parse_options=pacsv.ParseOptions(delimiter="\t"))
    u = raw.column("u").to_numpy().astype(np.int64)
    t = raw.column("t").to_numpy().astype(np.int64)
    order = np.lexsort((np.arange(u.size), t, u))
    starts = np.r_[0, np.flatnonzero(u[order][1:] != u[order][:-1]) + 1]
    rank = np.arange(u.size) - np.repeat(starts, np.diff(np.r_[starts, u.size]))
    seq = np.empty(u.size, dtype=np.int32)
    seq[order] = rank
    r = raw.column("r").to_numpy()
    return pa.table({
        "user_id": u, "item_id": raw.column("i").to_numpy().astype(np.int64),
        "surface": pa.array(["web"] * u.size), "action": pa.array(np.where(r >= 4, "like", "rate").tolist()),
        "timestamp": t, "seq": seq,
    }, schema=EVENTS_SCHEMA)


def test_round_trip_movielens(tmp_path: Path, data_root: Path) -> None:
    path = data_root / "movielens-100k" / "u.data"
    want = stats(path.parent) if is_synthetic(path.parent) else {"ratings": 100_000, "users": 943}
    events = movielens_events(path)
    assert events.num_rows == want["ratings"]
    info = DatasetInfo("ml-100k", actions=["rate", "like"], positive_actions=["like"], surfaces=["web"],
                       feedview_rule="none")
    ids = np.unique(events.column("item_id").to_numpy()).tolist()
    items = pa.table({"item_id": ids, "title": [None] * len(ids), "text": [f"movie {i}" for i in ids],
                      "attributes": ["{}"] * len(ids)}, schema=ITEMS_SCHEMA)
    fv = FEEDVIEWS_SCHEMA.empty_table()
    store = TableStore(tmp_path / "tables")
    store.write(Dataset(info, events, items, fv, source={"path": str(path)}), n_buckets=16)
    assert_same(store.read_events(), events, ["user_id", "seq"])
    assert_same(store.read_items(), items, ["item_id"])
    assert store.read_feedviews().num_rows == 0
    assert store.counts()["users"] == want["users"]
    b = 5
    part = store.read_events(b)
    assert part.num_rows == int((user_bucket(events.column("user_id"), 16) == b).sum())


# ----------------------------------------------------------------------------- pruning, staging


def test_bucket_read_scans_only_that_bucket(tmp_path: Path) -> None:
    store = TableStore(tmp_path)
    store.write(small_dataset(40), n_buckets=4)
    every = store.planned_files("events")
    assert len(every) == 4  # one file per non-empty bucket partition
    for b in range(4):
        files = store.planned_files("events", b)
        assert len(files) == 1 and f"/bucket={b}/" in files[0]
        assert len(store.planned_files("feedviews", b)) == 1
    with pytest.raises(ValueError, match="bucket"):
        store.read_events(4)
    with pytest.raises(ValueError, match="not bucketed"):
        store.planned_files("items", 0)


class Boom(RuntimeError):
    pass


def _fail_on(store: TableStore, table_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = TableStore._append

    def flaky(self: TableStore, table: object, data: pa.Table, name: str) -> None:
        if name == table_name:
            raise Boom(f"injected failure writing {name}")
        real(self, table, data, name)

    monkeypatch.setattr(TableStore, "_append", flaky)


def test_failed_first_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TableStore(tmp_path)
    _fail_on(store, "feedviews", monkeypatch)
    with pytest.raises(Boom):
        store.write(small_dataset(), n_buckets=2)
    assert not store.exists() and not (tmp_path / "manifest.json").exists()
    assert store._versions() == []  # staged namespace dropped
    with pytest.raises(GenrecError, match="no tables"):
        store.read_events()


def test_failed_overwrite_keeps_previous_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = small_dataset(10), small_dataset(7, shift=1000)
    store = TableStore(tmp_path)
    store.write(old, n_buckets=3)
    before = (tmp_path / "manifest.json").read_bytes()
    _fail_on(store, "items", monkeypatch)  # events + feedviews of the new version already appended
    with pytest.raises(Boom):
        store.write(new, n_buckets=5, overwrite=True)
    assert (tmp_path / "manifest.json").read_bytes() == before
    fresh = TableStore(tmp_path)
    assert fresh.n_buckets == 3
    assert_same(fresh.read_events(), old.events, ["user_id", "seq"])
    assert_same(fresh.read_feedviews(), old.feedviews, ["user_id", "request_seq"])
    assert_same(fresh.read_items(), old.items, ["item_id"])
    assert fresh._versions() == [1]
    monkeypatch.undo()
    # a later successful overwrite replaces it and purges the old version's files
    fresh.write(new, n_buckets=5, overwrite=True)
    assert fresh._versions() == [2] and fresh.n_buckets == 5
    assert_same(TableStore(tmp_path).read_events(), new.events, ["user_id", "seq"])
    assert not any((tmp_path / "warehouse" / "genrec_v0001").rglob("*.parquet"))


def test_write_refuses_to_overwrite_by_default(tmp_path: Path) -> None:
    store = TableStore(tmp_path)
    store.write(small_dataset(), n_buckets=2)
    with pytest.raises(GenrecError, match="overwrite"):
        store.write(small_dataset(), n_buckets=2)


def test_bad_tables_name_the_field(tmp_path: Path) -> None:
    ds = small_dataset()
    store = TableStore(tmp_path)
    with pytest.raises(DataError, match="events: field 'seq'"):
        store.write(Dataset(INFO, ds.events.drop_columns(["seq"]), ds.items, ds.feedviews), 2)
    bad_fv = ds.feedviews.set_column(5, "labels", pa.array([[1]] * ds.feedviews.num_rows, pa.list_(pa.int32())))
    with pytest.raises(DataError, match="field 'labels'"):
        store.write(Dataset(INFO, ds.events, ds.items, bad_fv), 2)
    nulls = ds.events.set_column(1, "item_id", pa.array([None] * ds.events.num_rows, pa.int64()))
    with pytest.raises(DataError, match="field 'item_id'.*null"):
        store.write(Dataset(INFO, nulls, ds.items, ds.feedviews), 2)
    assert not store.exists()


def test_catalog_config_from_environment(monkeypatch, tmp_path):
    """A non-default Iceberg catalog comes from configuration; bad configuration is named."""
    import pytest as _pt

    from genrec.data.store import catalog_config
    from genrec.errors import ConfigError as _CE

    monkeypatch.delenv("GENREC_ICEBERG_CATALOG", raising=False)
    assert catalog_config() is None
    monkeypatch.setenv("GENREC_ICEBERG_CATALOG", '{"type": "sql", "uri": "sqlite:///%s/x.db"}' % tmp_path)
    assert catalog_config()["type"] == "sql"
    monkeypatch.setenv("GENREC_ICEBERG_CATALOG", "{not json")
    with _pt.raises(_CE, match="GENREC_ICEBERG_CATALOG"):
        catalog_config()


@pytest.mark.parametrize("how", ["move", "copy"])
def test_moved_or_copied_tables_read_where_they_lie_now(tmp_path: Path, how: str) -> None:
    """Iceberg records absolute paths, but a tables directory moved or copied elsewhere (its original gone) reads
    back the same rows from its new place, each data file opened there; its files on disk are not touched."""
    import hashlib
    import shutil

    def tree(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    old, new = tmp_path / "old", tmp_path / "elsewhere" / "new"
    TableStore(old).write(small_dataset(), n_buckets=2)
    before = TableStore(old).read()
    new.parent.mkdir()
    if how == "move":
        shutil.move(old, new)
    else:
        shutil.copytree(old, new)
        shutil.rmtree(old)
    files = tree(new)
    st = TableStore(new)
    assert_same(st.read_events(), before.events, ["user_id", "seq"])
    assert_same(st.read_feedviews(), before.feedviews, ["user_id", "request_seq"])
    assert st.read_items().equals(before.items)
    assert sorted(st.read_events(1).column("user_id").to_pylist()) == sorted(
        u for u in before.events.column("user_id").to_pylist() if user_bucket([u], 2)[0] == 1)
    assert all(Path(f).is_relative_to(new) for f in st.planned_files("events"))
    assert tree(new) == files  # a read-only open: nothing rewritten
    shutil.move(new, tmp_path / "again")  # moved a second time
    assert TableStore(tmp_path / "again").read_items().equals(before.items)


def test_a_folder_name_that_a_uri_would_quote_keeps_its_files_inside(tmp_path: Path) -> None:
    """The warehouse was handed to pyiceberg as a file:// URI, whose path pyiceberg does not unquote: the tables
    of ``run dir`` were written to ``run%20dir``, beside the run directory (and left behind by a move)."""
    import shutil

    where = tmp_path / "run dir#1"
    TableStore(where).write(small_dataset(), n_buckets=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run dir#1"]
    shutil.move(where, tmp_path / "moved")
    assert TableStore(tmp_path / "moved").read_events().num_rows == small_dataset().events.num_rows


def test_preparing_a_copy_again_never_deletes_its_originals_tables(tmp_path: Path) -> None:
    """A tables directory copied while its original still exists reads its own copies of the files (its catalogue
    names the original's). Writing new tables into the copy had purged the original's files -- its data lost.
    The copy now purges only its own."""
    import shutil

    old, new = tmp_path / "old", tmp_path / "new"
    TableStore(old).write(small_dataset(), n_buckets=2)
    before = TableStore(old).read_events()
    shutil.copytree(old, new)
    assert TableStore(new).read_events().equals(before)
    TableStore(new).write(small_dataset(), n_buckets=3, overwrite=True)  # prepare the copy again, in place
    assert TableStore(old).read_events().equals(before)  # the original still reads, unchanged
    assert not list((new / "warehouse" / "genrec_v0001").rglob("*.parquet"))  # the copy's own old files purged
    assert TableStore(new).n_buckets == 3 and TableStore(new).read_events().num_rows == before.num_rows
    assert all(Path(f).is_relative_to(new.resolve()) or f.startswith("file://" + str(new.resolve()))
               for f in TableStore(new).planned_files("events"))
