"""``genrec serve --fronts 2``, a real server process with two front processes: the answers are the one-process
server's (alone and under concurrent load, events and columns, /v1/rank too), its 4xx are the same, every other path
reaches the engine's app, /metrics counts what the fronts answered, a killed front is replaced, and a dead engine
takes its fronts with it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from genrec.serve.app import create_app
from genrec.serve.config import ServeConfig
from genrec.serve.engine import InputError
from genrec.serve.fronts import portable
from genrec.serve.loadgen import start_server
from genrec.serve.loadtest import stop_server

from ._load import Load

HISTS = [[1, 50, 172, 181, 258], [7, 9, 11], [300, 301, 302, 303, 304, 305, 306, 307], [12], [100, 98, 56, 22]]


def is_front(pid: int) -> bool:
    """``pid`` runs a front: a process multiprocessing spawned (``spawn_main``), not its resource tracker (also a
    child of the engine) nor a child that has not yet exec'd (its command line is still the engine's: under load
    the tracker was once taken for a front there, and killed)."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def children(pid: int) -> set[int]:
    """``pid``'s child processes (Linux /proc)."""
    out: set[int] = set()
    for t in Path(f"/proc/{pid}/task").iterdir():
        with open(t / "children") as f:
            out |= {int(x) for x in f.read().split()}
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def fronts(run_dir: Path):
    proc, url = start_server(run_dir, fronts=2, threads=2, torch_threads=1)
    try:
        yield proc, url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def one(run_dir: Path):
    """The one-process app, in this process: the answers to match."""
    with TestClient(create_app(ServeConfig(workdir=run_dir, threads=2))) as c:
        yield c


def body(ids: list[int], **kw: object) -> dict:
    return {"history": [{"item_id": i} for i in ids], "k": 6, "beam_width": 10, **kw}


def same(got: dict, want: dict) -> None:
    assert [x["item_id"] for x in got["items"]] == [x["item_id"] for x in want["items"]]
    np.testing.assert_allclose([x["score"] for x in got["items"]], [x["score"] for x in want["items"]], rtol=0,
                               atol=1e-5)
    for k in ("dropped_items", "truncated_items", "cold_start", "degraded", "index_version"):
        assert got.get(k) == want.get(k), k


def test_the_answers_are_one_process_answers(fronts: tuple, one: TestClient) -> None:
    _, url = fronts
    with httpx.Client(base_url=url, timeout=60) as c:
        for ids in HISTS + [[999999, 5]]:  # the last: an unknown item dropped
            want = one.post("/v1/recommend", json=body(ids)).json()
            same(c.post("/v1/recommend", json=body(ids)).json(), want)
            cols = {"history_columns": {"item_id": ids}, "k": 6, "beam_width": 10}
            same(c.post("/v1/recommend", json=cols).json(), want)
            rb = {"history": body(ids)["history"], "candidates": [3, 1, 2, 999999]}
            r, w = c.post("/v1/rank", json=rb), one.post("/v1/rank", json=rb)
            assert r.status_code == w.status_code == 200, r.text
            assert [x["item_id"] for x in r.json()["items"]] == [x["item_id"] for x in w.json()["items"]]
            assert r.json()["unknown_candidates"] == w.json()["unknown_candidates"] == [999999]


def test_concurrent_requests_from_both_fronts(fronts: tuple, one: TestClient) -> None:
    _, url = fronts
    want = {tuple(h): one.post("/v1/recommend", json=body(h)).json() for h in HISTS}
    load = Load(url, 8, lambda i, j: body(HISTS[(i + j) % len(HISTS)]), per_client=5, timeout=120)
    with load:
        load.join(300)
    load.check(allowed={"200"})
    for r in load.replies:
        same(r.body, want[tuple(HISTS[(r.client + r.n) % len(HISTS)])])


def test_errors_are_the_one_process_errors(fronts: tuple, one: TestClient) -> None:
    _, url = fronts
    bad = [body([1, 2]) | {"beam_witdh": 3},  # validated in the front
           {"history": [{"item_id": 1}, {"item_id": 2, "action": "no-such-action"}]},  # refused by the engine
           {"history": [{"item_id": "x"}]}]
    with httpx.Client(base_url=url, timeout=60) as c:
        for b in bad:
            r, w = c.post("/v1/recommend", json=b), one.post("/v1/recommend", json=b)
            assert r.status_code == w.status_code == 422, (r.text, w.text)
            assert r.json() == w.json()
        r = c.post("/v1/recommend", content=b"x" * (2 << 20), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["fields"] == ["body"]
        r = c.post("/v1/recommend", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["fields"] == ["body"]


def test_other_paths_reach_the_engine(fronts: tuple) -> None:
    _, url = fronts
    with httpx.Client(base_url=url, timeout=60) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        spec = c.get("/openapi.json").json()
        assert {"/v1/recommend", "/v1/rank", "/readyz", "/admin/reload"} <= set(spec["paths"])
        assert c.get("/no/such/path").status_code == 404
        r = c.post("/admin/reload")
        assert r.status_code == 200 and r.json()["version"] == ready.json()["index_version"], r.text
        assert "<html" in c.get("/").text.lower()


def test_metrics_count_what_the_fronts_answered(fronts: tuple) -> None:
    _, url = fronts

    def count(text: str, endpoint: str, status: str) -> float:
        line = f'genrec_requests_total{{endpoint="{endpoint}",status="{status}"}} '
        return sum(float(x[len(line):]) for x in text.splitlines() if x.startswith(line))

    with httpx.Client(base_url=url, timeout=60) as c:
        time.sleep(1.5)  # the fronts send their counts every half second: the earlier tests' are in
        before = c.get("/metrics").text
        for _ in range(3):
            assert c.post("/v1/recommend", json=body([1, 2, 3])).status_code == 200
        assert c.post("/v1/recommend", json={"k": 0, "history": []}).status_code == 422
        time.sleep(1.5)  # the fronts send their counts every half second
        after = c.get("/metrics").text
    assert count(after, "/v1/recommend", "200") - count(before, "/v1/recommend", "200") == 3
    assert count(after, "/v1/recommend", "422") - count(before, "/v1/recommend", "422") == 1
    assert count(after, "/metrics", "200") - count(before, "/metrics", "200") == 1  # counted once, by the engine
    assert 'genrec_stage_latency_ms_count{endpoint="recommend",stage="total"}' in after


def test_a_killed_front_is_replaced(run_dir: Path) -> None:
    proc, url = start_server(run_dir, fronts=2, threads=2, torch_threads=1)
    try:
        t_end = time.time() + 60  # ready once one front answers; on a loaded machine the second may still start
        while True:
            first = children(proc.pid)
            fronts = [p for p in first if alive(p) and is_front(p)]
            if len(fronts) >= 2 or time.time() > t_end:
                break
            time.sleep(0.2)
        assert len(fronts) >= 2, f"fronts: {fronts}"
        victim = max(fronts)
        os.kill(victim, signal.SIGKILL)
        with httpx.Client(base_url=url, timeout=60) as c:
            for _ in range(6):  # the other front answers meanwhile
                assert c.post("/v1/recommend", json=body([1, 2])).status_code == 200
        t_end = time.time() + 120
        while time.time() < t_end and not (children(proc.pid) - first):
            time.sleep(0.2)
        assert children(proc.pid) - first, "no new front process"
        fronts_now = children(proc.pid)
        proc.kill()  # the engine dies: its fronts stop too (their link is closed)
        proc.wait(30)
        t_end = time.time() + 60
        while time.time() < t_end and any(alive(p) for p in fronts_now):
            time.sleep(0.2)
        assert not any(alive(p) for p in fronts_now), "front processes outlived the engine"
    finally:
        stop_server(proc)


def test_errors_travel_whole() -> None:
    e = portable(InputError("unknown action 'x'", "history[1].action"))
    assert isinstance(e, InputError) and e.field == "history[1].action" and str(e).startswith("history[1].action: ")

    class Local(Exception):  # not importable by name: travels as its type's name and text
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}+{b}")

    e2 = portable(Local(1, 2))
    assert type(e2) is RuntimeError and str(e2) == "Local: 1+2"


def test_a_front_that_keeps_dying_is_not_restarted_in_a_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import uvicorn

    from genrec.serve import fronts as fr

    class Dead:  # a front process that exited at once
        pid, exitcode = 0, 1

        def is_alive(self) -> bool:
            return False

    monkeypatch.setattr(fr, "RESTARTS_PER_WINDOW", 2)
    srv = fr.EngineServer(uvicorn.Config(app=None), service=None, fronts=1, host="127.0.0.1", port=0,
                          front_args={}, link_dir="/nonexistent", say=None)
    spawned: list[Dead] = []
    srv.procs = [Dead()]
    monkeypatch.setattr(srv, "_spawn", lambda: spawned.append(Dead()) or spawned[-1])
    t = threading.Thread(target=srv._supervise, daemon=True)
    t.start()
    time.sleep(3.0)  # six polls: two restarts, then none until the minute is over
    srv._stopping.set()
    t.join(5)
    assert len(spawned) == 2 and srv.restarts == 2


def test_an_answer_that_does_not_pickle_is_an_error_not_a_hang(tmp_path: Path) -> None:
    """The engine's link, driven by a front's link in this process: an answer that cannot travel comes back as an
    error; one that can, as itself."""
    import asyncio

    from genrec.serve.fronts import EngineLink, FrontLink
    from genrec.serve.middleware import Metrics

    def serve(op: str, req: Any) -> dict[str, Any]:
        return {"ok": req} if req != "lambda" else {"bad": lambda: None}

    key = b"k" * 32
    link = EngineLink(serve, Metrics(), str(tmp_path / "link.sock"), key, threads=2).start()
    try:
        front = FrontLink(str(tmp_path / "link.sock"), key)

        async def both() -> tuple[Any, Any]:
            good = await asyncio.wait_for(front.call("recommend", "x"), 10)
            try:
                await asyncio.wait_for(front.call("recommend", "lambda"), 10)
            except RuntimeError as e:
                return good, str(e)
            return good, None

        good, bad = asyncio.run(both())
        assert good == {"ok": "x"}
        assert bad is not None and "could not be sent" in bad
    finally:
        link.close()


@pytest.mark.parametrize("two_process", [False, True])
def test_requests_taken_without_a_thread_answer_as_infer(run_dir: Path, two_process: bool) -> None:
    """What the engine of ``--fronts`` does with a front's request (``Service.submit_nowait``): concurrent recommend
    requests join the micro-batcher from the caller's thread and are answered through ``done`` exactly as
    ``Service.infer`` answers them, stage timings in /metrics included (in two-process mode ranked by the ranking
    process, batch by batch, not degraded); explained requests, /v1/rank and bad requests are not taken (a thread
    runs them), or come back as their error."""
    import threading

    from genrec.infer.cases import SourceIds
    from genrec.serve.schemas import api_models
    from genrec.serve.service import Service

    svc = Service(ServeConfig(workdir=run_dir, threads=2, two_process=two_process, rank_timeout_s=10.0))
    svc.start()
    try:
        models = api_models(SourceIds.remapped(run_dir))
        reqs = [models.recommend_request.model_validate(body(h)) for h in HISTS * 4]
        want = [svc.infer("recommend", r) for r in reqs]

        def observed() -> float:
            return sum(x.value for fam in svc.metrics.stage.collect() for x in fam.samples if x.name.endswith(
                "_count") and x.labels == {"endpoint": "recommend", "stage": "total"})

        n0 = observed()
        got: dict[int, tuple[bool, Any]] = {}
        all_in = threading.Event()

        def done_for(i: int) -> Any:
            def done(ok: bool, val: Any) -> None:
                got[i] = (ok, val)
                if len(got) == len(reqs):
                    all_in.set()
            return done

        b0, calls0 = svc.batcher.batches, svc.ranker.rank_calls if two_process else 0
        assert all(svc.submit_nowait("recommend", r, done_for(i)) for i, r in enumerate(reqs))
        assert all_in.wait(60)
        assert svc.batcher.batches - b0 < len(reqs)  # they were batched
        if two_process:  # ... and ranked there, a call per batch
            assert 0 < svc.ranker.rank_calls - calls0 <= svc.batcher.batches - b0
            assert not any(out["degraded"] for _, out in got.values())
        assert observed() - n0 == len(reqs)
        for i, w in enumerate(want):
            ok, out = got[i]
            assert ok, out
            same(out, w)
            assert out["timings_ms"].keys() == w["timings_ms"].keys()
        assert not svc.submit_nowait("recommend", models.recommend_request.model_validate(
            body(HISTS[0], explain=True)), done_for(-1))
        rank = models.rank_request.model_validate({"history": body(HISTS[0])["history"], "candidates": [3, 1]})
        assert not svc.submit_nowait("rank", rank, done_for(-1))
        bad = models.recommend_request.model_validate({"history": [{"item_id": 1, "action": "no-such-action"}]})
        errs: list[Any] = []
        assert svc.submit_nowait("recommend", bad, lambda ok, v: errs.append((ok, v)))
        t_end = time.time() + 30
        while not errs and time.time() < t_end:
            time.sleep(0.01)
        assert errs and errs[0][0] is False and isinstance(errs[0][1], InputError)
    finally:
        svc.stop()


def test_a_front_sends_integer_columns_as_one_array(run_dir: Path) -> None:
    """``compact``: history_columns of integer ids travel as one int64 array (unpickled and parsed at once: 10 against
    46 us for 1,000 ids on the CPU box; the answers through the fronts above are the one-process answers); events
    and explained requests travel as they came."""
    import pickle

    from genrec.infer.cases import SourceIds
    from genrec.serve.front_app import compact
    from genrec.serve.schemas import api_models

    m = api_models(SourceIds.remapped(run_dir)).recommend_request
    ids = list(range(1, 1001))
    req = m.model_validate({"history_columns": {"item_id": ids}, "k": 5})
    c = compact("recommend", req)
    assert isinstance(c.history_columns.item_id, np.ndarray) and c.history_columns.item_id.tolist() == ids
    assert c.k == 5 and req.history_columns.item_id == ids  # the request itself unchanged
    h = pickle.loads(pickle.dumps(c)).the_history()
    assert np.asarray(h.item_id).dtype == np.int64 and len(h) == 1000
    for same_req in (m.model_validate(body([1, 2])), m.model_validate({"history_columns": {"item_id": [1, 2]},
                                                                          "explain": True})):
        assert compact("recommend", same_req) is same_req


def test_a_front_freezes_its_heap_unless_told_not_to() -> None:
    """freeze_front_heap (what a front does once its app is built): its objects leave the cyclic GC's sight, as the
    engine's bundle does; ``gc_freeze`` off leaves them."""
    import gc

    from genrec.serve.fronts import freeze_front_heap

    was = gc.get_freeze_count()
    gc.unfreeze()
    try:
        assert freeze_front_heap({"gc_freeze": False}) is False and gc.get_freeze_count() == 0
        assert freeze_front_heap({}) is True and gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
        if was:
            gc.freeze()


def test_the_heap_is_frozen_again_once_after_the_first_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refreeze (the engine's answers and each front's requests tick it): one more freeze_heap at the ``after``-th
    tick, from whichever of many threads gives it, never again, and never with ``gc_freeze`` off."""
    import genrec.serve.service as service

    calls: list[int] = []
    monkeypatch.setattr(service, "freeze_heap", lambda: calls.append(1))
    r = service.Refreeze(True, after=500)
    ts = [threading.Thread(target=lambda: [r.tick() for _ in range(100)]) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert calls == [1]
    off = service.Refreeze(False, after=1)
    for _ in range(3):
        off.tick()
    assert calls == [1]
