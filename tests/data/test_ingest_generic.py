"""Generic Parquet/CSV ingestion: column mapping, string ids, items file policy."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genrec.data.ingest import ColumnMapping, IngestOptions, prepare_dataset
from genrec.errors import ConfigError, DataError, MissingDataError

MAP = ColumnMapping(user="uid", item="iid", timestamp="ts", action="act", surface="where")


def _events_table() -> pa.Table:
    return pa.table({
        "uid": [2, 1, 1, 2, 1],
        "iid": [10, 11, 10, 12, 12],
        "ts": [5, 9, 3, 5, 9],
        "act": ["click", "buy", "click", "skip", "click"],
        "where": ["home", "home", "search", "home", "home"],
        "extra": [0, 0, 0, 0, 0],
    })


def test_parquet_events_with_mapping(tmp_path: Path) -> None:
    pq.write_table(_events_table(), tmp_path / "events.parquet")
    opts = IngestOptions(columns=MAP, actions=("click", "buy", "skip"), positive_actions=("click", "buy"))
    ds = prepare_dataset("generic", tmp_path, options=opts)
    rows = [(r["user_id"], r["item_id"], r["action"], r["surface"], r["seq"]) for r in ds.events.to_pylist()]
    assert rows == [(1, 10, "click", "search", 0), (1, 11, "buy", "home", 1), (1, 12, "click", "home", 2),
                    (2, 10, "click", "home", 0), (2, 12, "skip", "home", 1)]
    assert ds.info.actions == ["click", "buy", "skip"] and ds.info.positive_actions == ["click", "buy"]
    assert ds.info.surfaces == ["home", "search"]
    assert ds.items.column("item_id").to_pylist() == [10, 11, 12]
    assert ds.feedviews.column("labels").to_pylist() == [[1], [2, 1], [1, 4]]


def test_csv_events_and_items_file(tmp_path: Path) -> None:
    (tmp_path / "events.csv").write_text("uid,iid,ts\n1,10,4\n1,11,2\n2,11,1\n")
    (tmp_path / "items.csv").write_text('iid,title,color\n10,"Red, shoe",red\n11,Hat,blue\n12,Unused,green\n')
    opts = IngestOptions(columns=ColumnMapping(user="uid", item="iid", timestamp="ts", action=None))
    ds = prepare_dataset("generic", tmp_path / "events.csv", options=opts)
    assert ds.info.actions == ["interact"] and ds.info.surfaces == ["default"]
    assert ds.events.column("item_id").to_pylist() == [11, 10, 11]
    items = ds.items.to_pylist()
    assert [i["title"] for i in items] == ["Red, shoe", "Hat", "Unused"]
    assert json.loads(items[0]["attributes"]) == {"color": "red"}
    assert items[0]["text"] == "Red, shoe. color: red"


def test_string_ids_refused_with_no_map_ids_in_cli_words(tmp_path: Path) -> None:
    """map_ids=False (--no-map-ids) refuses a string id naming file, line and field, in the CLI's words (it had
    said `map_ids=True`, a keyword argument, to a person at the command line); by default they are mapped."""
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n1,10,4\nbob,11,2\n")
    no_map = IngestOptions(map_ids=False, columns=ColumnMapping(action=None))
    with pytest.raises(DataError) as ei:
        prepare_dataset("generic", tmp_path / "events.csv", options=no_map)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(tmp_path / "events.csv"), 3, "user_id") and "--no-map-ids" in str(e)
    assert "map_ids=" not in str(e)
    t = pa.table({"user_id": ["a", "b"], "item_id": [1, 2], "timestamp": [1, 2]})
    pq.write_table(t, tmp_path / "e.parquet")
    with pytest.raises(DataError) as ei:
        prepare_dataset("generic", tmp_path / "e.parquet", options=no_map)
    assert (ei.value.line, ei.value.field) == (1, "user_id") and "--no-map-ids" in str(ei.value)
    assert "map_ids=" not in str(ei.value)
    ds = prepare_dataset("generic", tmp_path / "events.csv", options=IngestOptions(columns=ColumnMapping(action=None)))
    assert ds.info.extra["map_ids"] is True and ds.info.extra["user_ids"] == ["1", "bob"]
    assert any("'bob' (line 3) is not an integer" in n for n in ds.info.extra["notes"])


def test_map_ids_keeps_originals(tmp_path: Path) -> None:
    t = pa.table({"user_id": ["zed", "amy", "zed"], "item_id": ["B07", "A01", "A01"], "timestamp": [3, 1, 2]})
    pq.write_table(t, tmp_path / "events.parquet")
    pq.write_table(pa.table({"item_id": ["A01", "B07", "C99"], "title": ["a", "b", "c"]}), tmp_path / "items.parquet")
    ds = prepare_dataset("generic", tmp_path, options=IngestOptions(map_ids=True, columns=ColumnMapping(action=None)))
    assert ds.info.extra["user_ids"] == ["zed", "amy"]
    assert ds.events.column("user_id").to_pylist() == [0, 0, 1]
    assert ds.events.column("item_id").to_pylist() == [1, 0, 1]  # zed: A01@2, B07@3 ; B07 first seen -> 0
    orig = {r["item_id"]: json.loads(r["attributes"])["original_id"] for r in ds.items.to_pylist()}
    assert orig == {0: "B07", 1: "A01", 2: "C99"}


def test_generic_event_item_not_in_items(tmp_path: Path) -> None:
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n1,10,4\n1,99,2\n")
    (tmp_path / "items.csv").write_text("item_id,title\n10,A\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("generic", tmp_path, options=IngestOptions(columns=ColumnMapping(action=None)))
    assert (ei.value.path, ei.value.line, ei.value.field) == (str(tmp_path / "events.csv"), 3, "item_id")


def test_generic_duplicate_items_and_missing_column(tmp_path: Path) -> None:
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n1,10,4\n")
    (tmp_path / "items.csv").write_text("item_id,title\n10,A\n11,B\n10,C\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("generic", tmp_path, options=IngestOptions(columns=ColumnMapping(action=None)))
    assert (ei.value.line, ei.value.field) == (4, "item_id") and "first defined on line 2" in str(ei.value)
    with pytest.raises(DataError) as ei:
        prepare_dataset("generic", tmp_path)  # default mapping expects an 'action' column
    assert (ei.value.line, ei.value.field) == (1, "action")


def test_generic_no_timestamp_and_unknown_action(tmp_path: Path) -> None:
    (tmp_path / "events.csv").write_text("user_id,item_id,action\n1,10,a\n1,11,b\n1,12,zzz\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("generic", tmp_path,
                        options=IngestOptions(columns=ColumnMapping(timestamp=None), actions=("a", "b")))
    assert (ei.value.line, ei.value.field) == (4, "action")
    ds = prepare_dataset("generic", tmp_path, options=IngestOptions(columns=ColumnMapping(timestamp=None)))
    assert ds.info.has_timestamps is False and ds.info.actions == ["a", "b", "zzz"]
    assert ds.events.column("timestamp").to_pylist() == [0, 1, 2]
    with pytest.raises(MissingDataError):
        prepare_dataset("generic", tmp_path / "nothing_here")


def test_generic_items_csv_bad_row(tmp_path: Path) -> None:
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n1,10,4\n")
    (tmp_path / "items.csv").write_text("item_id,title\n10,A\n11,B,extra\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("generic", tmp_path, options=IngestOptions(columns=ColumnMapping(action=None)))
    assert (ei.value.path, ei.value.line) == (str(tmp_path / "items.csv"), 3)


def test_remapped_ids_resolve_to_the_source_files_user_and_items(tmp_path: Path) -> None:
    """With map_ids the tables number users and items 0..n-1; `genrec recommend --user` takes the source
    file's user id (it had taken the table's, showing another user's history) and shows source item ids."""
    from genrec.errors import DataError as _DE
    from genrec.infer.cases import SourceIds, user_history
    from genrec.recipes.pipeline import prepare

    src = tmp_path / "src"
    src.mkdir()
    t = pa.table({"user_id": ["zed", "amy", "zed", "amy", "amy"], "item_id": ["B07", "A01", "A01", "C99", "B07"],
                  "timestamp": [3, 1, 2, 5, 6]})
    pq.write_table(t, src / "events.parquet")
    wd = tmp_path / "wd"
    prepare(wd, "generic", source=src, options=IngestOptions(map_ids=True, columns=ColumnMapping(action=None)))
    ids = SourceIds.of(wd)
    assert ids is not None and ids.users == {"zed": 0, "amy": 1}
    amy = user_history(wd, ids.user("amy"))
    assert [ids.item_original[h["item_id"]] for h in amy] == ["A01", "C99", "B07"]  # amy's own, in time order
    assert {ids.items[o]: o for o in ("A01", "B07", "C99")} == ids.item_original
    with pytest.raises(_DE, match="not in the source data"):
        ids.user("1")  # a table id is not a source id
    plain = tmp_path / "plain"
    (src / "p.csv").write_text("user_id,item_id,timestamp\n1,10,4\n")
    prepare(plain, "generic", source=src / "p.csv", options=IngestOptions(columns=ColumnMapping(action=None)))
    assert SourceIds.of(plain) is None


def test_bad_inputs_that_had_raised_tracebacks_are_one_line_errors(tmp_path: Path) -> None:
    """Each of these had reached the user as a Python traceback (audit); now `genrec` prints one line
    naming the file / row / field / option and exits 2."""
    import gzip

    from typer.testing import CliRunner

    from genrec.cli import app

    good = "user_id,item_id,timestamp,action\n1,10,100,click\n1,11,101,click\n2,10,102,click\n"
    (tmp_path / "big.csv").write_text(good + "99999999999999999999,11,103,click\n")
    (tmp_path / "e.csv.gz").write_bytes(gzip.compress(good.encode()))
    (tmp_path / "good.csv").write_text(good)
    pq.write_table(pa.table({"user_id": [1, 2], "item_id": [10, 11], "timestamp": [1, 2],
                             "action": [["a"], ["b"]]}), tmp_path / "list.parquet")
    (tmp_path / "afile").write_text("x")
    cases = [
        (["generic", str(tmp_path / "w1"), "--source", str(tmp_path / "big.csv")],
         "big.csv:5: field 'user_id': integer out of the int64 range"),
        (["generic", str(tmp_path / "w2"), "--source", str(tmp_path / "e.csv.gz")], "decompress it first"),
        (["generic", str(tmp_path / "w3"), "--source", str(tmp_path / "list.parquet")],
         "field 'action': expected a column of scalar values, found type list"),
        (["generic", str(tmp_path / "w4"), "--source", str(tmp_path / "good.csv"), "--buckets", "0"],
         "must be a positive integer, got 0"),
        (["generic", str(tmp_path / "afile" / "w"), "--source", str(tmp_path / "good.csv")], "cannot create it"),
    ]
    for args, want in cases:
        r = CliRunner().invoke(app, ["data", "prepare", *args])
        assert r.exit_code == 2 and want in r.output and "Traceback" not in r.output, (args, r.output)
    with pytest.raises(ConfigError, match="--dislike-max .* must be below --like-min"):
        from genrec.data.ingest.common import RatingRule

        RatingRule(like_min=2, dislike_max=3)
    r = CliRunner().invoke(app, ["sid", "assign", str(tmp_path), "--vectors", str(tmp_path / "good.csv")])
    assert r.exit_code == 2 and "expected a .parquet or .npy file" in r.output, r.output
    (tmp_path / "w5").mkdir()
    r = CliRunner().invoke(app, ["serve", str(tmp_path / "w5")])
    assert r.exit_code == 2 and "run `genrec train" in r.output, r.output
    r = CliRunner().invoke(app, ["serve", str(tmp_path / "w5"), "--checkpoint", str(tmp_path / "nosuch")])
    assert r.exit_code == 2 and "nor a path to a checkpoint folder" in r.output, r.output


def test_tsv_delimiter_and_header_checks(tmp_path: Path) -> None:
    """A .tsv file is read with tabs by default; a header that does not split hints at the delimiter; a
    column read twice in the header is refused (it had quietly used the first)."""
    (tmp_path / "e.tsv").write_text("user_id\titem_id\ttimestamp\n1\t10\t4\n2\t10\t5\n")
    ds = prepare_dataset("generic", tmp_path / "e.tsv", options=IngestOptions(columns=ColumnMapping(action=None)))
    assert ds.events.num_rows == 2
    (tmp_path / "e.txt").write_text("user_id\titem_id\ttimestamp\n1\t10\t4\n")
    with pytest.raises(DataError, match="is the delimiter '\\\\t'"):
        prepare_dataset("generic", tmp_path / "e.txt", options=IngestOptions(columns=ColumnMapping(action=None)))
    ds = prepare_dataset("generic", tmp_path / "e.txt",
                         options=IngestOptions(delimiter="\t", columns=ColumnMapping(action=None)))
    assert ds.events.num_rows == 1
    (tmp_path / "d.csv").write_text("user_id,item_id,user_id,timestamp,note,note\n1,10,2,4,a,b\n")
    with pytest.raises(DataError, match="'user_id' appears 2 times") as e:
        prepare_dataset("generic", tmp_path / "d.csv", options=IngestOptions(columns=ColumnMapping(action=None)))
    assert (e.value.line, e.value.field) == (1, "user_id")


@pytest.mark.parametrize("rows, map_ids, line, field, why", [
    ("1,10,4,click\n1,11,5,\n", False, 3, "action", "empty value"),
    ("1,10,4,click\n1,11,5,click \n", False, 3, "action", "whitespace"),
    ("a,10,4,click\n,11,5,click\n", True, 3, "user_id", "empty value"),
])
def test_names_and_remapped_ids_must_be_non_empty_and_trimmed(tmp_path: Path, rows: str, map_ids: bool, line: int,
                                                              field: str, why: str) -> None:
    """An empty or untrimmed action had become an action of its own (positive by default), an empty
    remapped user id a user of its own: now a DataError naming the line and field."""
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp,action\n" + rows)
    with pytest.raises(DataError, match=why) as e:
        prepare_dataset("generic", tmp_path / "e.csv", options=IngestOptions(map_ids=map_ids))
    assert (e.value.line, e.value.field) == (line, field)


def test_parquet_value_errors_read_plainly(tmp_path: Path) -> None:
    """No numpy reprs in messages; a NaN id is an empty value; a uint64 id above int64 is out of range (it had
    wrapped to a negative number)."""
    pq.write_table(pa.table({"user_id": [1, 2], "item_id": [1.0, float("nan")], "timestamp": [1, 2]}),
                   tmp_path / "nan.parquet")
    pq.write_table(pa.table({"user_id": pa.array([1, 2 ** 63 + 5], pa.uint64()), "item_id": [1, 2],
                             "timestamp": [1, 2]}), tmp_path / "big.parquet")
    pq.write_table(pa.table({"user_id": [-1, 2], "item_id": [1, 2], "timestamp": [1, 2]}), tmp_path / "neg.parquet")
    opts = IngestOptions(columns=ColumnMapping(action=None))
    for name, line, field, want in [("nan", 2, "item_id", "empty value (NaN)"),
                                    ("big", 2, "user_id", f"out of the int64 range: {2 ** 63 + 5}"),
                                    ("neg", 1, "user_id", "invalid value -1:")]:
        with pytest.raises(DataError) as e:
            prepare_dataset("generic", tmp_path / f"{name}.parquet", options=opts)
        assert (e.value.line, e.value.field) == (line, field) and want in str(e.value), str(e.value)
        assert "np." not in str(e.value)


def test_a_string_field_that_is_not_utf8_is_located(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_bytes(b"user_id,item_id,timestamp,action\n1,10,100,click\n1,11,101,cl\xe9ck\n")
    with pytest.raises(DataError, match="not valid UTF-8 text") as e:
        prepare_dataset("generic", tmp_path / "e.csv")
    assert (e.value.line, e.value.field) == (3, "action")
