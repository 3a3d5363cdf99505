"""`genrec data append`: a later day's logs as a new data version of the tables -- the same events as preparing
everything at once, feedviews by the tables' rule, new items added, duplicates and older events refused, every
earlier version readable (Iceberg time travel), and an append that fails (or is killed) changing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from genrec.cli import app
from genrec.data import append as append_mod
from genrec.data.ingest import ColumnMapping, IngestOptions
from genrec.data.ingest.feedviews import feedviews_reference
from genrec.data.store import TableStore
from genrec.errors import DataError
from genrec.recipes import pipeline as P
from tests.daily_logs import fake_movielens, split_by_time


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("append-logs")
    everything = fake_movielens(root / "all", users=60, items=90, per_user=12, seed=4)
    day1, day2 = split_by_time(everything, root, frac=0.7)
    return everything, day1, day2


def _day1(tmp_path: Path, day1: Path) -> Path:
    wd = tmp_path / "run"
    P.prepare(wd, "movielens-100k", source=day1, n_buckets=3)
    return wd


def _rows(t: pa.Table, cols: list[str]) -> list[tuple]:
    return sorted(zip(*(t.column(c).to_pylist() for c in cols)))


def test_append_is_preparing_everything_at_once(logs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    everything, day1, day2 = logs
    wd = _day1(tmp_path, day1)
    before = TableStore(wd / "tables")
    ev1, fv1, it1 = before.read_events(), before.read_feedviews(), before.read_items()
    out = P.append(wd, day2)
    assert out["tables_version"] == "genrec_v0001.2" and out["data_version"] == 2
    store = TableStore(wd / "tables")
    ev = store.read_events()
    # the slow twin: the whole log prepared in one go gives the same events, seq for seq, and the same items
    whole = P.prepare(tmp_path / "whole", "movielens-100k", source=everything, n_buckets=3)
    ref = TableStore(tmp_path / "whole" / "tables")
    assert ev.equals(ref.read_events()), "appended events differ from preparing the whole log"
    assert store.read_items().equals(ref.read_items())
    assert store.counts() == {**whole["counts"], "feedviews": store.counts()["feedviews"]}
    # feedviews: the tables' rule (slates of 8 from seq 0) for day 1, and from each user's first appended event
    n1 = ev1.num_rows
    new = ev.filter(pa.compute.invert(pa.compute.is_in(
        pa.array([f"{u}/{s}" for u, s in zip(ev.column("user_id").to_pylist(), ev.column("seq").to_pylist())]),
        value_set=pa.array([f"{u}/{s}" for u, s in zip(ev1.column("user_id").to_pylist(),
                                                         ev1.column("seq").to_pylist())]))))
    assert new.num_rows == ev.num_rows - n1 == out["added"]["events"]
    info = store.info()
    want = feedviews_reference(ev1.to_pylist(), info.actions, 8) + feedviews_reference(new.to_pylist(), info.actions, 8)
    got = store.read_feedviews().to_pylist()
    key = lambda r: (r["user_id"], r["request_seq"])  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)
    assert "appended" in info.feedview_rule
    # new items: those day 2 rates that day 1 did not
    added = set(store.read_items().column("item_id").to_pylist()) - set(it1.column("item_id").to_pylist())
    assert len(added) == out["added"]["items"] > 0
    # every version stays readable: version 1 is exactly what was read before the append
    then = store.at(1)
    assert then.read_events().equals(ev1) and then.read_feedviews().equals(fv1) and then.read_items().equals(it1)
    assert then.tables_version == "genrec_v0001.1" and then.counts()["events"] == n1
    for b in range(store.n_buckets):  # a bucket read at either version: that version's rows of the bucket
        assert then.read_events(b).equals(ev1.filter(pa.compute.is_in(
            ev1.column("user_id"), value_set=then.read_events(b).column("user_id"))))
    with pytest.raises(Exception, match="no data version 3"):
        store.at(3)


def test_duplicates_refused_or_skipped(logs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, day1, day2 = logs
    wd = _day1(tmp_path, day1)
    P.append(wd, day2)
    manifest = (wd / "tables" / "manifest.json").read_bytes()
    with pytest.raises(DataError, match="in the tables already.*--skip-duplicates"):
        P.append(wd, day2)  # the same log twice
    assert (wd / "tables" / "manifest.json").read_bytes() == manifest
    out = P.append(wd, day2, skip_duplicates=True)  # nothing new: nothing written
    assert out["data_version"] == 2 and out["added"]["events"] == 0 and any("nothing new" in n for n in out["notes"])
    # a log with one new event among old ones: the new one only
    lines = (day2 / "u.data").read_text().splitlines()
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "u.item").write_bytes((day2 / "u.item").read_bytes())
    u, i, r, t = lines[-1].split("\t")
    (mixed / "u.data").write_text("\n".join([*lines[:5], f"{u}\t{i}\t{r}\t{int(t) + 10}"]) + "\n")
    out = P.append(wd, mixed, skip_duplicates=True)
    assert out["data_version"] == 3 and out["added"]["events"] == 1 and out["added"]["duplicates_skipped"] == 5


def test_older_events_and_unknown_vocabulary_refused(logs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, day1, day2 = logs
    wd = _day1(tmp_path, day1)
    last = TableStore(wd / "tables").read_events()
    u = int(last.column("user_id")[0].as_py())
    t_last = max(t for uu, t in zip(last.column("user_id").to_pylist(), last.column("timestamp").to_pylist())
                 if uu == u)
    old = tmp_path / "old"
    old.mkdir()
    (old / "u.item").write_bytes((day2 / "u.item").read_bytes())
    item = int(last.column("item_id")[0].as_py())
    (old / "u.data").write_text(f"{u}\t{item}\t3\t{t_last - 1}\n")
    with pytest.raises(DataError, match=f"older than their user's last stored event.*user {u}"):
        P.append(wd, old)
    assert TableStore(wd / "tables").data_version == 1


def test_new_items_added_and_known_items_keep_their_rows(logs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, day1, day2 = logs
    wd = _day1(tmp_path, day1)
    stored = TableStore(wd / "tables").read_items()
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "u.data").write_bytes((day2 / "u.data").read_bytes())
    lines = (day2 / "u.item").read_text(encoding="latin-1").splitlines()
    first = lines[0].split("|")
    first[1] = "A Different Title (1999)"
    (changed / "u.item").write_text("\n".join(["|".join(first), *lines[1:]]) + "\n", encoding="latin-1")
    out = P.append(wd, changed)
    assert out["added"]["items_kept_as_stored"] == 1 and any("stored rows are kept" in n for n in out["notes"])
    items = TableStore(wd / "tables").read_items()
    known = items.filter(pa.compute.is_in(items.column("item_id"), value_set=stored.column("item_id")))
    assert known.equals(stored)


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("killed", [False, True], ids=["failed", "killed"])
def test_a_failed_or_killed_append_changes_nothing(logs: tuple[Path, Path, Path], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, killed: bool) -> None:
    everything, day1, day2 = logs
    wd = _day1(tmp_path, day1)
    store = TableStore(wd / "tables")
    before = (store.read_events(), store.read_feedviews(), store.read_items())
    manifest = (wd / "tables" / "manifest.json").read_bytes()
    real = TableStore._append

    def flaky(self: TableStore, table: object, data: pa.Table, name: str) -> None:
        if name == "items":  # events and feedviews already have their new snapshots
            raise Boom("injected failure appending items")
        real(self, table, data, name)

    monkeypatch.setattr(TableStore, "_append", flaky)
    if killed:  # as if the process died before it could roll back: the tables keep the orphan snapshots
        monkeypatch.setattr(append_mod, "_roll_back", lambda table, base: None)
    with pytest.raises(Boom):
        P.append(wd, day2)
    assert (wd / "tables" / "manifest.json").read_bytes() == manifest
    fresh = TableStore(wd / "tables")
    assert all(a.equals(b) for a, b in zip((fresh.read_events(), fresh.read_feedviews(), fresh.read_items()), before))
    if killed:  # the orphan snapshot is there, unread
        assert TableStore(wd / "tables").table("events").current_snapshot().snapshot_id != \
            json.loads(manifest)["snapshots"]["events"]
    monkeypatch.undo()
    P.append(wd, day2)  # the next append rolls back what was left first: no row twice
    ref = tmp_path / "whole"
    P.prepare(ref, "movielens-100k", source=everything, n_buckets=3)
    assert TableStore(wd / "tables").read_events().equals(TableStore(ref / "tables").read_events())
    assert TableStore(wd / "tables").read_items().num_rows == TableStore(ref / "tables").read_items().num_rows


def test_cli_append_and_versions(logs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, day1, day2 = logs
    wd = _day1(tmp_path, day1)
    r = CliRunner().invoke(app, ["data", "append", str(wd), "--source", str(day2)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):])
    assert out["tables_version"] == "genrec_v0001.2" and out["added"]["events"] > 0
    r = CliRunner().invoke(app, ["data", "append", str(wd), "--source", str(day2)])
    assert r.exit_code == 2 and "--skip-duplicates" in r.output
    r = CliRunner().invoke(app, ["data", "versions", str(wd)])
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)
    assert v["current"] == "genrec_v0001.2"
    assert [x["kind"] for x in v["versions"]] == ["prepare", "append"]
    assert all(set(x["snapshots"]) == {"events", "feedviews", "items"} for x in v["versions"])
    np.testing.assert_array_less(0, [x["counts"]["events"] for x in v["versions"]])


def test_generic_logs_keep_the_tables_columns_and_vocabulary(tmp_path: Path) -> None:
    """A generic log prepared with its own column names: the next day's file is read by the same mapping without
    naming it again; a new item comes with its row from the items file; an action the tables lack is refused."""
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "d1" / "events.csv").write_text("uid,iid,ts,act\n1,10,100,click\n1,11,110,buy\n2,10,105,click\n")
    (tmp_path / "d1" / "items.csv").write_text("iid,title\n10,Ten\n11,Eleven\n")
    (tmp_path / "d2" / "events.csv").write_text("uid,iid,ts,act\n1,12,200,click\n3,10,210,buy\n")
    (tmp_path / "d2" / "items.csv").write_text("iid,title\n10,Ten\n11,Eleven\n12,Twelve\n")
    (tmp_path / "bad" / "events.csv").write_text("uid,iid,ts,act\n1,12,300,share\n")
    (tmp_path / "bad" / "items.csv").write_text("iid,title\n12,Twelve\n")
    wd = tmp_path / "run"
    P.prepare(wd, "generic", source=tmp_path / "d1" / "events.csv", n_buckets=2,
              options=IngestOptions(columns=ColumnMapping(user="uid", item="iid", timestamp="ts", action="act")))
    out = P.append(wd, tmp_path / "d2" / "events.csv")
    assert out["added"] == {**out["added"], "events": 2, "items": 1, "users": 1}
    store = TableStore(wd / "tables")
    ev = store.read_events()
    assert _rows(ev, ["user_id", "item_id", "action", "seq"]) == [(1, 10, "click", 0), (1, 11, "buy", 1),
                                                                 (1, 12, "click", 2), (2, 10, "click", 0),
                                                                 (3, 10, "buy", 0)]
    assert "Twelve" in store.read_items().column("title").to_pylist()
    with pytest.raises(DataError, match="share"):
        P.append(wd, tmp_path / "bad" / "events.csv")
    assert TableStore(wd / "tables").data_version == 2
