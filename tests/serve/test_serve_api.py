"""The HTTP API's promises (issues 42 item 2 and 38), against a real uvicorn server on a tiny run whose log had
string ids (``u7``, ``m52``: remapped by ``data prepare generic``; no dataset needed):

* a client speaks the log's own ids: history and candidates in, every item id of the answer out; unknown ones
  are reported by the text sent;
* /v1/rank sorts by the score /v1/recommend ranks by, and gives the same number for the same item and history
  (rank the items /v1/recommend returned, compare);
* the request and response bodies are documented in the OpenAPI schema, with examples that validate.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from genrec.infer.cases import SourceIds
from genrec.serve import schemas
from genrec.serve.app import create_app
from genrec.serve.config import ServeConfig

from ._server import ServerThread, http_client, serving

FUSED = {"action_weight": 1.0, "retrieval_weight": 0.5, "sid_weight": 0.2}  # every term of the L1 score


@pytest.fixture(scope="module")
def server(string_id_run: Path):
    yield from serving(ServeConfig(workdir=string_id_run))


@pytest.fixture(scope="module")
def client(server: ServerThread):
    yield from http_client(server)


def log_items(run: Path) -> list[str]:
    """The item ids of the run's source CSV, in order of first appearance."""
    with open(run.parent / f"{run.name}.csv", newline="") as f:
        return list(dict.fromkeys(row["item_id"] for row in csv.DictReader(f)))


def test_the_service_speaks_the_logs_ids(server: ServerThread, client: httpx.Client, string_id_run: Path) -> None:
    items = log_items(string_id_run)
    assert all(not i.isdigit() for i in items)
    h = [{"item_id": items[0]}, {"item_id": items[3], "action": "like"}, {"item_id": "no-such-item"},
         {"item_id": items[5]}, {"item_id": 12345}]  # a number is matched as its text: not in this log
    r = client.post("/v1/recommend", json={"history": h, "k": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    got = [x["item_id"] for x in body["items"]]
    assert len(got) == 8 and all(isinstance(i, str) for i in got) and set(got) <= set(items), got
    assert body["dropped_items"] == ["no-such-item", "12345"]
    # what the Recommender answers for the tables' ids, named by the log's
    ids = SourceIds.of(string_id_run)
    assert ids is not None
    rec = server.service.holder.current.engine.rec
    table_h = [{**x, "item_id": ids.items[x["item_id"]]} for x in h if str(x["item_id"]) in ids.items]
    assert got == [ids.item_original[x.item_id] for x in rec.recommend(table_h, k=8)]

    cands = [got[2], "no-such-candidate", got[0], items[-1], got[2]]
    r = client.post("/v1/rank", json={"history": h, "candidates": cands})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["unknown_candidates"] == ["no-such-candidate"] and body["dropped_items"] == ["no-such-item", "12345"]
    assert sorted(x["item_id"] for x in body["items"]) == sorted([got[2], got[0], items[-1], got[2]])

    # the same history as columns: the same answers, the unknown ids named as sent
    cols = {"item_id": [x["item_id"] for x in h], "action": [x.get("action") for x in h]}
    r = client.post("/v1/recommend", json={"history_columns": cols, "k": 8})
    assert r.status_code == 200 and [x["item_id"] for x in r.json()["items"]] == got, r.text
    assert r.json()["dropped_items"] == ["no-such-item", "12345"]
    r = client.post("/v1/rank", json={"history_columns": cols, "candidates": cands})
    assert r.status_code == 200 and r.json()["items"] == body["items"], r.text

    # a cold start names its items by the log's ids too
    for path, extra in (("/v1/recommend", {"k": 3}), ("/v1/rank", {"candidates": [items[1], "x", items[0]]})):
        r = client.post(path, json={"history": [{"item_id": "nope"}], **extra})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["cold_start"] and body["dropped_items"] == ["nope"]
        assert {x["item_id"] for x in body["items"]} <= set(items) and len(body["items"]) in (2, 3)
    assert body["unknown_candidates"] == ["x"]


def test_a_source_id_is_text_and_nothing_else(client: httpx.Client) -> None:
    for bad in (True, 1.5, "", None, ["m3"], {"id": "m3"}):
        for path, body, field in (("/v1/recommend", {"history": [{"item_id": bad}]}, "history[0].item_id"),
                                  ("/v1/rank", {"history": [], "candidates": ["m3", bad]}, "candidates[1]")):
            r = client.post(path, json=body)
            assert r.status_code == 422 and r.json()["fields"] == [field], (bad, r.text)
    req = schemas.SourceIdRecommendRequest.model_validate({"history": [{"item_id": 17}, {"item_id": "m3"}]})
    assert req.history == [{"item_id": "17"}, {"item_id": "m3"}]
    with pytest.raises(ValidationError):  # a run whose ids were not remapped: strict integers, as before
        schemas.RecommendRequest.model_validate({"history": [{"item_id": "17"}]})


@pytest.mark.parametrize("fusion", [None, FUSED])
def test_rank_sorts_by_recommends_score(client: httpx.Client, string_id_run: Path, fusion: dict | None) -> None:
    """The items /v1/recommend returned (SID beams and ANN, the L1 score's every term with ``FUSED``), sent to
    /v1/rank in reverse: the same scores, so /v1/recommend's order; duplicates stay side by side."""
    items = log_items(string_id_run)
    h = [{"item_id": i} for i in items[2:9]]
    extra = {"beam_width": 4} if fusion is None else {"beam_width": 4, "fusion": fusion}  # 4 beams miss some of 10
    want = client.post("/v1/recommend", json={"history": h, "k": 10, **extra}).json()["items"]
    assert ["ann"] in [x["sources"] for x in want]  # an item the beams missed: its SID term is their floor
    ids = [x["item_id"] for x in want]
    r = client.post("/v1/rank", json={"history": h, "candidates": ids[::-1], **extra})
    assert r.status_code == 200, r.text
    got = r.json()["items"]
    assert [x["item_id"] for x in got] == ids
    np.testing.assert_allclose([x["score"] for x in got], [x["score"] for x in want], rtol=0, atol=1e-5)
    for a, b in zip(got, want):
        assert a["action_probs"] == pytest.approx(b["action_probs"], abs=1e-5)
    # the whole catalogue, each twice: sorted by score, ties (the copies) in the request's order
    r = client.post("/v1/rank", json={"history": h, "candidates": items + items[::-1], **extra})
    got = r.json()["items"]
    scores = [x["score"] for x in got]
    assert len(got) == 2 * len(items) and scores == sorted(scores, reverse=True)
    assert all(got[i]["item_id"] == got[i + 1]["item_id"] for i in range(0, len(got), 2))


def test_cold_start_scores_are_the_same_on_both_endpoints(client: httpx.Client, string_id_run: Path) -> None:
    """No known history item: both answer by popularity, ``score = 1 / (1 + place)``, the same for the same item."""
    items = log_items(string_id_run)
    cold = client.post("/v1/recommend", json={"history": [], "k": len(items)}).json()
    assert cold["cold_start"]
    by_place = {x["item_id"]: x["score"] for x in cold["items"]}
    assert [x["score"] for x in cold["items"]] == [1.0 / (1.0 + j) for j in range(len(cold["items"]))]
    cands = items[10:20][::-1]
    r = client.post("/v1/rank", json={"history": [{"item_id": "nope"}], "candidates": cands}).json()
    assert r["cold_start"] and [x["item_id"] for x in r["items"]] == sorted(cands, key=lambda i: -by_place[i])
    assert [x["score"] for x in r["items"]] == [by_place[x["item_id"]] for x in r["items"]]


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
ids_or_junk = st.one_of(st.text(max_size=12), st.integers(-(2 ** 70), 2 ** 70), st.booleans(), st.none(),
                        st.floats(allow_nan=False), st.lists(st.integers(), max_size=2))


@FUZZ
@given(hist=st.lists(ids_or_junk, max_size=6), cands=st.lists(ids_or_junk, max_size=6))
def test_any_ids_get_an_answer_or_a_422(client: httpx.Client, hist: list[Any], cands: list[Any]) -> None:
    for path, body in (("/v1/recommend", {"history": [{"item_id": i} for i in hist], "k": 3}),
                       ("/v1/rank", {"history": [{"item_id": i} for i in hist], "candidates": cands})):
        r = client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
        assert r.status_code in (200, 422), r.text
        if r.status_code == 200:
            out = r.json()
            sent = {str(i) for i in [*hist, *cands]}
            assert set(out["dropped_items"]) <= sent and set(out.get("unknown_candidates", [])) <= sent


# ---------------------------------------------------------------------------------------------- the schema
def _openapi(workdir: Path) -> dict[str, Any]:
    app = create_app(ServeConfig(workdir=workdir))  # not started: the schema needs no loaded model
    return TestClient(app).get("/openapi.json").json()


@pytest.mark.parametrize("source_ids", [False, True])
def test_openapi_documents_both_bodies(string_id_run: Path, tmp_path: Path, source_ids: bool) -> None:
    spec = _openapi(string_id_run if source_ids else tmp_path)
    comp = spec["components"]["schemas"]
    m = schemas.api_models(source_ids)
    for path, req, resp in (("/v1/recommend", m.recommend_request, m.recommend_response),
                            ("/v1/rank", m.rank_request, m.rank_response)):
        op = spec["paths"][path]["post"]
        assert op["description"] and op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/" + req.__name__)
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + resp.__name__)
        for model in (req, resp):
            examples = comp[model.__name__]["examples"]
            assert examples
            for ex in examples:  # every example is a valid body of its kind
                kinds = {type(i) for i in _item_ids(model.model_validate(ex).model_dump())}
                assert kinds == ({str} if source_ids else {int}), (model.__name__, ex)
    for name in ("RecommendedItem", "RankedItem", "RecommendResponse", "RankResponse"):
        name = f"SourceId{name}" if source_ids else name
        props = comp[name]["properties"]
        missing = [k for k, v in props.items()  # (a model-typed field: its model's description)
                   if not (v.get("description") or comp.get(v.get("$ref", "").rsplit("/", 1)[-1], {}).get("description"))]
        assert not missing, (name, missing)
    rec_score = comp[m.recommend_response.__name__.replace("Response", "edItem")]["properties"]["score"]["description"]
    rank_item = comp[m.rank_response.__name__.replace("Response", "edItem")]["properties"]
    for text in (rec_score, rank_item["score"]["description"]):
        assert "L1 score" in text and "1 / (1 + " in text and "same" in text, text
    assert "/v1/rank" in rec_score and "/v1/recommend" in rank_item["score"]["description"]
    assert "do not sum to 1" in rank_item["action_probs"]["description"]
    item_id = rank_item["item_id"]
    assert item_id["type"] == ("string" if source_ids else "integer")
    assert ("source file" in item_id["description"]) == source_ids


def _item_ids(body: dict[str, Any]) -> list[Any]:
    if "candidates" in body or "history" in body:
        return [h["item_id"] for h in body["history"]] + list(body.get("candidates", []))
    return ([x["item_id"] for x in body["items"]] + body["dropped_items"] + body.get("unknown_candidates", []))


def test_the_load_generator_sends_the_logs_ids(client: httpx.Client, string_id_run: Path) -> None:
    """`genrec bench serve` on such a run sends what a client would: the log's ids (the tables' numbers would all
    be unknown there, and every request a cold start)."""
    from genrec.serve.loadgen import as_sent, sample_histories

    hists = as_sent(string_id_run, sample_histories(string_id_run, 4, 6, seed=1))
    assert all(isinstance(i, str) for h in hists for i in h) and {i for h in hists for i in h} <= set(
        log_items(string_id_run))
    for h in hists:
        body = client.post("/v1/recommend", json={"history": [{"item_id": i} for i in h], "k": 3}).json()
        assert not body["cold_start"] and body["dropped_items"] == []
