"""build_features end to end on a tiny catalogue: files, manifest, alignment, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from genrec.errors import ConfigError
from genrec.features import ItemVectors, build_features, content_vectors, engagement_vectors
from genrec.workdir import WorkDir, read_json


def tiny() -> tuple[pa.Table, pa.Table]:
    texts = ["red nail polish", "pink nail polish", "face cream spf", "night face cream",
             "curly hair shampoo", "dry hair shampoo", "black mascara", "volume mascara"]
    ids = [40, 10, 70, 20, 80, 30, 60, 50]
    items = pa.table({"item_id": pa.array(ids, pa.int64()), "title": texts, "text": texts,
                      "attributes": ["{}"] * len(ids)})
    rng = np.random.default_rng(0)
    rows = []
    for u in range(30):
        h = rng.choice(ids, size=6)
        rows += [(u, int(it), i) for i, it in enumerate(h)]
    ev = pa.table({"user_id": pa.array([r[0] for r in rows], pa.int64()),
                   "item_id": pa.array([r[1] for r in rows], pa.int64()),
                   "surface": ["home"] * len(rows), "action": ["click"] * len(rows),
                   "timestamp": pa.array([r[2] for r in rows], pa.int64()),
                   "seq": pa.array([r[2] for r in rows], pa.int32())})
    return items, ev


def test_build_writes_store_and_manifest(tmp_path: Path) -> None:
    items, ev = tiny()
    wd = WorkDir(tmp_path / "run").ensure()
    v = build_features(items, ev, wd.features, content_dim=4, engagement_dim=3, seed=0,
                       inputs={"tables_manifest": "tables/manifest.json"})
    assert sorted(p.name for p in wd.features.iterdir()) == ["content.npy", "engagement.npy", "item_ids.npy",
                                                             "manifest.json"]
    np.testing.assert_array_equal(v.item_ids, items["item_id"].to_numpy())
    np.testing.assert_array_equal(v.content, content_vectors(items, "tfidf", dim=4, seed=0))
    np.testing.assert_array_equal(v.engagement, engagement_vectors(ev, v.item_ids, dim=3, seed=0))
    w = ItemVectors.load(wd.features, verify=True)
    np.testing.assert_array_equal(w.concat(), v.concat())
    m = read_json(wd.features / "manifest.json")
    assert m["params"]["content"] == "tfidf" and m["params"]["window"] == 5 and m["params"]["seed"] == 0
    assert m["inputs"]["train_events"]["rows"] == ev.num_rows and len(m["inputs"]["items"]["sha256"]) == 64
    assert m["inputs"]["tables_manifest"] == "tables/manifest.json"
    assert m["counts"] == {"items": 8, "content_dim": 4, "engagement_dim": 3, "zero_content": 0,
                           "zero_engagement": 0}
    assert set(m["extra"]["seconds"]) == {"content", "engagement"}


def test_rebuild_is_deterministic_and_replaces(tmp_path: Path) -> None:
    items, ev = tiny()
    a = build_features(items, ev, tmp_path / "features", content_dim=4, engagement_dim=3, seed=0)
    b = build_features(items, ev, tmp_path / "features", content_dim=4, engagement_dim=3, seed=0)
    np.testing.assert_array_equal(a.concat(), b.concat())
    changed = ev.slice(0, ev.num_rows - 6)  # drop one user's history
    build_features(items, changed, tmp_path / "features", content_dim=4, engagement_dim=3, seed=0)
    m = read_json(tmp_path / "features" / "manifest.json")
    assert m["inputs"]["train_events"]["rows"] == ev.num_rows - 6
    assert [p.name for p in tmp_path.iterdir()] == ["features"]


def test_bad_spec_fails_before_work(tmp_path: Path) -> None:
    items, ev = tiny()
    with pytest.raises(ConfigError, match="content spec"):
        build_features(items, ev, tmp_path / "features", content="word2vec")
    assert not (tmp_path / "features").exists()
