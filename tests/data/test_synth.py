"""genrec.data.synth: the synthetic log's marginals and structure, determinism, chunking, the streaming write's
atomicity, and a synthetic work directory going through features, SIDs and training."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from genrec.data import synth
from genrec.data.ingest.feedviews import build_feedviews, feedview_rule_text
from genrec.data.schema import Dataset, DatasetInfo
from genrec.data.store import TableStore
from genrec.data.synth import DEFAULT_ACTIONS, DEFAULT_SURFACES, synthesize
from genrec.errors import ConfigError, GenrecError

USERS, ITEMS, EVENTS = 2000, 2000, 100_000


def _tables(wd: Path) -> dict[str, pa.Table]:
    st = TableStore(wd / "tables")
    return {"events": st.read_events().sort_by([("user_id", "ascending"), ("seq", "ascending")]),
            "feedviews": st.read_feedviews().sort_by([("user_id", "ascending"), ("request_seq", "ascending")]),
            "items": st.read_items()}


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, pa.Table]]:
    wd = tmp_path_factory.mktemp("synth") / "run"
    summary = synthesize(wd, users=USERS, items=ITEMS, events=EVENTS, seed=0, n_buckets=4)
    return wd, summary, _tables(wd)


def _zipf_slope(item_ids: np.ndarray, lo: int = 3, hi: int = 300) -> float:
    """Log-log slope of the rank-frequency curve over ranks lo..hi (the head's first ranks and the sparse tail
    are noise)."""
    c = np.sort(np.bincount(item_ids))[::-1]
    r = np.arange(lo, hi + 1)
    return float(np.polyfit(np.log(r), np.log(c[lo - 1:hi]), 1)[0])


def _item_attr(items: pa.Table, key: str) -> np.ndarray:
    """attributes[key] of each item, indexed by item id - 1 (ids are 1..items)."""
    assert items.column("item_id").to_numpy().tolist() == list(range(1, items.num_rows + 1))
    return np.array([json.loads(a)[key] for a in items.column("attributes").to_pylist()])


def test_marginals(big: tuple[Path, dict[str, Any], dict[str, pa.Table]]) -> None:
    wd, summary, t = big
    ev = t["events"]
    user, item = ev.column("user_id").to_numpy(), ev.column("item_id").to_numpy()
    seq, ts = ev.column("seq").to_numpy(), ev.column("timestamp").to_numpy()
    # sizes: the lengths are rounded to sum to the request exactly
    assert summary["counts"] == {"events": EVENTS, "users": USERS, "items": ITEMS, "feedviews": t["feedviews"].num_rows}
    assert set(np.unique(user).tolist()) == set(range(1, USERS + 1)) and item.min() >= 1 and item.max() <= ITEMS
    # per user: seq 0..n-1, timestamps strictly increasing (epoch seconds)
    first = np.r_[True, user[1:] != user[:-1]]
    starts = np.flatnonzero(first)
    lens = np.diff(np.r_[starts, user.size])
    assert np.array_equal(seq, np.arange(user.size) - np.repeat(starts, lens))
    assert (np.diff(ts)[~first[1:]] > 0).all() and ts.min() >= 1_600_000_000
    assert lens.min() >= 5 and np.percentile(lens, 99) > 5 * np.median(lens)  # heavy-tailed histories
    # item popularity: Zipf with the configured exponent (1.0); repeats redrawn once trim the head a little
    assert abs(_zipf_slope(item) + 1.0) < 0.1
    # actions and surfaces near their configured shares
    for col, shares in (("action", DEFAULT_ACTIONS), ("surface", DEFAULT_SURFACES)):
        names, counts = np.unique(np.asarray(ev.column(col).to_pylist()), return_counts=True)
        got = dict(zip(names.tolist(), (counts / user.size).tolist()))
        total = sum(shares.values())
        assert set(got) == set(shares)
        for k, v in shares.items():
            assert abs(got[k] - v / total) < 0.03, (col, k, got[k])
    # session structure: consecutive events of a user share the topic (and the series) far above chance, and
    # above the same user's events 50 apart (the user's preferred topics alone); few immediate repeats
    topic, series = _item_attr(t["items"], "topic_id")[item - 1], _item_attr(t["items"], "series")[item - 1]
    cont = ~first[1:]

    def same(x: np.ndarray, lag: int) -> float:
        return float((x[lag:] == x[:-lag])[user[lag:] == user[:-lag]].mean())

    chance = float(((np.bincount(topic) / topic.size) ** 2).sum())
    assert same(topic, 1) > 5 * chance and same(topic, 1) > 1.4 * same(topic, 50), (same(topic, 1), chance)
    assert same(series, 1) > 5 * float(((np.bincount(series) / series.size) ** 2).sum())
    assert same(series, 1) > 2 * same(series, 50)  # item-to-item: the next item follows the last one's series
    assert same(item, 1) < 0.05
    # sessions: short gaps within, long between
    gaps = np.diff(ts)[cont]
    assert np.median(gaps) < 120 and np.percentile(gaps, 95) > 3600


def test_tables_read_like_an_ingested_dataset(big: tuple[Path, dict[str, Any], dict[str, pa.Table]]) -> None:
    wd, _, t = big
    st = TableStore(wd / "tables")
    info = st.info()
    assert info.actions == list(DEFAULT_ACTIONS) and info.surfaces == list(DEFAULT_SURFACES)
    assert set(info.positive_actions) < set(info.actions) and info.has_timestamps
    assert info.feedview_rule == feedview_rule_text(8, info.actions)
    c = info.extra["counts"]
    assert c["events"] == EVENTS and c["requests"] == t["feedviews"].num_rows and sum(c["actions"].values()) == EVENTS
    assert st.n_buckets == 4 and st.manifest()["inputs"]["generator"] == "genrec.data.synth"
    # the feedviews are the ingestors' slates of consecutive events
    ev = t["events"]
    a_idx = info.action_index()
    s_idx = info.surface_index()
    want = build_feedviews(
        user=ev.column("user_id").to_numpy(), seq=ev.column("seq").to_numpy(),
        timestamp=ev.column("timestamp").to_numpy(), item=ev.column("item_id").to_numpy(),
        action_idx=np.array([a_idx[a] for a in ev.column("action").to_pylist()]),
        surface_idx=np.array([s_idx[s] for s in ev.column("surface").to_pylist()]), surfaces=info.surfaces)
    assert t["feedviews"].equals(want)
    # item text carries the topic's words (content encoders see the topics)
    row = t["items"].slice(0, 1).to_pylist()[0]
    assert json.loads(row["attributes"])["topic"] in row["text"] and row["title"] in row["text"]


def test_seed_decides_and_chunking_does_not(big: tuple[Path, dict[str, Any], dict[str, pa.Table]],
                                            tmp_path: Path) -> None:
    _, summary, t = big
    again = synthesize(tmp_path / "a", users=USERS, items=ITEMS, events=EVENTS, seed=0, n_buckets=4, chunk_users=137)
    assert again["chunks"] == -(-USERS // 137) and summary["chunks"] == 1
    t2 = _tables(tmp_path / "a")
    for name in ("events", "feedviews", "items"):
        assert t2[name].equals(t[name]), name
    synthesize(tmp_path / "b", users=USERS, items=ITEMS, events=EVENTS, seed=1, n_buckets=4)
    t3 = _tables(tmp_path / "b")
    assert not t3["events"].equals(t["events"]) and not t3["items"].equals(t["items"])


def test_zipf_exponent_is_configurable(tmp_path: Path) -> None:
    synthesize(tmp_path, users=1000, items=2000, events=60_000, zipf=0.7, n_buckets=2)
    assert abs(_zipf_slope(_tables(tmp_path)["events"].column("item_id").to_numpy()) + 0.7) < 0.1


def test_bad_requests_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--events"):
        synthesize(tmp_path / "x", users=100, items=10, events=300)  # < 100 users x 5 events
    with pytest.raises(ConfigError, match="options are"):
        synthesize(tmp_path / "x", users=10, items=10, events=100, zipff=1.0)
    with pytest.raises(ConfigError, match="positive_actions"):
        synthesize(tmp_path / "x", users=10, items=10, events=100, positive_actions=("buy",))
    assert not (tmp_path / "x").exists()
    synthesize(tmp_path / "y", users=10, items=10, events=100, n_buckets=2)
    with pytest.raises(GenrecError, match="overwrite"):
        synthesize(tmp_path / "y", users=10, items=10, events=100, overwrite=False)


class Boom(RuntimeError):
    pass


def test_a_failed_synthesis_leaves_the_previous_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synthesize(tmp_path, users=50, items=40, events=1000, seed=0, n_buckets=2)
    before = _tables(tmp_path)
    manifest = (tmp_path / "tables" / "manifest.json").read_bytes()
    real, calls = synth._user_chunk, []

    def flaky(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # two chunks of the new version already appended
            raise Boom("injected failure in the generator")
        return real(*args)

    monkeypatch.setattr(synth, "_user_chunk", flaky)
    with pytest.raises(Boom):
        synthesize(tmp_path, users=60, items=40, events=1200, seed=1, n_buckets=3, chunk_users=10)
    assert (tmp_path / "tables" / "manifest.json").read_bytes() == manifest
    fresh = TableStore(tmp_path / "tables")
    assert fresh._versions() == [1] and fresh.n_buckets == 2
    after = _tables(tmp_path)
    for name in before:
        assert after[name].equals(before[name])


INFO = DatasetInfo(name="s", actions=["click"], positive_actions=["click"], surfaces=["home"], feedview_rule="r")


def _chunks(n: int, fail_at: int | None = None) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Whole-user chunks of a tiny log (users 3k..3k+2 in chunk k)."""
    for k in range(n):
        if k == fail_at:
            raise Boom("generator failed")
        users = np.repeat(np.arange(3 * k, 3 * k + 3), 2)
        seq = np.tile(np.arange(2), 3)
        ev = pa.table({"user_id": users, "item_id": users % 5, "surface": ["home"] * 6, "action": ["click"] * 6,
                       "timestamp": seq, "seq": seq.astype(np.int32)})
        fv = build_feedviews(user=users, seq=seq, timestamp=seq, item=users % 5, action_idx=np.zeros(6, np.int64),
                             surface_idx=np.zeros(6, np.int64), surfaces=["home"])
        yield ev, fv


def test_open_writer_streams_chunks_atomically(tmp_path: Path) -> None:
    items = pa.table({"item_id": np.arange(5), "title": ["t"] * 5, "text": ["x"] * 5, "attributes": ["{}"] * 5})
    st = TableStore(tmp_path)
    with st.open_writer(INFO, 3, source={"k": 1}) as w:
        w.append("items", items)
        for ev, fv in _chunks(4):
            w.append("events", ev)
            w.append("feedviews", fv)
    m = w.manifest
    assert m is not None and m["counts"] == {"events": 24, "feedviews": 12, "items": 5, "users": 12}
    assert m["inputs"] == {"k": 1} and m["n_buckets"] == 3 and st.read_events().num_rows == 24
    # the same rows written whole by write(): the same tables
    whole = TableStore(tmp_path / "whole")
    evs, fvs = zip(*_chunks(4))
    whole.write(Dataset(INFO, pa.concat_tables(evs), items, pa.concat_tables(fvs)), 3)
    assert whole.counts() == st.counts()
    for b in range(3):
        assert whole.read_events(b).sort_by("user_id").equals(st.read_events(b).sort_by("user_id"))
    # a generator failing mid-stream: the staged version is purged, the previous one stays readable
    before = st.read_events()
    with pytest.raises(Boom), st.open_writer(INFO, 2, overwrite=True) as w2:
        w2.append("items", items)
        for ev, fv in _chunks(4, fail_at=2):
            w2.append("events", ev)
            w2.append("feedviews", fv)
    fresh = TableStore(tmp_path)
    assert fresh._versions() == [1] and fresh.n_buckets == 3 and fresh.read_events().equals(before)
    assert w2.manifest is None


def test_a_synthetic_workdir_trains(tmp_path: Path) -> None:
    """synthesize -> features -> SIDs -> a few training steps (ranking on the synthesised feedviews)."""
    from genrec.recipes import pipeline

    wd = tmp_path / "run"
    pipeline.synthesize(wd, users=120, items=300, events=4000, n_buckets=2)  # also genrec.synthesize
    pipeline.build_item_features(wd, content_dim=16, engagement_dim=8)
    pipeline.build_semantic_ids(wd, levels=2)
    out = pipeline.train_model(wd, "cpu-tiny", ["train.total_steps=3", "data.valid_cases=16"])
    assert out["step"] == 3 and out["checkpoint"] and np.isfinite(out["last_loss"]["action"])  # slates ranked


def test_the_cli_command_writes_the_tables_and_refuses_bad_counts(tmp_path: Path) -> None:
    """`genrec data synth` is the same call from the command line: tables with exactly --events events, the same
    as the Python API for the same seed; a request it cannot meet is an error in the CLI's words, nothing written."""
    from typer.testing import CliRunner

    from genrec.cli import app

    r = CliRunner().invoke(app, ["data", "synth", str(tmp_path / "cli"), "--users", "40", "--items", "200",
                                 "--events", "1000", "--seed", "3", "--buckets", "2"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["counts"]["events"] == 1000
    synthesize(tmp_path / "api", users=40, items=200, events=1000, seed=3, n_buckets=2)
    a, b = TableStore(tmp_path / "cli" / "tables"), TableStore(tmp_path / "api" / "tables")
    key = [("user_id", "ascending"), ("seq", "ascending")]
    assert a.read_events().sort_by(key).equals(b.read_events().sort_by(key))
    bad = CliRunner().invoke(app, ["data", "synth", str(tmp_path / "bad"), "--users", "40", "--items", "200",
                                   "--events", "10"])
    assert bad.exit_code != 0 and not (tmp_path / "bad" / "tables" / "manifest.json").exists()
