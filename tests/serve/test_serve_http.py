"""The HTTP service against a real uvicorn server on loopback (httpx; no mocks of the HTTP layer):
equivalence with the Recommender and with offline full-prefill scoring, the input policy, metrics."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from genrec.serve.config import ServeConfig
from genrec.serve.schemas import MAX_BEAM, MAX_K

from ._server import ServerThread, http_client, serving


@pytest.fixture(scope="module")
def server(run_dir: Path):
    yield from serving(ServeConfig(workdir=run_dir, max_body_bytes=256 * 1024))


@pytest.fixture(scope="module")
def client(server: ServerThread):
    yield from http_client(server)


def hist(ids: list[int]) -> list[dict]:
    return [{"item_id": int(i)} for i in ids]


def test_health_ready_metrics(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"ok": True}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["ready"] and r.json()["index_version"].startswith("step-")
    # no `genrec fusion tune` on this run: UniPinRec's L1 (the action heads alone)
    f = r.json()["l1_fusion"]
    assert {k: f[k] for k in ("action_weight", "retrieval_weight", "sid_weight", "stored")} == {
        "action_weight": 1.0, "retrieval_weight": 0.0, "sid_weight": 0.0, "stored": None}
    assert f["utility"] == {"view": 1.0, "like": 1.0, "dislike": -1.0}  # +1 positive, -1 negative actions
    client.post("/v1/recommend", json={"history": hist([1, 2, 3]), "k": 5})
    m = client.get("/metrics").text
    for name in ("genrec_stage_latency_ms_bucket", 'stage="encode"', 'stage="sid"', 'stage="ann"', 'stage="rank"',
                 "genrec_in_flight_requests", "genrec_kv_pool_occupancy", "genrec_index_version_info{version="):
        assert name in m, name


@pytest.mark.parametrize("params", [
    dict(k=7, beam_width=12, diversity_lambda=0.0, sources=["sid", "ann"], rank=True),
    dict(k=5, beam_width=8, diversity_lambda=0.5, sources=["sid"], rank=False),
    dict(k=4, beam_width=4, diversity_lambda=0.0, sources=["ann"], rank=True),
])
def test_recommend_equals_recommender(server: ServerThread, client: httpx.Client, params: dict) -> None:
    rec = server.service.holder.current.engine.rec
    h = hist([1, 50, 172, 181, 258]) + [{"item_id": 99999999}]
    r = client.post("/v1/recommend", json={"history": h, **params})
    assert r.status_code == 200, r.text
    body = r.json()
    want = rec.recommend(h, **params)
    assert [x["item_id"] for x in body["items"]] == [x.item_id for x in want]
    np.testing.assert_allclose([x["score"] for x in body["items"]], [x.score for x in want], rtol=0, atol=1e-6)
    assert [x["sources"] for x in body["items"]] == [list(x.sources) for x in want]
    assert [x["sid"] for x in body["items"]] == [list(x.sid) for x in want]
    assert body["dropped_items"] == [99999999]
    assert body["degraded"] is False and not body["cold_start"]
    assert set(body["timings_ms"]) == {"encode", "sid", "ann", "rank", "total"}


def test_rank_equals_offline_full_prefill(server: ServerThread, client: httpx.Client) -> None:
    """/v1/rank (cached history + M-FALCON decode) == one full forward over history + candidates."""
    from genrec.model.genrec_model import ModelBatch

    rec = server.service.holder.current.engine.rec
    h = hist([1, 50, 172, 181, 258, 7, 9])
    cands = [2, 3, 4, 100, 300, 12345678]
    r = client.post("/v1/rank", json={"history": h, "candidates": cands})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["unknown_candidates"] == [12345678]
    p = rec.parse_history(h)
    mb = rec.model_batch([p])
    rows = torch.as_tensor(rec.catalog.rows(np.array(cands[:-1])))[None]
    full = ModelBatch(actions=mb.actions, surfaces=mb.surfaces, lengths=mb.lengths, sid_codes=mb.sid_codes,
                      item_vecs=mb.item_vecs, timestamps=mb.timestamps, cand_vecs=rec.item_vecs[rows],
                      cand_sid_codes=rec.codes[rows], cand_surface=torch.tensor([int(p["surfaces"][-1])]))
    with torch.no_grad():
        out = rec.model(full, serving_layout=True)
    want = torch.sigmoid(out.cand_action_logits[0]).numpy()  # [k, C]
    by_id = {x["item_id"]: x for x in body["items"]}
    assert sorted(by_id) == sorted(cands[:-1])
    got = np.array([[by_id[c]["action_probs"][a] for a in rec.actions] for c in cands[:-1]])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    scores = [x["score"] for x in body["items"]]
    assert scores == sorted(scores, reverse=True)  # best first (the utility of those probabilities)
    util = want @ rec.utility_vector(None).numpy()
    np.testing.assert_allclose([by_id[c]["score"] for c in cands[:-1]], util, rtol=0, atol=1e-4)


@pytest.mark.parametrize("fusion", [None, {"action_weight": 1.0, "retrieval_weight": 0.5, "sid_weight": 0.2}])
def test_rank_scores_are_recommends(client: httpx.Client, fusion: dict | None) -> None:
    """The items /v1/recommend returned, sent to /v1/rank in reverse: the same scores (the L1 score, with the
    SID term's floor for the items only ANN found) and so the same order."""
    h = hist([1, 50, 172, 181, 258, 7, 9])
    extra = {} if fusion is None else {"fusion": fusion}
    rec = client.post("/v1/recommend", json={"history": h, "k": 10, **extra}).json()
    ids = [x["item_id"] for x in rec["items"]]
    r = client.post("/v1/rank", json={"history": h, "candidates": ids[::-1], **extra})
    assert r.status_code == 200, r.text
    got = r.json()["items"]
    assert [x["item_id"] for x in got] == ids
    np.testing.assert_allclose([x["score"] for x in got], [x["score"] for x in rec["items"]], rtol=0, atol=1e-5)


def test_long_history_keeps_newest(server: ServerThread, client: httpx.Client) -> None:
    ctx = server.service.holder.current.engine.context_len
    ids = list(range(1, ctx + 16))
    a = client.post("/v1/recommend", json={"history": hist(ids), "k": 6}).json()
    b = client.post("/v1/recommend", json={"history": hist(ids[-ctx:]), "k": 6}).json()
    assert a["truncated_items"] == 15 and b["truncated_items"] == 0
    assert [x["item_id"] for x in a["items"]] == [x["item_id"] for x in b["items"]]
    c = client.post("/v1/recommend", json={"history": hist(ids[:ctx]), "k": 6}).json()
    assert [x["score"] for x in c["items"]] != [x["score"] for x in a["items"]]  # the oldest were cut, not newest


def test_exclude_history_drops_the_whole_history(server: ServerThread, client: httpx.Client, run_dir: Path) -> None:
    """Issue 38: ``exclude_history`` on /v1/recommend (default false) leaves out every item of the given
    history -- MovieLens user 1's 272, not only the newest context window the model reads -- and still
    answers k items, as the Recommender does; the micro-batched path too."""
    from genrec.infer.cases import user_history
    from genrec.serve.schemas import RecommendRequest

    eng = server.service.holder.current.engine
    h = [{"item_id": e["item_id"], "action": e["action"], "ts": e["ts"]} for e in user_history(run_dir, 1)]
    seen = {e["item_id"] for e in h}
    assert len(seen) > eng.context_len
    field = RecommendRequest.model_fields["exclude_history"]
    assert field.default is False and "history" in (field.description or "")
    for params in ({"k": 10}, {"k": 10, "sources": ["sid"], "rank": False}):
        r = client.post("/v1/recommend", json={"history": h, "exclude_history": True, **params})
        assert r.status_code == 200, r.text
        got = [x["item_id"] for x in r.json()["items"]]
        assert len(got) == 10 and not set(got) & seen, (params, sorted(set(got) & seen))
        assert got == [x.item_id for x in eng.rec.recommend(h, exclude_history=True, **params)]
    short = h[-5:]
    many = eng.recommend_many([h, short], k=10, beam_width=20, diversity_lambda=0.0, sources=["sid", "ann"],
                              rank=True, exclude_history=True)
    assert not {x["item_id"] for x in many[0]["items"]} & seen
    assert not {x["item_id"] for x in many[1]["items"]} & {e["item_id"] for e in short}
    assert client.post("/v1/recommend", json={"history": h, "exclude_history": "yes"}).status_code == 422


def test_cold_start_answers(client: httpx.Client) -> None:
    for h in ([], hist([99999991, 99999992])):
        r = client.post("/v1/recommend", json={"history": h, "k": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["cold_start"] and len(body["items"]) == 3
        assert body["dropped_items"] == [x["item_id"] for x in h]


@pytest.mark.parametrize("field,value", [("k", 0), ("k", MAX_K + 1), ("k", -5), ("beam_width", 0),
                                         ("beam_width", MAX_BEAM + 1), ("diversity_lambda", -0.1),
                                         ("diversity_lambda", 1e9), ("diversity_lambda", "0.5"),
                                         ("diversity_lambda", True), ("k", "10"), ("k", 2.5), ("rank", "yes"),
                                         ("sources", ["bm25"]), ("sources", []), ("beam_witdh", 3)])
def test_out_of_range_is_422_naming_field(client: httpx.Client, field: str, value: object) -> None:
    r = client.post("/v1/recommend", json={"history": hist([1, 2]), field: value})
    assert r.status_code == 422, r.text
    body = r.json()
    assert any(f.startswith(field) for f in body["fields"]), body
    assert field in body["message"]


def test_per_request_fusion_weights(server: ServerThread, client: httpx.Client) -> None:
    """A request's L1 weights reach the ranking exactly as the Recommender's keyword arguments do;
    a weight left out keeps the server's."""
    rec = server.service.holder.current.engine.rec
    h = hist([1, 50, 172, 181, 258, 7])
    scores = {}
    for fusion in ({"retrieval_weight": 1.0, "action_weight": 0}, {"sid_weight": 2.0}):  # ints are numbers too
        r = client.post("/v1/recommend", json={"history": h, "k": 8, "fusion": fusion})
        assert r.status_code == 200, r.text
        want = rec.recommend(h, k=8, **fusion)
        got = r.json()["items"]
        assert [x["item_id"] for x in got] == [x.item_id for x in want]
        np.testing.assert_allclose([x["score"] for x in got], [x.score for x in want], rtol=0, atol=1e-6)
        scores[tuple(fusion)] = [x["score"] for x in got]
    plain = client.post("/v1/recommend", json={"history": h, "k": 8}).json()["items"]
    assert [x["score"] for x in plain] not in scores.values()  # the weights really changed the scores


@pytest.mark.parametrize("fusion,field", [({"sid_weight": -1}, "fusion.sid_weight"),
                                          ({"action_weight": 1e9}, "fusion.action_weight"),
                                          ({"retrieval_weight": "1"}, "fusion.retrieval_weight"),
                                          ({"sid_weight": True}, "fusion.sid_weight"),
                                          ({"weight": 1}, "fusion.weight"), (3, "fusion")])
def test_bad_fusion_weights_are_422_naming_field(client: httpx.Client, fusion: object, field: str) -> None:
    r = client.post("/v1/recommend", json={"history": hist([1, 2]), "fusion": fusion})
    assert r.status_code == 422, r.text
    assert any(f.startswith(field) for f in r.json()["fields"]), r.json()


def test_bad_vocab_and_nan_and_json(client: httpx.Client) -> None:
    r = client.post("/v1/recommend", json={"history": [{"item_id": 1, "action": "teleport"}]})
    assert r.status_code == 422 and "action" in r.json()["message"], r.text
    raw = b'{"history": [{"item_id": 1}], "diversity_lambda": NaN}'
    r = client.post("/v1/recommend", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["fields"] == ["diversity_lambda"]
    r = client.post("/v1/recommend", content=b'{"history": [{"item_id": 1}', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["message"]
    r = client.post("/v1/recommend", json={"history": [{"item_id": True}]})  # strict ints: no bools
    assert r.status_code == 422 and r.json()["fields"][0].startswith("history[0].item_id")


def test_body_limit_413_and_still_serving(client: httpx.Client) -> None:
    big = {"history": hist(range(100_000))}  # a 100k-item history: ~1.7 MB > the 256 KiB limit
    r = client.post("/v1/recommend", json=big)
    assert r.status_code == 413 and "exceeds the limit" in r.json()["message"]

    def chunks():  # no Content-Length: the streamed-body check must catch it
        for _ in range(64):
            yield b" " * 8192

    r = client.post("/v1/recommend", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert client.post("/v1/recommend", json={"history": hist([1, 2])}).status_code == 200


def test_rank_cold_start_orders_by_popularity(server: ServerThread, client: httpx.Client) -> None:
    """/v1/rank with no known history item answers as /v1/recommend does (a cold start, not a 422): the known
    candidates, most interacted first in the run's events, without action probabilities."""
    from genrec.catalog import open_store

    eng = server.service.holder.current.engine
    ev = open_store(server.service.cfg.workdir) \
        .read_events(columns=["item_id"]).column("item_id").to_numpy()
    ids, counts = np.unique(ev, return_counts=True)
    count = dict(zip(ids.tolist(), counts.tolist()))
    cands = [int(i) for i in ids[[5, 0, 40, 17, 3]]] + [12345678]
    for h in ([], hist([99999991])):
        r = client.post("/v1/rank", json={"history": h, "candidates": cands})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["cold_start"] and body["unknown_candidates"] == [12345678]
        assert body["dropped_items"] == ([99999991] if h else [])
        got = [x["item_id"] for x in body["items"]]
        assert sorted(got) == sorted(cands[:-1]) and all(x["action_probs"] is None for x in body["items"])
        assert [count[i] for i in got] == sorted((count[i] for i in got), reverse=True)
        scores = [x["score"] for x in body["items"]]
        assert scores == sorted(scores, reverse=True) and 0 < scores[-1] <= scores[0] <= 1
    r = client.post("/v1/rank", json={"history": [], "candidates": cands, "surface": "no-such-surface"})
    assert r.status_code == 422 and r.json()["fields"] == ["surface"], r.text
    warm = client.post("/v1/rank", json={"history": hist([1, 2]), "candidates": cands}).json()
    assert not warm["cold_start"] and all(x["action_probs"] for x in warm["items"])


def test_rank_bad_input(client: httpx.Client) -> None:
    assert client.post("/v1/rank", json={"history": hist([1]), "candidates": []}).status_code == 422
    # a run whose ids were not remapped takes strict integers: the text "12" is not item 12
    for path, body, field in (("/v1/recommend", {"history": [{"item_id": "12"}]}, "history[0].item_id"),
                              ("/v1/rank", {"history": [{"item_id": "12"}], "candidates": [5]}, "history[0].item_id"),
                              ("/v1/rank", {"history": hist([1]), "candidates": [5, "12"]}, "candidates[1]")):
        r = client.post(path, json=body)
        assert r.status_code == 422 and r.json()["fields"] == [field], r.text
    r = client.post("/v1/rank", json={"history": hist([1]), "candidates": ["x"]})
    assert r.status_code == 422 and r.json()["fields"][0].startswith("candidates")
    for bad in (2 ** 63, -(2 ** 63) - 1, 2 ** 64):  # item ids are int64: a 422 naming the candidate, not a 500
        r = client.post("/v1/rank", json={"history": hist([1]), "candidates": [5, bad]})
        assert r.status_code == 422 and r.json()["fields"] == ["candidates[1]"], r.text


def test_metrics_label_only_known_routes_and_count_413(client: httpx.Client) -> None:
    """A scanner's random paths share one "other" series (the metrics cannot grow without bound), and a
    body refused for its size is counted (the counter wraps the body limit)."""
    import uuid

    paths = [f"/scan/{uuid.uuid4().hex}" for _ in range(30)]
    for p in paths:
        assert client.get(p).status_code == 404
    client.post("/v1/recommend", json={"history": hist(range(100_000))})  # 413
    client.get("/healthz")
    m = client.get("/metrics").text
    assert not any(p in m for p in paths)
    n_other = [line for line in m.splitlines() if line.startswith('genrec_requests_total{endpoint="other",status="404"}')]
    assert n_other and float(n_other[0].split()[-1]) >= 30, n_other
    assert 'genrec_requests_total{endpoint="/v1/recommend",status="413"}' in m
    assert 'genrec_requests_total{endpoint="/healthz",status="200"}' in m


def test_a_body_that_is_not_utf8_names_the_body(client: httpx.Client) -> None:
    raw = b'{"history": [{"item_id": 1}], "surface": "' + bytes([0xFF, 0xFE]) + b'"}'
    r = client.post("/v1/recommend", content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422) and r.json()["fields"] == ["body"], r.text


def test_metrics_count_the_graphs_the_model_captured(run_dir: Path) -> None:
    """/metrics shows the served model's graph captures per stage and the load generator reads their total:
    a capture under load (a shape met for the first time) stalls every batch behind it. On a CPU the static-shape
    path run eagerly counts its shapes as a GPU captures them."""
    from genrec.serve.app import create_app
    from genrec.serve.loadtest import batch_counts

    with ServerThread(create_app(ServeConfig(workdir=run_dir, micro_batch=4))) as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        rec = s.app.service.holder.current.engine.rec
        rec.use_graphs(use_graph=False)  # the static shapes, eagerly: each new shape counts as one capture
        before = batch_counts(s.url)
        assert before is not None and before["graph_captures"] == 0, before
        for ids in ([1, 2, 3], list(range(1, 90))):  # two history buckets: new shapes in every stage
            assert c.post("/v1/recommend", json={"history": hist(ids), "k": 5}).status_code == 200
        want = rec.graph_captures
        assert set(want) == {"encode", "sid", "rank"} and all(n >= 1 for n in want.values()), want
        m = c.get("/metrics").text
        for stage, n in want.items():
            assert f'genrec_graph_captures{{stage="{stage}"}} {float(n)}' in m, (stage, n)
        after = batch_counts(s.url)
        assert after is not None and after["graph_captures"] == sum(want.values()), after


def test_metrics_time_the_processs_gc_collections(client: httpx.Client, server: ServerThread) -> None:
    """/metrics shows this process's cyclic GC collections by generation (each one stalls every thread), timed
    by a gc callback, and the load test reads the full ones; a stopped service's callback is gone."""
    import gc

    from prometheus_client import generate_latest

    from genrec.serve.loadtest import batch_counts
    from genrec.serve.middleware import GcPauses, Metrics

    def full(text: str) -> tuple[float, float]:
        got = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
               if line.startswith("genrec_gc_pause_ms_") and 'generation="2"' in line}
        return got.get('genrec_gc_pause_ms_count{generation="2"}', 0.0), got.get(
            'genrec_gc_pause_ms_sum{generation="2"}', 0.0)

    n0, _ = full(client.get("/metrics").text)
    for _ in range(3):
        gc.collect()
    n1, ms1 = full(client.get("/metrics").text)
    assert n1 >= n0 + 3 and ms1 > 0, (n0, n1, ms1)
    got = batch_counts(server.url)
    assert got is not None and got["gc_full"] >= n1, got
    p = GcPauses().install()
    gc.collect()
    m = Metrics()
    p.drain(m.gc_pause_ms)
    assert full(generate_latest(m.registry).decode())[0] >= 1  # timed while installed
    p.remove()
    for _ in range(3):
        gc.collect()
    m = Metrics()
    p.drain(m.gc_pause_ms)
    assert full(generate_latest(m.registry).decode()) == (0.0, 0.0)  # removed: nothing more timed


def test_the_gc_timer_keeps_its_own_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GC timer a server installs never calls a replaced ``time.perf_counter``: a collection in any thread
    would otherwise advance a clock that a test (the trainer's time-budget tests) or a library put there."""
    import gc
    import time

    from genrec.serve.middleware import GcPauses

    calls: list[int] = []
    p = GcPauses().install()
    try:
        monkeypatch.setattr(time, "perf_counter", lambda: float(len(calls.append(1) or calls)))
        gc.collect()
    finally:
        monkeypatch.undo()
        p.remove()
    assert not calls, f"the GC timer read the replaced clock {len(calls)} times"
