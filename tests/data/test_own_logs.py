"""Issue 42, "bring your own logs": a log exported the usual way (string ids, ISO 8601 times, actions) goes
through `genrec data prepare generic` with no flags, and `genrec recommend --user u196` answers in the log's
own ids; the flags say what they do (--map-ids / --no-map-ids, --time-format, --surface-col, --items) and
every refusal speaks in them."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from genrec.cli import app
from tests.synthetic_datasets import is_synthetic

ACTIONS = {1: "dislike", 2: "dislike", 3: "view", 4: "like", 5: "like"}


def movielens_slice(data_root: Path, out: Path, rows: int) -> list[tuple[str, str, int]]:
    """The first ``rows`` ratings of MovieLens 100K (or its synthetic stand-in) as a log exports them:
    `u196,m242,<ISO time>,like`, the times alternately with a zone ('...Z') and without one ('YYYY-MM-DD HH:MM:SS').
    Returns (user, item, ts)."""
    src = data_root / "movielens-100k" / "u.data"
    if not is_synthetic(src.parent):  # the real file's first line, which the messages below quote
        assert src.read_text().split("\n", 1)[0] == "196\t242\t3\t881250949"
    lines, got = ["user_id,item_id,timestamp,action"], []
    for i, rec in enumerate(src.read_text().splitlines()[:rows]):
        u, it, rating, ts = rec.split("\t")
        t = datetime.fromtimestamp(int(ts), timezone.utc)
        when = t.strftime("%Y-%m-%dT%H:%M:%SZ") if i % 2 else t.strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"u{u},m{it},{when},{ACTIONS[int(rating)]}")
        got.append((f"u{u}", f"m{it}", int(ts)))
    out.write_text("\n".join(lines) + "\n")
    return got


def _prepare(*args: str) -> "object":
    return CliRunner().invoke(app, ["data", "prepare", "generic", *args])


def test_the_issue_42_csv_ingests_with_no_flags(tmp_path: Path, data_root: Path) -> None:
    """It had stopped at line 2 (`not an integer ... (string ids need map_ids=True)`), then, with --map-ids, at
    the ISO timestamp. Now: ids mapped and times parsed, each with a note; the rule is in the manifest."""
    from genrec.catalog import open_store
    from genrec.infer.cases import SourceIds

    want = movielens_slice(data_root, tmp_path / "ev.csv", 300)
    user, when = want[0][0], datetime.fromtimestamp(want[0][2], timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    r = _prepare(str(tmp_path / "wd"), "--source", str(tmp_path / "ev.csv"))
    assert r.exit_code == 0, r.output
    assert f"note: ids mapped: user_id '{user}' (line 2) is not an integer" in r.stderr  # real data: 'u196'
    assert f"have no zone (the first: '{when}', line 2): read as UTC" in r.stderr  # '1997-12-04 15:55:49'
    m = json.loads((tmp_path / "wd" / "tables" / "manifest.json").read_text())
    assert "ISO 8601" in m["info"]["time_rule"] and "without a zone are UTC" in m["info"]["time_rule"]
    assert m["info"]["extra"]["map_ids"] is True and "auto" in m["info"]["extra"]["id_rule"]
    ids = SourceIds.of(tmp_path / "wd")
    assert ids is not None
    users = {v: k for k, v in ids.users.items()}
    ev = open_store(tmp_path / "wd").read_events()
    got = sorted((users[u], ids.item_original[i], t) for u, i, t in zip(ev.column("user_id").to_pylist(),
                                                                       ev.column("item_id").to_pylist(),
                                                                       ev.column("timestamp").to_pylist()))
    assert got == sorted(want)  # every event, with its source ids and its epoch second

    # --no-map-ids keeps the old refusal, in the command's words, naming file, line and field
    r = _prepare(str(tmp_path / "wd2"), "--source", str(tmp_path / "ev.csv"), "--no-map-ids")
    assert r.exit_code == 2 and f"{tmp_path / 'ev.csv'}:2: field 'user_id': not an integer: '{user}'" in r.output
    assert "--no-map-ids" in r.output and "map_ids=" not in r.output, r.output
    r = _prepare(str(tmp_path / "wd2"), "--source", str(tmp_path / "ev.csv"), "--time-format", "epoch-s")
    assert r.exit_code == 2 and f"ev.csv:2: field 'timestamp': not a timestamp: '{when}'" in r.output
    assert "(--time-format epoch-s)" in r.output, r.output
    r = _prepare(str(tmp_path / "wd2"), "--source", str(tmp_path / "ev.csv"), "--time-format", "dd/mm")
    assert r.exit_code == 2 and "--time-format: 'dd/mm' is neither" in r.output, r.output
    r = CliRunner().invoke(app, ["data", "prepare", "generic", str(tmp_path / "wd2")])
    assert r.exit_code == 2 and "give --source" in r.output and "source=" not in r.output, r.output


def test_map_ids_forces_mapping_surface_col_and_items_flag(tmp_path: Path) -> None:
    """--map-ids maps integer ids too; --surface-col reads a surface column; --items names the items file,
    whose columns other than id/title become attributes and, after the title, the text content vectors read."""
    from genrec.catalog import open_store
    from genrec.infer.cases import SourceIds

    (tmp_path / "ev.csv").write_text("uid,iid,when,what,page\n7,100,1700000000000,click,home\n7,200,1700000001000,"
                                     "buy,search\n8,100,1700000002000,click,home\n")
    (tmp_path / "catalogue.csv").write_text("iid,title,genre\n100,Red shoe,footwear\n200,Blue hat,headwear\n")
    base = [str(tmp_path / "wd"), "--source", str(tmp_path / "ev.csv"), "--user-col", "uid", "--item-col", "iid",
            "--time-col", "when", "--action-col", "what", "--surface-col", "page", "--items",
            str(tmp_path / "catalogue.csv")]
    r = _prepare(*base)
    assert r.exit_code == 0, r.output
    assert "note:" not in r.stderr  # integer ids, epoch milliseconds: nothing assumed
    store = open_store(tmp_path / "wd")
    info = store.info()
    assert info.surfaces == ["home", "search"] and info.extra["map_ids"] is False
    assert "epoch milliseconds" in info.time_rule
    ev = store.read_events().to_pylist()
    assert [(e["user_id"], e["item_id"], e["surface"], e["timestamp"]) for e in ev] == [
        (7, 100, "home", 1700000000), (7, 200, "search", 1700000001), (8, 100, "home", 1700000002)]
    texts = dict(zip(store.read_items().column("item_id").to_pylist(), store.read_items().column("text").to_pylist()))
    assert texts == {100: "Red shoe. genre: footwear", 200: "Blue hat. genre: headwear"}
    r = _prepare(*base, "--map-ids")
    assert r.exit_code == 0, r.output
    ids = SourceIds.of(tmp_path / "wd")
    assert ids is not None and ids.users == {"7": 0, "8": 1} and ids.items == {"100": 0, "200": 1}
    (tmp_path / "catalogue.csv").write_text("iid,title\n100,Red shoe\nB07,Blue hat\n")
    r = _prepare(*base)
    assert r.exit_code == 2 and "catalogue.csv:3: field 'iid': not an integer: 'B07'" in r.output, r.output
    assert "--map-ids reads both as text" in r.output
    pq.write_table(pa.table({"uid": ["a", "b"], "iid": [1, 2], "when": pa.array([1, 2], pa.timestamp("s"))}),
                   tmp_path / "ev.parquet")
    r = _prepare(str(tmp_path / "wd3"), "--source", str(tmp_path / "ev.parquet"), "--user-col", "uid",
                 "--item-col", "iid", "--time-col", "when", "--action-col", "")
    assert r.exit_code == 0 and "ids mapped: uid 'a' (line 1)" in r.stderr, r.output


def test_string_ids_round_trip_through_recommend(tmp_path: Path, data_root: Path) -> None:
    """A log with string ids, prepared with no flags and trained (cpu-tiny, a few steps): `genrec recommend
    --user u196` takes the log's user id and answers with the log's item ids (`m242`), as does --history."""
    run = CliRunner().invoke
    src = movielens_slice(data_root, tmp_path / "ev.csv", 1500)
    items = {i for _u, i, _t in src}
    user, history = src[0][0], ",".join(i for _u, i, _t in src[:3])  # real data: u196, m242,m302,m377
    wd = str(tmp_path / "wd")
    for cmd in (["data", "prepare", "generic", wd, "--source", str(tmp_path / "ev.csv")],
                ["features", "build", wd, "--content-dim", "16", "--engagement-dim", "16"],
                ["sid", "build", wd, "--levels", "2", "--codebook-size", "8"],
                ["train", wd, "--preset", "cpu-tiny", "train.total_steps=2", "train.ckpt_every=0",
                 "data.valid_cases=8"]):
        r = run(app, cmd)
        assert r.exit_code == 0, (cmd, r.output)
    r = run(app, ["recommend", wd, "--user", user, "--k", "5", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    got = [d["original_item_id"] for d in out["items"]]
    assert len(got) == 5 and set(got) <= items, got  # the log's own ids
    r = run(app, ["recommend", wd, "--user", user, "--k", "5"])
    assert r.exit_code == 0 and got[0] in r.stdout, r.output
    r = run(app, ["recommend", wd, "--history", history, "--k", "3", "--json"])
    assert r.exit_code == 0 and {d["original_item_id"] for d in json.loads(r.stdout)["items"]} <= items
    r = run(app, ["recommend", wd, "--user", user[1:]])  # the table's number is not the log's id
    assert r.exit_code == 2 and "not in the source data" in r.output
