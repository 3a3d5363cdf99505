"""The per-request overhead cuts keep the service's behaviour: the pure-ASGI request tracking
(counter + in-flight gauge on /metrics), the TypedDict history items (same validation errors as the
old pydantic model, plain dicts to the engine, optional keys honoured), the GC freeze, and the
uvicorn implementation choice."""

from __future__ import annotations

import asyncio
import json
import gc
import re
from pathlib import Path
from typing import Any, Optional

import httpx
import numpy as np
import pytest
from pydantic import BaseModel, Field, StrictInt, ValidationError

from genrec.serve import service as service_mod
from genrec.serve.app import uvicorn_impl
from genrec.serve.config import ServeConfig
from genrec.serve.middleware import Metrics, Track
from genrec.serve.schemas import INT64, ItemId, RecommendRequest, Vocab, _Strict

from ._server import ServerThread, http_client, serving


@pytest.fixture(scope="module")
def server(run_dir: Path):
    yield from serving(ServeConfig(workdir=run_dir))


@pytest.fixture(scope="module")
def client(server: ServerThread):
    yield from http_client(server)


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([a-z_]+)(\{(.*)\})? (\S+)$", line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if got == labels:
            return float(m.group(4))
    return 0.0


def test_tracking_counts_requests_and_in_flight(client: httpx.Client) -> None:
    before = client.get("/metrics").text
    ok = {"history": [{"item_id": 1}, {"item_id": 50}], "k": 3}
    for _ in range(3):
        assert client.post("/v1/recommend", json=ok).status_code == 200
    assert client.post("/v1/recommend", json={"history": [{"item_id": 1}], "k": 0}).status_code == 422
    assert client.get("/no-such-route").status_code == 404
    after = client.get("/metrics").text

    def delta(**labels: str) -> float:
        return _metric(after, "genrec_requests_total", **labels) - _metric(before, "genrec_requests_total", **labels)

    assert delta(endpoint="/v1/recommend", status="200") == 3
    assert delta(endpoint="/v1/recommend", status="422") == 1
    assert delta(endpoint="other", status="404") == 1  # any path that is no route: one series (bounded)
    assert delta(endpoint="/metrics", status="200") == 1  # the first scrape, counted once it answered
    assert _metric(after, "genrec_in_flight_requests") == 1  # the scrape itself is in flight


def test_track_gauge_during_request_and_500_on_crash() -> None:
    m = Metrics()
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(scope: dict, receive: Any, send: Any) -> None:
        started.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def crash(scope: dict, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def noop_send(msg: dict) -> None:
        pass

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    paths = lambda: {"/x", "/y"}  # noqa: E731 - the app's routes

    async def main() -> None:
        scope = {"type": "http", "path": "/x", "headers": []}
        task = asyncio.create_task(Track(slow, m, paths)(scope, receive, noop_send))
        await started.wait()
        assert m.in_flight._value.get() == 1
        release.set()
        await task
        assert m.in_flight._value.get() == 0
        with pytest.raises(RuntimeError):
            await Track(crash, m, paths)({"type": "http", "path": "/y", "headers": []}, receive, noop_send)
        assert m.in_flight._value.get() == 0
        await Track(slow, m, paths)({"type": "lifespan"}, receive, noop_send)  # not http: passed through, not counted

    asyncio.run(main())
    assert m.requests.labels(endpoint="/x", status="201")._value.get() == 1
    assert m.requests.labels(endpoint="/y", status="500")._value.get() == 1


class _OldHistoryItem(_Strict):
    """HistoryItem as it was (a BaseModel, model_dump-ed per item): the reference for errors."""

    item_id: ItemId = Field(ge=-INT64, le=INT64)
    action: Vocab = None
    surface: Vocab = None
    ts: Optional[StrictInt] = Field(default=None, ge=-INT64, le=INT64)


class _OldRequest(RecommendRequest):
    history: list[_OldHistoryItem] = Field(max_length=10_000)  # type: ignore[assignment]


def _errors(cls: type[BaseModel], payload: dict) -> Any:
    try:
        cls.model_validate(payload)
    except ValidationError as e:
        return [(x["type"], x["loc"], x["msg"]) for x in e.errors()]
    return "ok"


BAD_ITEMS = [{}, {"item_id": True}, {"item_id": "12"}, {"item_id": 1.5}, {"item_id": 2 ** 64}, {"item_id": 1, "x": 2},
             {"item_id": 1, "action": 1.5}, {"item_id": 1, "action": True}, {"item_id": 1, "ts": "3"},
             {"item_id": 1, "ts": 2 ** 63}, {"item_id": 1, "surface": []}, {"item_id": float("nan")},
             {"item_id": 1, "action": None, "surface": None, "ts": None},
             {"item_id": 7, "action": "like", "surface": 0, "ts": 12}]


@pytest.mark.parametrize("item", BAD_ITEMS)
def test_history_item_validation_unchanged(item: dict) -> None:
    payload = {"history": [{"item_id": 1}, item]}
    assert _errors(RecommendRequest, payload) == _errors(_OldRequest, payload)


def test_non_object_history_item_is_still_a_422_naming_it() -> None:
    # the one wording change: pydantic's TypedDict says "a valid dictionary" (the model also named its class)
    for bad in (5, "x", None, [1]):
        errs = _errors(RecommendRequest, {"history": [{"item_id": 1}, bad]})
        assert errs == [("dict_type", ("history", 1), "Input should be a valid dictionary")]


def test_history_reaches_engine_as_plain_dicts() -> None:
    req = RecommendRequest.model_validate({"history": [{"item_id": 3}, {"item_id": 4, "action": "like", "ts": None}]})
    assert req.history == [{"item_id": 3}, {"item_id": 4, "action": "like", "ts": None}]
    assert all(type(h) is dict for h in req.history)  # what the Recommender's columnar fast path takes
    old = _OldRequest.model_validate({"history": [{"item_id": 3}, {"item_id": 4, "action": "like", "ts": None}]})
    for new_h, old_h in zip(req.history, old.history):  # same values the engine read from model_dump before
        assert {k: new_h.get(k) for k in ("item_id", "action", "surface", "ts")} == old_h.model_dump()


def test_recommend_with_every_history_field_equals_recommender(server: ServerThread, client: httpx.Client) -> None:
    rec = server.service.holder.current.engine.rec
    h = [{"item_id": 1, "action": rec.actions[-1], "surface": 0, "ts": 1000},
         {"item_id": 50, "action": 0, "ts": 2000}, {"item_id": 172}, {"item_id": 181, "surface": rec.surfaces[0]},
         {"item_id": 99999999, "action": rec.actions[0]}]
    params = dict(k=6, beam_width=10, rank=True, request_ts=5000)
    r = client.post("/v1/recommend", json={"history": h, **params})
    assert r.status_code == 200, r.text
    body = r.json()
    want = rec.recommend(h, **params)
    assert [x["item_id"] for x in body["items"]] == [x.item_id for x in want]
    np.testing.assert_allclose([x["score"] for x in body["items"]], [x.score for x in want], rtol=0, atol=1e-6)
    assert body["dropped_items"] == [99999999]
    r = client.post("/v1/rank", json={"history": h, "candidates": [2, 3, 4]})
    assert r.status_code == 200 and sorted(x["item_id"] for x in r.json()["items"]) == [2, 3, 4], r.text
    ranked = rec.rank_items(h, [2, 3, 4])  # best first, as the Recommender ranks them
    assert [x["item_id"] for x in r.json()["items"]] == [x.item_id for x in ranked]


def _columns(h: list[dict]) -> dict[str, list]:
    return {k: [e.get(k) for e in h] for k in ("item_id", "action", "surface", "ts")}


def test_history_columns_answer_as_the_events(server: ServerThread, client: httpx.Client) -> None:
    """``history_columns`` (one list per field) gets the answer the same events get as ``history``, on both
    endpoints, batched or not; a column of the wrong length, both forms or neither is a 422 naming the field."""
    rec = server.service.holder.current.engine.rec
    h = [{"item_id": 1, "action": rec.actions[-1], "surface": 0, "ts": 1000},
         {"item_id": 50, "action": 0, "ts": 2000}, {"item_id": 172}, {"item_id": 181, "surface": rec.surfaces[0]},
         {"item_id": 99999999, "action": rec.actions[0]}]
    params = dict(k=6, beam_width=10, rank=True, request_ts=5000)
    want = client.post("/v1/recommend", json={"history": h, **params}).json()
    for cols in (_columns(h), {"item_id": [e["item_id"] for e in h]}):
        got = client.post("/v1/recommend", json={"history_columns": cols, **params})
        assert got.status_code == 200, got.text
        if len(cols) == 4:  # every field: the same answer to the last digit
            assert {k: v for k, v in got.json().items() if k != "timings_ms"} == \
                {k: v for k, v in want.items() if k != "timings_ms"}
        else:  # ids alone: what the events without their fields get
            bare = client.post("/v1/recommend", json={"history": [{"item_id": e["item_id"]} for e in h], **params})
            assert [x["item_id"] for x in got.json()["items"]] == [x["item_id"] for x in bare.json()["items"]]
    ex = [client.post("/v1/recommend", json={**body, "k": 3, "explain": True}).json()["explain"]
          for body in ({"history": h}, {"history_columns": _columns(h)})]
    assert ex[0] == ex[1] and len(ex[0]["history"]) == len(h)  # the explain block reads the columns' events
    r = client.post("/v1/rank", json={"history_columns": _columns(h), "candidates": [2, 3, 4]})
    r0 = client.post("/v1/rank", json={"history": h, "candidates": [2, 3, 4]})
    assert r.status_code == 200 and r.json()["items"] == r0.json()["items"], r.text
    batched = server.service.batcher is not None and server.service.batcher.max_batch > 1
    assert batched  # the default configuration micro-batches: the columns went through recommend_many
    cold = client.post("/v1/recommend", json={"history_columns": {"item_id": [99999998]}, "k": 3}).json()
    assert cold["cold_start"] and cold["dropped_items"] == [99999998]
    bad = {"action": {"history_columns": {"item_id": [1, 50], "action": ["like"]}},
           "both": {"history": h, "history_columns": _columns(h)}, "neither": {},
           "name": {"history_columns": {"item_id": [1, 50], "action": [rec.actions[0], "no-such-action"]}},
           "type": {"history_columns": {"item_id": [1, "50"]}}}
    fields = {"action": ["history_columns"], "both": ["history"], "neither": ["history"],
              "name": ["history_columns.action[1]"], "type": ["history_columns.item_id[1]"]}
    for what, body in bad.items():
        for path in ("/v1/recommend", "/v1/rank"):
            r = client.post(path, json={**body, **({"candidates": [2]} if path == "/v1/rank" else {})})
            assert r.status_code == 422 and r.json()["fields"] == fields[what], (what, path, r.text)


def _outcome(fn: Any) -> Any:
    try:
        return fn().model_dump()
    except ValidationError as e:
        return sorted((err["type"], err["loc"]) for err in e.errors())


def test_body_read_in_one_pass_validates_as_fastapi_did() -> None:
    """The routes validate the body straight from its bytes (``model_validate_json``); FastAPI's own path was
    ``json.loads`` and then ``model_validate``: on generated bodies (valid, near-valid, junk) both give the same
    request or fail at the same fields with the same error kinds."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from genrec.serve.schemas import RankRequest, SourceIdRecommendRequest

    value = st.recursive(st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70)
                         | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=4), max_leaves=12)
    event = st.fixed_dictionaries({"item_id": st.one_of(st.integers(-3, 2 ** 64), st.text(max_size=3), value)},
                                  optional={"action": value, "surface": value, "ts": value})
    body = st.fixed_dictionaries({}, optional={
        "history": st.one_of(st.lists(event, max_size=4), value),
        "history_columns": st.one_of(st.fixed_dictionaries({"item_id": st.lists(st.integers(0, 9), max_size=3)},
                                                           optional={"action": value, "ts": value}), value),
        "candidates": st.one_of(st.lists(st.integers(0, 9), max_size=3), value), "k": value, "rank": value,
        "fusion": value, "beam_width": value, "extra": value})

    @settings(max_examples=300, deadline=None)
    @given(body)
    def check(b: dict) -> None:
        raw = json.dumps(b)
        for model in (RecommendRequest, RankRequest, SourceIdRecommendRequest):
            assert _outcome(lambda: model.model_validate_json(raw)) == \
                _outcome(lambda: model.model_validate(json.loads(raw))), (model.__name__, raw)

    check()


def test_body_that_is_not_json_is_a_422_naming_the_body(client: httpx.Client) -> None:
    ok = json.dumps({"history": [{"item_id": 1}], "k": 2}).encode()
    for headers, raw in (({}, ok), ({"content-type": "text/plain"}, ok), ({"content-type": "application/json"}, b""),
                         ({"content-type": "application/json"}, b"[1]"), ({"content-type": "application/json"}, b"{"),
                         ({"content-type": "application/json"}, '{"history": "\u00e9"}'.encode("latin-1"))):
        for path in ("/v1/recommend", "/v1/rank"):
            r = client.post(path, content=raw, headers=headers)
            assert r.status_code == 422 and r.json()["fields"] == ["body"] and r.json()["message"], (headers, raw)
    for ctype in ("application/json; charset=utf-8", "application/vnd.genrec+json"):
        assert client.post("/v1/recommend", content=ok, headers={"content-type": ctype}).status_code == 200


def test_heap_frozen_while_serving(server: ServerThread) -> None:
    assert server.service.cfg.gc_freeze
    assert gc.get_freeze_count() > 0
    service_mod.thaw_and_freeze()  # what a hot swap runs
    assert gc.get_freeze_count() > 0


def test_uvicorn_impl_falls_back_to_pure_python(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("httptools", "uvloop") else real(name, *a))
    assert uvicorn_impl() == {"http": "h11", "loop": "asyncio"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert uvicorn_impl() == {"http": "httptools", "loop": "uvloop"}


def test_engine_hands_plain_histories_on_as_bare_ids(server: ServerThread) -> None:
    """Plain ``{"item_id": int}`` items reach the Recommender as bare ids (its faster parse path; the engine's
    first look is the Recommender's own, HistoryParser.screen); anything else unchanged; the answer equals the
    Recommender's on the dicts (dropped, truncated)."""
    eng = server.service.holder.current.engine
    dropped, known, plain = eng.rec.history.screen([{"item_id": 1}, {"item_id": 99999999}, {"item_id": 50}])
    assert plain == [1, 99999999, 50] and dropped == [99999999] and known
    for other in ([{"item_id": 1, "ts": 5}, {"item_id": 50}], [{"item_id": True}], [{"item_id": 1}, {"item_id": 2.0}]):
        assert eng.rec.history.screen(other)[2] is other
    assert eng.rec.history.screen([]) == ([], False, [])  # a cold start
    assert eng.rec.history.screen([{"item_id": 99999998}]) == ([99999998], False, [99999998])
    h = [{"item_id": i} for i in range(1, eng.context_len + 8)] + [{"item_id": 99999999}]
    got = eng.recommend(h, k=5, beam_width=8, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    want = eng.rec.recommend(h, k=5, beam_width=8, sources=["sid", "ann"], rank=True)
    assert [x["item_id"] for x in got["items"]] == [x.item_id for x in want]
    np.testing.assert_allclose([x["score"] for x in got["items"]], [x.score for x in want], rtol=0, atol=1e-6)
    assert got["dropped_items"] == want.dropped_items == [99999999]
    assert got["truncated_items"] == want.history_truncated == 7
    many = eng.recommend_many([h, [{"item_id": 99999997}], h[:3]], k=5, beam_width=8, diversity_lambda=0.0,
                              sources=["sid", "ann"], rank=True)
    assert [x["item_id"] for x in many[0]["items"]] == [x["item_id"] for x in got["items"]]
    assert many[1]["cold_start"] and many[1]["dropped_items"] == [99999997] and not many[2].get("cold_start")
