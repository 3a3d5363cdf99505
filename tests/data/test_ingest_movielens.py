"""MovieLens parsing: the .dat path on synthetic files, the rating rule, seq ordering, titles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.data.ingest import IngestOptions, RatingRule, prepare_dataset
from genrec.data.ingest.build import order_events, seq_within_user
from genrec.data.ingest.movielens import item_text, split_title

MOVIES_DAT = "1::Toy Story (1995)::Animation|Children's|Comedy\n2::Caf\u00e9 au lait (1993)::Comedy\n3::No Year::(no genres listed)\n"


def _write_ml10m(folder: Path, ratings: str, movies: str = MOVIES_DAT, enc: str = "latin-1", crlf: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    nl = "\r\n" if crlf else "\n"
    (folder / "ratings.dat").write_text(ratings.replace("\n", nl), encoding="ascii", newline="")
    (folder / "movies.dat").write_bytes(movies.replace("\n", nl).encode(enc))


RATINGS = "\n".join([
    "7::2::5::100",
    "7::1::1::50",
    "3::3::3.5::10",
    "7::3::4::100",   # same timestamp as the first line: file order decides
    "3::1::2.5::10",
]) + "\n"


@pytest.mark.parametrize("enc,crlf", [("latin-1", False), ("utf-8", True)])
def test_dat_path_synthetic(tmp_path: Path, enc: str, crlf: bool) -> None:
    _write_ml10m(tmp_path, RATINGS, enc=enc, crlf=crlf)
    ds = prepare_dataset("movielens-10m", tmp_path)
    rows = ds.events.to_pylist()
    got = [(r["user_id"], r["item_id"], r["action"], r["timestamp"], r["seq"]) for r in rows]
    assert got == [
        (3, 3, "view", 10, 0),
        (3, 1, "view", 10, 1),
        (7, 1, "dislike", 50, 0),
        (7, 2, "like", 100, 1),
        (7, 3, "like", 100, 2),
    ]
    items = ds.items.to_pylist()
    assert [i["title"] for i in items] == ["Toy Story (1995)", "Caf\u00e9 au lait (1993)", "No Year"]
    assert items[2]["text"] == "No Year"
    assert items[1]["text"] == "Caf\u00e9 au lait. Genres: Comedy. Year: 1993"
    enc_used = {Path(f["path"]).name: f.get("encoding") for f in ds.source["files"]}["movies.dat"]
    assert enc_used == enc
    fv = ds.feedviews.to_pylist()
    assert [f["item_ids"] for f in fv] == [[3, 1], [1, 2, 3]]
    assert fv[1]["labels"] == [1 << 2, 1 << 1, 1 << 1]  # dislike bit only; like bits
    assert fv[1]["request_ts"] == 50 and fv[1]["request_seq"] == 0


def test_rating_rule_configurable(tmp_path: Path) -> None:
    _write_ml10m(tmp_path, RATINGS)
    ds = prepare_dataset("movielens-10m", tmp_path,
                         options=IngestOptions(rating_rule=RatingRule(like_min=5.0, dislike_max=1.0)))
    assert ds.events.column("action").to_pylist() == ["view", "view", "dislike", "like", "view"]
    assert "rating >= 5" in ds.info.action_rule


def test_rating_rule_values() -> None:
    r = np.array([0.5, 1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0])
    assert RatingRule().apply(r).tolist() == [2, 2, 2, 0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="--dislike-max"):
        RatingRule(like_min=3.0, dislike_max=3.0)


@given(st.lists(st.floats(0, 5, allow_nan=False), max_size=40), st.floats(2.5, 5), st.floats(0, 2.4))
@settings(max_examples=60, deadline=None)
def test_rating_rule_matches_slow_twin(ratings: list[float], like_min: float, dislike_max: float) -> None:
    rule = RatingRule(like_min=like_min, dislike_max=dislike_max)
    want = [1 if x >= like_min else 2 if x <= dislike_max else 0 for x in ratings]
    assert rule.apply(np.asarray(ratings, dtype=np.float64)).tolist() == want


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5)), max_size=60))
@settings(max_examples=80, deadline=None)
def test_order_and_seq_match_slow_twin(rows: list[tuple[int, int]]) -> None:
    user = np.array([r[0] for r in rows], dtype=np.int64)
    ts = np.array([r[1] for r in rows], dtype=np.int64)
    order = order_events(user, ts)
    want = sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1], i))
    assert order.tolist() == want
    seq = seq_within_user(user[order])
    counter: dict[int, int] = {}
    want_seq = []
    for i in want:
        want_seq.append(counter.get(rows[i][0], 0))
        counter[rows[i][0]] = want_seq[-1] + 1
    assert seq.tolist() == want_seq


def test_seq_deterministic_across_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = [f"{u}::{i}::{r}::{t}" for u, i, r, t in zip(rng.integers(1, 6, 300), rng.integers(1, 4, 300),
                                                        rng.integers(1, 6, 300), rng.integers(0, 5, 300))]
    _write_ml10m(tmp_path, "\n".join(lines) + "\n")
    a = prepare_dataset("movielens-10m", tmp_path, options=IngestOptions(checksum=False))
    b = prepare_dataset("movielens-10m", tmp_path, options=IngestOptions(checksum=False))
    assert a.events.equals(b.events) and a.feedviews.equals(b.feedviews)


@pytest.mark.parametrize("title,base,year", [
    ("Toy Story (1995)", "Toy Story", 1995),
    ("Seven (Se7en) (1995)", "Seven (Se7en)", 1995),
    ("Babylon 5", "Babylon 5", None),
    ("Cosmos (1980\u20131981)", "Cosmos", 1980),
    ("Stranger Things (2016- )", "Stranger Things", 2016),
    ("unknown", "unknown", None),
])
def test_split_title(title: str, base: str, year: int | None) -> None:
    assert split_title(title) == (base, year)


def test_item_text_format() -> None:
    assert item_text("Heat (1995)", ["Action", "Crime"], 1995) == "Heat. Genres: Action, Crime. Year: 1995"
    assert item_text("X", [], None) == "X"


def test_csv_layout_synthetic(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,10,4.5,5\n1,11,0.5,3\n")
    (tmp_path / "movies.csv").write_text('movieId,title,genres\n10,"Heat, The (1995)",Action|Crime\n11,Up (2009),Animation\n')
    ds = prepare_dataset("movielens-20m", tmp_path)
    assert ds.events.column("item_id").to_pylist() == [11, 10]
    assert ds.events.column("action").to_pylist() == ["dislike", "like"]
    assert ds.items.column("title").to_pylist() == ["Heat, The (1995)", "Up (2009)"]
