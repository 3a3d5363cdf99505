"""`genrec data export-p5`: MovieLens as P5 sequences, checked against the raw files and round-tripped
through genrec's P5 ingest (amazon-p5) and its leave-one-out split. On the real files (GENREC_DATA_DIR) and,
without them, on their synthetic stand-ins (tests/synthetic_datasets.py): the real files' own figures (counts,
titles) are checked only on them."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.cli import app
from genrec.data.ingest import prepare_dataset
from genrec.data.p5 import export_p5
from genrec.data.splits import SplitSpec, compute_cutoffs, eval_cases
from genrec.errors import ConfigError
from tests.synthetic_datasets import is_synthetic, stats

REAL = {"movielens-100k": {"users": 943, "items": 1682, "ratings": 100_000},
        "movielens-latest-small": {"users": 610, "movies": 9_742, "rated_movies": 9_724, "ratings": 100_836}}


def _expect(folder: Path) -> dict:  # type: ignore[type-arg]
    """What the dataset in ``folder`` holds: the real files' published counts, or what the stand-in's writer wrote."""
    return stats(folder) if is_synthetic(folder) else REAL[folder.name]


def _lines(folder: Path) -> list[list[int]]:
    return [[int(t) for t in s.split()] for s in (folder / "sequential_data.txt").read_text().splitlines()]


def _datamaps(folder: Path) -> dict[str, dict[str, str]]:
    return json.loads(gzip.decompress((folder / "datamaps.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def ml100k_p5(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("p5") / "ml100k"
    r = CliRunner().invoke(app, ["data", "export-p5", "movielens-100k", str(out), "--data-dir", str(data_root)])
    assert r.exit_code == 0, r.output
    ratings = _expect(data_root / "movielens-100k")["ratings"]
    assert json.loads(r.output[r.output.index("{"):])["interactions"] == ratings
    return out


@pytest.fixture(scope="module")
def ml100k_round_trip(ml100k_p5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`genrec data prepare amazon-p5 WORKDIR --source <export>`: the tables genrec trains on."""
    wd = tmp_path_factory.mktemp("run") / "ml100k-p5"
    r = CliRunner().invoke(app, ["data", "prepare", "amazon-p5", str(wd), "--source", str(ml100k_p5),
                                 "--buckets", "2"])
    assert r.exit_code == 0, r.output
    return wd


def test_ml100k_export_matches_u_data(ml100k_p5: Path, data_root: Path) -> None:
    expect = _expect(data_root / "movielens-100k")
    lines = _lines(ml100k_p5)
    assert len(lines) == expect["users"]
    assert sum(len(s) - 1 for s in lines) == expect["ratings"]
    assert [s[0] for s in lines] == list(range(1, expect["users"] + 1))
    assert sorted({i for s in lines for i in s[1:]}) == list(range(1, expect["items"] + 1))
    dm = _datamaps(ml100k_p5)
    # every user against u.data read here directly: by timestamp, ties by line order in u.data
    raw: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    u_data = data_root / "movielens-100k" / "u.data"
    for n, line in enumerate(u_data.read_text().splitlines()):
        u, i, _rating, ts = (int(x) for x in line.split("\t"))
        raw[u].append((ts, n, i))
    by_p5_user = {s[0]: s[1:] for s in lines}
    differs_by_item_rule = 0
    for u, evs in raw.items():
        want = [int(dm["item2id"][str(i)]) for _, _, i in sorted(evs)]
        assert by_p5_user[int(dm["user2id"][str(u)])] == want, f"user {u}"
        by_item = [int(dm["item2id"][str(i)]) for _, i, _ in sorted((ts, i, n) for ts, n, i in evs)]
        differs_by_item_rule += by_item[-2:] != want[-2:]
    # the tie rule matters on ML-100K (u.data is shuffled): an item-id tie-break would move targets
    assert differs_by_item_rule > 100
    for u in (1, 196, expect["users"]):  # spelled out for a few users
        assert dm["user2id"][str(u)] == str(u)  # ML-100K ids are already dense 1..943 / 1..1682
        assert by_p5_user[u] == [i for _, _, i in sorted(raw[u])]
    readme = (ml100k_p5 / "README.txt").read_text()
    assert f"{expect['users']} users, {expect['items']} items, {expect['ratings']} interactions" in readme
    assert "ties by the event's position in the source file" in readme and "u.data" in readme


def test_round_trip_loo_targets_are_last_two(ml100k_p5: Path, ml100k_round_trip: Path, data_root: Path) -> None:
    from genrec.catalog import open_store

    lines = _lines(ml100k_p5)
    store = open_store(ml100k_round_trip)
    events = store.read_events()
    assert events.num_rows == _expect(data_root / "movielens-100k")["ratings"]
    cut = compute_cutoffs(events, SplitSpec(kind="loo"))
    for role, k in (("valid", -2), ("test", -1)):
        cases = eval_cases(events, cut, role)  # type: ignore[arg-type]
        assert cases.user_id.tolist() == [s[0] for s in lines]
        assert cases.target_item.tolist() == [s[k] for s in lines]
        assert cases.n_history.tolist() == [len(s) - 1 + k for s in lines]
    # ... and they are the targets of genrec's direct ingest of ML-100K (ids mapped back)
    dm = _datamaps(ml100k_p5)
    direct = prepare_dataset("movielens-100k", data_dir=data_root).events
    dcut = compute_cutoffs(direct, SplitSpec(kind="loo"))
    for role, k in (("valid", -2), ("test", -1)):
        d = eval_cases(direct, dcut, role)  # type: ignore[arg-type]
        got = {int(dm["user2id"][str(u)]): int(dm["item2id"][str(i)]) for u, i in zip(d.user_id, d.target_item)}
        assert got == {s[0]: s[k] for s in lines}


def test_round_trip_titles_and_text(ml100k_round_trip: Path, data_root: Path) -> None:
    from genrec.catalog import open_store

    folder = data_root / "movielens-100k"
    n_items = _expect(folder)["items"]
    items = {r["item_id"]: r for r in open_store(ml100k_round_trip).read_items().to_pylist()}
    assert len(items) == n_items
    u_item = (folder / "u.item").read_bytes().decode("latin-1")
    raw = {int(f[0]): f for f in (s.split("|") for s in u_item.splitlines())}
    for i in (1, 50, n_items):
        assert items[i]["title"] == raw[i][1]
    accented = next(i for i, f in raw.items() if "\u00e9" in f[1])  # Latin-1 title, via UTF-8 JSON and back
    assert items[accented]["title"] == raw[accented][1]
    attrs = json.loads(items[1]["attributes"])
    genres = [g.rpartition("|")[0] for g in (folder / "u.genre").read_text().split()]
    assert attrs["asin"] == "1" and attrs["categories"] == [[g] for g, v in zip(genres, raw[1][5:]) if v == "1"]
    if not is_synthetic(folder):
        assert items[1]["title"] == "Toy Story (1995)"
        assert attrs["categories"] == [["Animation"], ["Children's"], ["Comedy"]]
    # every title and item text equals genrec's direct ingest (content features see the same text)
    direct = {r["item_id"]: r for r in prepare_dataset("movielens-100k", data_dir=data_root).items.to_pylist()}
    assert all(items[i]["title"] == direct[i]["title"] and items[i]["text"] == direct[i]["text"] for i in items)


def test_ml_latest_small_counts(data_root: Path, tmp_path: Path) -> None:
    want = _expect(data_root / "movielens-latest-small")  # real: 610 users, 9,724 of 9,742 movies rated
    r = export_p5("movielens-latest-small", tmp_path / "p5", data_dir=data_root)
    assert (r.users, r.items, r.interactions, r.dropped_users) == (want["users"], want["rated_movies"],
                                                                   want["ratings"], 0)
    lines = _lines(tmp_path / "p5")
    dense = list(range(1, want["rated_movies"] + 1))
    assert sorted({i for s in lines for i in s[1:]}) == dense  # dense: the unrated movies left out
    dm = _datamaps(tmp_path / "p5")
    src = sorted(int(k) for k in dm["item2id"])
    assert [dm["item2id"][str(k)] for k in src] == [str(n) for n in dense]  # ascending source id


RATINGS_DAT = "\n".join([
    "7::30::5::100",
    "7::10::1::50",
    "3::30::3.5::10",
    "7::20::4::100",   # same timestamp as line 1: file order (30 before 20), not item id
    "3::10::2.5::10",
    "9::20::4::5",     # user 9 has 2 events: left out with --min-events 3
    "9::10::4::6",
    "3::99::4::11",
]) + "\n"
MOVIES_DAT = "10::Ten (1990)::Drama\n20::Twenty (1991)::Comedy|Drama\n30::Thirty::(no genres listed)\n99::N (2000)::War\n"


def test_synthetic_rules_and_errors(tmp_path: Path) -> None:
    src = tmp_path / "ml10m"
    src.mkdir()
    (src / "ratings.dat").write_text(RATINGS_DAT)
    (src / "movies.dat").write_text(MOVIES_DAT)
    out = tmp_path / "p5"
    r = export_p5("movielens-10m", out, source=src)
    assert (r.users, r.items, r.interactions, r.dropped_users, r.dropped_interactions) == (2, 4, 6, 1, 2)
    # users 3, 7 -> 1, 2; items 10, 20, 30, 99 -> 1, 2, 3, 4
    assert (out / "sequential_data.txt").read_text() == "1 3 1 4\n2 1 3 2\n"
    rows = [json.loads(s) for s in gzip.decompress((out / "item_text.jsonl.gz").read_bytes()).decode().splitlines()]
    assert [(x["item_id"], x["source_item_id"], x["title"]) for x in rows] == [
        (1, 10, "Ten (1990)"), (2, 20, "Twenty (1991)"), (3, 30, "Thirty"), (4, 99, "N (2000)")]
    assert rows[1]["categories"] == [["Comedy"], ["Drama"]]
    back = prepare_dataset("amazon-p5", out)
    assert back.items.column("text").to_pylist()[1] == "Twenty. Genres: Comedy, Drama. Year: 1991"
    with pytest.raises(ConfigError, match="already holds a P5 export"):
        export_p5("movielens-10m", out, source=src)
    r1 = export_p5("movielens-10m", out, source=src, min_events=1, overwrite=True)
    assert (r1.users, r1.interactions) == (3, 8)
    with pytest.raises(ConfigError, match="neither a dataset name"):
        export_p5("no-such-dataset", tmp_path / "x")


def test_p5_ingest_rejects_a_bad_text_field(tmp_path: Path) -> None:
    from genrec.errors import DataError

    (tmp_path / "sequential_data.txt").write_text("1 1 2 3\n")
    (tmp_path / "item_text.jsonl.gz").write_bytes(gzip.compress(b'{"item_id": 1, "title": "A", "text": 5}\n'))
    with pytest.raises(DataError, match="item_text.jsonl.gz:1: field 'text'"):
        prepare_dataset("amazon-p5", tmp_path)


def test_export_from_a_prepared_run_is_a_fixed_point(ml100k_p5: Path, ml100k_round_trip: Path, tmp_path: Path,
                                                     data_root: Path) -> None:
    """A run directory as SOURCE (for generic data): exporting the round-tripped tables gives the same files."""
    r = export_p5(ml100k_round_trip, tmp_path / "again")
    want = _expect(data_root / "movielens-100k")
    assert (r.users, r.items, r.interactions) == (want["users"], want["items"], want["ratings"])
    assert (tmp_path / "again" / "sequential_data.txt").read_bytes() == (ml100k_p5 / "sequential_data.txt").read_bytes()
    texts = [[json.loads(s)["text"] for s in gzip.decompress((d / "item_text.jsonl.gz").read_bytes()).splitlines()]
             for d in (ml100k_p5, tmp_path / "again")]
    assert texts[0] == texts[1]
