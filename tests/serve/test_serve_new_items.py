"""A new item is retrievable at once (issue 41): `genrec sid assign` codes copies of a warm item's content vector
into a semantic prefix the served model's SID stage keeps for a history, growing the last SID level past the
model's head; the running server reloads (no retraining) and `/v1/recommend` returns the new items from its SID
stage. Full-code beams cannot reach the one past the head (no logit for its final code); the coarse-prefix
retrieval the server switches to ("auto" -> "merged") reaches them all, and the served lists equal the offline
evaluation's."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from genrec.cli import app as cli
from genrec.serve.app import create_app
from genrec.serve.config import ServeConfig
from tests.tiny_run import build_run

from ._server import ServerThread

HIST = [{"item_id": i} for i in (1, 50, 172, 181)]
W = 8  # beams: every item under the W kept prefixes fits in one response (checked below)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    return build_run(tmp_path_factory.mktemp("serve-new"), data_root, steps=4)


def _copies_into_a_kept_prefix(run: Path, top_sids: list[list[int]]) -> tuple[np.ndarray, tuple[int, ...], int]:
    """Content vectors of a warm item the frozen codebook codes into the prefix of one of ``top_sids`` (the served
    SID stage's items for HIST, so that prefix is kept), repeated until the last new copy's final code lies past
    the last level; (vectors [m, dc], that prefix, the last level's size)."""
    from genrec.features.store import ItemVectors
    from genrec.sid.build import new_item_vectors, open_current

    sb = open_current(run / "sid")
    content = np.asarray(ItemVectors.load(run / "features").content, dtype=np.float32)
    sem = sb.quantizer.encode(new_item_vectors(sb.path, content, sb.quantizer.dim))  # [N, L-1]
    codes = np.asarray(sb.codes)
    k_last = int(sb.codebook_sizes[-1])
    for sid in top_sids:
        prefix = tuple(sid[:-1])
        hit = np.flatnonzero((sem == np.asarray(prefix)).all(1))
        if len(hit):
            next_free = int(codes[(codes[:, :-1] == np.asarray(prefix)).all(1), -1].max()) + 1
            m = k_last - next_free + 1  # codes next_free .. k_last: the last one has no logit in the model
            return np.repeat(content[hit[:1]], m, axis=0), prefix, k_last
    raise AssertionError("no warm item codes into a kept prefix")


def test_assigned_item_is_served_at_once_without_retraining(run: Path, tmp_path: Path) -> None:
    from genrec.infer.recommender import Recommender

    server_app = create_app(ServeConfig(workdir=run))
    with ServerThread(server_app) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        req = {"history": HIST, "k": W, "beam_width": W, "sources": ["sid"], "rank": False}
        r = c.post("/v1/recommend", json=req)
        assert r.status_code == 200, r.text
        v0 = r.json()["index_version"]
        vecs, prefix, k_last = _copies_into_a_kept_prefix(run, [x["sid"] for x in r.json()["items"]])
        new_ids = np.arange(900_001, 900_001 + len(vecs))
        np.save(tmp_path / "vectors.npy", vecs)
        np.save(tmp_path / "item_ids.npy", new_ids)
        out = CliRunner().invoke(cli, ["sid", "assign", str(run), "--vectors", str(tmp_path / "vectors.npy")])
        assert out.exit_code == 0, out.output
        got = json.loads(out.output[out.output.index("{"):out.output.rindex("}") + 1])
        assert got["current"] and got["codebook_sizes"][-1] == k_last + 1, got  # the last level grew, published
        res = c.post("/admin/reload").json()
        assert res["ok"] and res["swapped"], res

        rec = server_app.service.holder.current.engine.rec
        assert rec.served_sid_mode == "merged" and int((~rec.known_leaves).sum()) == len(new_ids)
        n_under = int(np.diff(np.asarray(rec.trie.last_level()[0].cpu())).max())
        assert W * n_under <= 1000  # the whole expansion of the W prefixes fits in k = 1000
        body = c.post("/v1/recommend", json={**req, "k": 1000}).json()
        assert body["index_version"] != v0
        items = {str(x["item_id"]): x for x in body["items"]}
        for i in new_ids:  # every new item, also the one whose final code is past the model's head
            x = items[str(i)]
            assert tuple(x["sid"][:-1]) == prefix and x["sources"] == ["sid"], x
        assert max(items[str(i)]["sid"][-1] for i in new_ids) == k_last  # the real code, not the one the model reads
        # a history may hold one (its model-read code is in range), and the ranking stage scores them
        r = c.post("/v1/recommend", json={"history": HIST + [{"item_id": int(new_ids[-1])}], "k": 50,
                                          "beam_width": W})
        assert r.status_code == 200, r.text
        assert r.json()["dropped_items"] == []
        with torch.no_grad():
            cache, _ = rec.encode(rec.model_batch([rec.parse_history(HIST)]))
            logits = rec.score_candidates(cache, torch.as_tensor(rec.catalog.rows(new_ids))[None])
        assert torch.isfinite(logits).all()

    # full-code beams never reach the item whose final code is past the model's head (they may reach the others,
    # through a logit never trained under this prefix): the failure the coarse-prefix retrieval fixes
    full = Recommender.from_checkpoint(run, sid_mode="full")
    got_full = full.recommend(HIST, k=1000, beam_width=W, sources=["sid"], rank=False)
    assert int(new_ids[-1]) not in {x.item_id for x in got_full} and len(got_full) > 0
    _served_sid_stage_equals_the_offline_lists(run)


def _served_sid_stage_equals_the_offline_lists(run: Path) -> None:
    """The Recommender's SID stage (what /v1/recommend retrieves) and `evaluate_retrieval`'s SID lists, same
    cases, same mode: the same rows, for every mode, on the catalogue with the new items."""
    from genrec.catalog import open_store
    from genrec.data.join import BucketJoinReader
    from genrec.data.splits import SplitSpec
    from genrec.eval.retrieval import _batches, evaluate_retrieval, make_eval_set
    from genrec.infer.load import trained_temperature
    from genrec.infer.recommender import Recommender

    rec = Recommender.from_checkpoint(run)
    assert not rec.known_leaves.all()  # type: ignore[union-attr]
    es = make_eval_set(list(BucketJoinReader(open_store(run), split=SplitSpec("loo"), role="valid",
                                             context_len=rec.context_len)), rec.catalog, max_cases=24)
    for mode in ("full", "prefix", "merged", "dense"):
        lists: dict[str, np.ndarray] = {}
        evaluate_retrieval(rec.catalog_model, es, paths=("sid",), ks=(30,), beam_width=W, context_len=rec.context_len,
                           trie=rec.trie, leaf_rows=rec.leaf_rows, known=rec.known_leaves, sid_mode=mode,
                           lists_out=lists, batch_size=8, dense_temperature=trained_temperature(rec.run_config))
        rec.sid_mode = mode
        served = []
        with torch.no_grad():
            for _, tb in _batches(es, 8, rec.context_len, rec.config.n_actions):
                mb, _ = rec.catalog_model.model_batch(tb, mask_actions=False)
                cache, user = rec.encode(mb)
                served.append(rec.retrieve_sids(cache, W, 0.0, 30, user)[1])
        np.testing.assert_array_equal(np.concatenate(served), lists["sid"], err_msg=mode)
