"""Exact counts on every shared dataset (skipped without them), the same checks against the counts of their
synthetic stand-ins (tests/synthetic_datasets.py: the real on-disk formats), and the ML-1M missing-ratings
message."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from genrec.data.ingest import IngestOptions, list_datasets, prepare_dataset
from genrec.data.schema import EVENTS_SCHEMA, FEEDVIEWS_SCHEMA, ITEMS_SCHEMA, Dataset
from genrec.errors import ConfigError, MissingDataError
from tests.synthetic_datasets import is_synthetic, stats


def _check_invariants(ds: Dataset) -> None:
    assert ds.events.schema.equals(EVENTS_SCHEMA)
    assert ds.items.schema.equals(ITEMS_SCHEMA)
    assert ds.feedviews.schema.equals(FEEDVIEWS_SCHEMA)
    u = ds.events.column("user_id").to_numpy()
    s = ds.events.column("seq").to_numpy()
    ts = ds.events.column("timestamp").to_numpy()
    # sorted by (user, seq), seq = 0..n-1 per user, timestamps non-decreasing within a user
    same = u[1:] == u[:-1]
    assert (u[1:] >= u[:-1]).all()
    assert (s[1:][same] == s[:-1][same] + 1).all()
    assert (s[1:][~same] == 0).all() and s[0] == 0
    assert (ts[1:][same] >= ts[:-1][same]).all()
    # every event's item is in the items table, item ids unique
    ids = ds.items.column("item_id").to_numpy()
    assert len(np.unique(ids)) == len(ids)
    assert np.isin(ds.events.column("item_id").to_numpy(), ids).all()
    # feedviews cover every event exactly once
    flat = pa.concat_arrays([c.flatten() for c in ds.feedviews.column("item_ids").chunks])
    assert len(flat) == ds.events.num_rows
    assert (flat.to_numpy() == ds.events.column("item_id").to_numpy()).all()
    assert set(ds.info.positive_actions) <= set(ds.info.actions)
    assert ds.info.feedview_rule.startswith("Synthesised")
    for a in ds.items.column("attributes").to_pylist()[:50]:
        assert isinstance(json.loads(a), dict)


def _counts(ds: Dataset) -> tuple[int, int, int]:
    return (ds.events.num_rows, len(np.unique(ds.events.column("user_id").to_numpy())), ds.items.num_rows)


def test_movielens_100k(datasets_root: Path) -> None:
    ds = prepare_dataset("movielens-100k", data_dir=datasets_root)
    assert _counts(ds) == (100_000, 943, 1_682)
    _check_invariants(ds)
    acts = ds.info.extra["counts"]["actions"]
    assert acts == {"view": 27_145, "like": 34_174 + 21_201, "dislike": 6_110 + 11_370}
    assert ds.info.actions == ["view", "like", "dislike"] and ds.info.positive_actions == ["view", "like"]
    row = ds.items.slice(0, 1).to_pylist()[0]
    assert row["item_id"] == 1 and row["title"] == "Toy Story (1995)"
    assert row["text"] == "Toy Story. Genres: Animation, Children's, Comedy. Year: 1995"
    # Latin-1 decoding: a title with a non-ASCII character survives
    titles = ds.items.column("title").to_pylist()
    assert any("\u00e9" in t for t in titles if t)
    files = {Path(f["path"]).name: f for f in ds.source["files"]}
    assert files["u.data"]["sha256"] == "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490"
    assert files["u.data"]["bytes"] == 1_979_173
    assert files["u.item"]["encoding"] == "latin-1"


def test_movielens_latest_small(datasets_root: Path) -> None:
    ds = prepare_dataset("movielens-latest-small", data_dir=datasets_root)
    assert _counts(ds) == (100_836, 610, 9_742)
    assert ds.info.extra["counts"]["interacted_items"] == 9_724
    _check_invariants(ds)
    files = {Path(f["path"]).name: f for f in ds.source["files"]}
    assert files["ratings.csv"]["sha256"] == "aa289ca83157595d0df6aea1be6a4ded676ddc4385472e8313a8ed9805352646"


def test_amazon_beauty(datasets_root: Path) -> None:
    ds = prepare_dataset("amazon-beauty-2014", data_dir=datasets_root)
    assert _counts(ds) == (198_502, 22_363, 12_101)
    assert ds.info.has_timestamps is False and ds.info.actions == ["review"]
    _check_invariants(ds)
    ev = ds.events
    assert (ev.column("timestamp").to_numpy() == ev.column("seq").to_numpy()).all()
    # user 2's line is "2 6 7 8 9 10 4 11"
    u = ev.column("user_id").to_numpy()
    assert ev.column("item_id").to_numpy()[u == 2].tolist() == [6, 7, 8, 9, 10, 4, 11]
    first = json.loads(ds.items.slice(0, 1).column("attributes")[0].as_py())
    assert first["asin"] == "B004756YJA" and first["brand"] == "OPI"
    titles = ds.items.column("title").to_pylist()
    assert not any("&amp;" in t for t in titles if t)  # unescaped
    raws = [json.loads(a).get("title_raw") for a in ds.items.column("attributes").to_pylist()]
    assert sum(r is not None for r in raws) > 0
    assert ds.info.extra["counts"]["synthesised_items"] == 0


def test_taobao(datasets_root: Path) -> None:
    ds = prepare_dataset("taobao", data_dir=datasets_root)
    assert _counts(ds) == (4_321, 43, 3_276)
    assert ds.info.extra["counts"]["actions"] == {"pv": 3_926, "cart": 190, "fav": 128, "buy": 77}
    assert ds.info.positive_actions == ["pv", "cart", "fav", "buy"]
    _check_invariants(ds)


def test_movielens_1m_missing_ratings_message(data_root: Path) -> None:
    """The shared ML-1M copy (and its stand-in) has movies.dat but no ratings.dat."""
    with pytest.raises(MissingDataError) as ei:
        prepare_dataset("movielens-1m", data_dir=data_root)
    msg = str(ei.value)
    folder = data_root.resolve() / "movielens-1m"
    assert "ratings.dat" in msg and "movies.dat" not in msg.split("not found")[0]
    assert str(folder / "ratings.dat") in msg
    assert "--download" in msg and "download=True" not in msg  # CLI words
    assert "https://files.grouplens.org/datasets/movielens/ml-1m.zip" in msg


def test_slate_size_option(data_root: Path) -> None:
    ds = prepare_dataset("taobao", data_dir=data_root, options=IngestOptions(slate_size=3))
    lens = [len(x) for x in ds.feedviews.column("item_ids").to_pylist()]
    assert max(lens) == 3 and ds.info.extra["slate_size"] == 3 and "chunks of 3" in ds.info.feedview_rule


def test_registry_and_unknown_name(tmp_path: Path) -> None:
    names = [s.name for s in list_datasets()]
    for n in ("movielens-100k", "movielens-10m", "movielens-32m", "amazon-p5", "taobao", "generic"):
        assert n in names
    with pytest.raises(ConfigError, match="unknown name 'nope'"):
        prepare_dataset("nope")
    with pytest.raises(MissingDataError, match="does not exist"):
        prepare_dataset("movielens-100k", data_dir=tmp_path)
    with pytest.raises(ConfigError, match="give --source"):
        prepare_dataset("generic", data_dir=tmp_path)


def test_sha256_matches_file(data_root: Path) -> None:
    ds = prepare_dataset("taobao", data_dir=data_root)
    f = ds.source["files"][0]
    assert f["sha256"] == hashlib.sha256(Path(f["path"]).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- the synthetic stand-ins
# What the checks above assert of the real files, against the counts each stand-in's writer recorded: the
# stand-ins are what many tests run on in a clone without the datasets, so they must ingest as the real ones do.


def test_synthetic_movielens_100k(synthetic_datasets_root: Path) -> None:
    folder = synthetic_datasets_root / "movielens-100k"
    want = stats(folder)
    assert is_synthetic(folder)
    ds = prepare_dataset("movielens-100k", data_dir=synthetic_datasets_root)
    assert _counts(ds) == (want["ratings"], want["users"], want["items"])
    _check_invariants(ds)
    n1, n2, n3, n4, n5 = want["ratings_by_value"]
    assert ds.info.extra["counts"]["actions"] == {"view": n3, "like": n4 + n5, "dislike": n1 + n2}
    per_user = np.bincount(ds.events.column("user_id").to_numpy())
    assert per_user[1:].min() == want["user_events"]["min"] >= 20 and per_user[1] == want["user_events"]["user_1"]
    row = ds.items.slice(0, 1).to_pylist()[0]
    u_item = (folder / "u.item").read_bytes().decode("latin-1").splitlines()[0].split("|")
    assert row["item_id"] == 1 and row["title"] == u_item[1]
    assert any("\u00e9" in t for t in ds.items.column("title").to_pylist() if t)  # Latin-1 decoded
    files = {Path(f["path"]).name: f for f in ds.source["files"]}
    assert files["u.item"]["encoding"] == "latin-1" and "u.genre" in files


def test_synthetic_movielens_latest_small(synthetic_datasets_root: Path) -> None:
    want = stats(synthetic_datasets_root / "movielens-latest-small")
    ds = prepare_dataset("movielens-latest-small", data_dir=synthetic_datasets_root)
    assert _counts(ds) == (want["ratings"], want["users"], want["movies"])
    assert ds.info.extra["counts"]["interacted_items"] == want["rated_movies"] < want["movies"]
    _check_invariants(ds)
    titles = ds.items.column("title").to_pylist()
    assert any(", The (" in t for t in titles)  # a quoted CSV field holding a comma
    assert any(json.loads(a)["genres"] == [] for a in ds.items.column("attributes").to_pylist())


def test_synthetic_amazon_beauty(synthetic_datasets_root: Path) -> None:
    folder = synthetic_datasets_root / "amazon-beauty-2014"
    want = stats(folder)
    ds = prepare_dataset("amazon-beauty-2014", data_dir=synthetic_datasets_root)
    assert _counts(ds) == (want["events"], want["users"], want["items"])
    assert ds.info.has_timestamps is False and ds.info.actions == ["review"]
    _check_invariants(ds)
    ev = ds.events
    assert (ev.column("timestamp").to_numpy() == ev.column("seq").to_numpy()).all()
    line = [int(t) for t in (folder / "sequential_data.txt").read_text().splitlines()[1].split()]
    u = ev.column("user_id").to_numpy()
    assert ev.column("item_id").to_numpy()[u == line[0]].tolist() == line[1:]
    per_item = np.bincount(ev.column("item_id").to_numpy())
    assert per_item[1:].min() >= 5 and np.bincount(u)[1:].min() >= 5  # 5-core, as the P5 files are
    titles = ds.items.column("title").to_pylist()
    assert not any("&amp;" in t for t in titles if t)  # unescaped
    raws = [json.loads(a).get("title_raw") for a in ds.items.column("attributes").to_pylist()]
    assert sum(r is not None for r in raws) == want["escaped_titles"] > 0
    assert ds.info.extra["counts"]["synthesised_items"] == 0


def test_synthetic_taobao(synthetic_datasets_root: Path) -> None:
    want = stats(synthetic_datasets_root / "taobao-userbehavior-sample")
    ds = prepare_dataset("taobao", data_dir=synthetic_datasets_root)
    assert _counts(ds)[:2] == (want["events"], want["users"])
    assert ds.info.extra["counts"]["actions"] == want["actions"]
    _check_invariants(ds)
