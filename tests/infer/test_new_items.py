"""New items (PinGER §1: retrievable as soon as they have codes): `genrec sid assign` with content vectors in the
item features' space adds them to the served catalogue -- they can be in a history, be retrieved (ANN, SID) and be
ranked -- and pointing CURRENT back (`genrec sid use`) takes them out again (audit: they got codes but were never
in the catalogue, so every request dropped them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from genrec.cli import app
from tests.tiny_run import build_run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    return build_run(tmp_path_factory.mktemp("new-items"), data_root, steps=4)


def _spare_copies(run: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Content vectors of n existing items whose frozen-codebook prefix still has a free final code, so that
    coding copies of them cannot grow the last level (the test stays servable by the trained model)."""
    from genrec.features.store import ItemVectors
    from genrec.sid.build import new_item_vectors, open_current

    sb = open_current(run / "sid")
    vecs = ItemVectors.load(run / "features")
    content = np.asarray(vecs.content, dtype=np.float32)
    sem = sb.quantizer.encode(new_item_vectors(sb.path, content, sb.quantizer.dim))  # [N, L]
    codes = np.asarray(sb.codes)
    top = {}
    for c in codes:
        key = tuple(c[:-1].tolist())
        top[key] = max(top.get(key, -1), int(c[-1]))
    pick, used = [], {}
    for i, s in enumerate(sem):
        key = tuple(s.tolist())
        nxt = top.get(key, -1) + 1 + used.get(key, 0)
        if nxt < sb.codebook_sizes[-1]:
            pick.append(i)
            used[key] = used.get(key, 0) + 1
        if len(pick) == n:
            break
    assert len(pick) == n
    return content[pick], np.asarray(vecs.item_ids)[pick]


def test_assigned_items_are_served_and_sid_use_takes_them_back(run: Path, tmp_path: Path) -> None:
    from genrec.infer.recommender import Recommender

    base = Recommender.from_checkpoint(run)
    v0 = base.sid_version
    content, twins = _spare_copies(run, 4)
    new_ids = np.arange(900_001, 900_005)
    np.save(tmp_path / "vectors.npy", content)
    np.save(tmp_path / "item_ids.npy", new_ids)
    r = CliRunner().invoke(app, ["sid", "assign", str(run), "--vectors", str(tmp_path / "vectors.npy")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):r.output.rindex("}") + 1])
    assert out["new_items"] == 4 and out["added_to_catalogue"] == 4 and out["current"], out

    rec = Recommender.from_checkpoint(run)
    assert rec.sid_version != v0 and len(rec.catalog) == len(base.catalog) + 4
    rows = rec.catalog.rows(new_ids)
    assert (rows >= len(base.catalog)).all()
    # a new item's features: its content vector and the engagement block imputed from its content neighbours, as
    # its SIDs were coded, times COLD_ENGAGEMENT_SCALE (nobody engaged with it yet; tests/infer/
    # test_cold_item_vectors.py checks the vectors)
    from genrec.catalog import COLD_ENGAGEMENT_SCALE
    from genrec.features.store import ItemVectors
    from genrec.sid.source import new_item_engagement

    dc = content.shape[1]
    np.testing.assert_allclose(rec.catalog.feats[rows, :dc].numpy(), content, rtol=0, atol=0)
    feats = ItemVectors.load(run / "features")
    np.testing.assert_allclose(rec.catalog.feats[rows, dc:].numpy(),
                               COLD_ENGAGEMENT_SCALE * new_item_engagement(content, feats.content, feats.engagement),
                               rtol=0, atol=1e-6)
    assert rec.catalog.added is not None and rec.catalog.added[rows].all() and rec.catalog.added.sum() == 4
    # in a history (not dropped) ...
    got = rec.recommend([int(new_ids[0]), 50, 172], k=5)
    assert got.dropped_items == []
    # ... rankable over the cached history like any candidate, and retrievable by the ANN and SID stages
    p = rec.parse_history([50, 172, 181])
    cache, _ = rec.encode(rec.model_batch([p]))
    logits = rec.score_candidates(cache, torch.as_tensor(rows)[None])
    assert torch.isfinite(logits).all()
    assert set(rec.ann.item_ids.tolist()) >= set(new_ids.tolist())
    codes = rec.codes[torch.as_tensor(rows)].tolist()
    assert len({tuple(c) for c in codes}) == 4  # each new item its own full SID
    assert set(rows.tolist()) <= set(np.asarray(rec.leaf_rows).reshape(-1).tolist())  # SID beams reach them
    # CURRENT back to the old version: the new items leave the catalogue again
    r = CliRunner().invoke(app, ["sid", "use", str(run), v0])
    assert r.exit_code == 0, r.output
    back = Recommender.from_checkpoint(run)
    assert back.sid_version == v0 and len(back.catalog) == len(base.catalog)
    assert back.recommend([int(new_ids[0]), 50], k=3).dropped_items == [int(new_ids[0])]
    r = CliRunner().invoke(app, ["sid", "list", str(run)])
    listed = json.loads(r.output)["versions"]
    assert [v["current"] for v in listed].count(True) == 1 and any(v["new_items"] == 4 for v in listed)
