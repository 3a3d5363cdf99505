"""Micro-batching: grouping by key, failure isolation, the busy policy's hand-over (no timer, no
lost / duplicated / misrouted rows, no hang), and batched HTTP answers == solo answers."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.errors import ConfigError
from genrec.serve.app import create_app
from genrec.serve.config import ServeConfig
from genrec.serve.batcher import MicroBatcher
from genrec.serve.loadtest import batch_counts

from ._server import ServerThread


def _start(target: Callable[..., None], *args: Any) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def _join_all(ts: list[threading.Thread], timeout: float) -> None:
    t_end = time.monotonic() + timeout
    for t in ts:
        t.join(max(0.0, t_end - time.monotonic()))
    assert not any(t.is_alive() for t in ts), "a request thread hung"


def _wait_pending(b: MicroBatcher, n: int, timeout: float = 10.0) -> None:
    """Until ``n`` requests are queued behind the running batch (busy policy)."""
    t_end = time.monotonic() + timeout
    while len(b._pending) < n:
        assert time.monotonic() < t_end, f"only {len(b._pending)} of {n} requests queued"
        time.sleep(0.001)


class Gated:
    """``fn`` whose FIRST call blocks until ``release()``: the batcher is busy while later requests
    queue. Records every call's items; ``x < 0`` fails (a batch holding one fails as a whole)."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.lock = threading.Lock()

    def release(self) -> None:
        self.gate.set()

    def __call__(self, items):  # noqa: ANN001, ANN204
        with self.lock:
            first = not self.calls
            self.calls.append(list(items))
        if first:
            self.entered.set()
            assert self.gate.wait(10)
        if any(isinstance(i, int) and i < 0 for i in items):
            raise ValueError(f"bad {items[0]}" if len(items) == 1 else "batch has a bad row")
        return [i * 10 for i in items]


@pytest.mark.parametrize("policy", ["busy", "timed"])
def test_groups_by_key_and_isolates_failures(policy: str) -> None:
    b = MicroBatcher(max_batch=4, max_wait_ms=50, policy=policy)
    calls: list[list[int]] = []
    lock = threading.Lock()

    def fn(items):  # noqa: ANN001, ANN202
        with lock:
            calls.append(list(items))
        time.sleep(0.02)  # long enough for later requests to queue behind a running batch
        if any(i < 0 for i in items):
            if len(items) == 1:
                raise ValueError(f"bad {items[0]}")
            raise ValueError("batch has a bad row")
        return [i * 10 for i in items]

    out: dict[int, object] = {}
    go = threading.Barrier(8)  # all 8 submit together, however slowly the threads start

    def run(i: int) -> None:
        go.wait(10)
        try:
            out[i] = b.submit(i % 2, i if i != 5 else -5, fn)
        except ValueError as e:
            out[i] = str(e)

    ts = [_start(run, i) for i in range(8)]
    _join_all(ts, 10)
    assert {i: out[i] for i in range(8) if i != 5} == {i: i * 10 for i in range(8) if i != 5}
    assert out[5] == "bad -5"  # only the bad request fails
    for c in calls:  # a batch never mixes keys
        assert len({abs(i) % 2 for i in c}) == 1
    assert max(len(c) for c in calls) > 1  # something was actually batched


def test_busy_many_threads_random_keys() -> None:
    """48 threads x 25 requests, 3 keys, random pauses: every answer is fn of its own item, every item
    is computed exactly once, batches are single-key and at most max_batch, only one batch runs at a
    time, and every thread finishes (no hang)."""
    b = MicroBatcher(max_batch=5, policy="busy")
    calls: list[tuple[Any, list[tuple[int, int]]]] = []
    lock = threading.Lock()
    running = [0]
    overlap = [0]

    def make_fn(key: int) -> Callable[[list[tuple[int, int]]], list[tuple[int, int, int]]]:
        def fn(items):  # noqa: ANN001, ANN202
            with lock:
                running[0] += 1
                overlap[0] = max(overlap[0], running[0])
                calls.append((key, list(items)))
            time.sleep(random.random() * 0.002)
            with lock:
                running[0] -= 1
            return [(key, t, j * 3) for t, j in items]
        return fn

    bad: list[str] = []
    n_threads, n_req = 48, 25

    def client(t: int) -> None:
        rng = random.Random(t)
        for j in range(n_req):
            key = rng.randrange(3)
            got = b.submit(key, (t, j), make_fn(key))
            if got != (key, t, j * 3):
                bad.append(f"thread {t} request {j} key {key}: got {got}")
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.001)

    ts = [_start(client, t) for t in range(n_threads)]
    _join_all(ts, 60)
    assert not bad, bad[:3]
    done = [it for _, items in calls for it in items]
    assert sorted(done) == sorted((t, j) for t in range(n_threads) for j in range(n_req))  # none lost or twice
    assert all(1 <= len(items) <= 5 for _, items in calls)
    assert b.items == n_threads * n_req and b.batches == len(calls)
    assert overlap[0] == 1  # one batch at a time
    assert max(len(items) for _, items in calls) > 1  # under this load batches did form
    assert not b._pending and not b._busy  # idle again


def test_busy_lone_request_does_not_wait() -> None:
    """An idle batcher runs a request at once, alone (the timed policy waits its 2 ms first)."""
    def lag(policy: str) -> float:
        b = MicroBatcher(max_batch=8, max_wait_ms=2.0, policy=policy)
        lags, sizes = [], []
        for i in range(30):
            t0 = time.perf_counter()

            def fn(items, t0=t0):  # noqa: ANN001, ANN202
                lags.append(time.perf_counter() - t0)
                sizes.append(len(items))
                return list(items)

            assert b.submit("k", i, fn) == i
        assert sizes == [1] * 30
        return statistics.median(lags)

    assert lag("busy") < 0.5e-3  # well under the old policy's 2 ms wait
    assert lag("timed") >= 1.9e-3  # the measurement does see the timer


def test_busy_queued_requests_form_one_batch_by_oldest_key() -> None:
    """Requests queued behind a running batch run as ONE call per key, the oldest request's key
    first, up to max_batch each, in arrival order; leadership passes on until the queue is empty."""
    b = MicroBatcher(max_batch=3, policy="busy")
    fn = Gated()
    out: dict[str, Any] = {}

    def run(name: str, key: str, x: int) -> None:
        out[name] = b.submit(key, x, fn)

    ts = [_start(run, "lead", "A", 1)]
    assert fn.entered.wait(10)
    order = [("q1", "B", 2), ("q2", "A", 3), ("q3", "B", 4), ("q4", "B", 5), ("q5", "A", 6), ("q6", "B", 7)]
    for n, (name, key, x) in enumerate(order, 1):
        ts.append(_start(run, name, key, x))
        _wait_pending(b, n)  # one at a time: the queue's order is known
    fn.release()
    _join_all(ts, 10)
    assert out == {"lead": 10, "q1": 20, "q2": 30, "q3": 40, "q4": 50, "q5": 60, "q6": 70}
    # B is the oldest queued key: B x3 (max_batch), then A x2, then the B left over
    assert fn.calls == [[1], [2, 4, 5], [3, 6], [7]]
    assert (b.batches, b.items) == (4, 7) and not b._busy


def test_busy_handover_starts_the_next_batch_before_this_one_ends() -> None:
    """A batch that calls ``handover()`` (two-process mode: its rows wait on the ranking process) lets the
    queued requests run as the next batch while it still waits; every row still gets its own answer, the
    batcher goes idle after both, and ``handover()`` outside a batch (or twice) changes nothing."""
    b = MicroBatcher(max_batch=4, policy="busy")
    b.handover()  # outside any batch: a no-op
    first_waits, second_ran = threading.Event(), threading.Event()
    calls: list[list[int]] = []

    def fn(xs: list[int]) -> list[int]:
        calls.append(list(xs))
        if xs == [1]:  # the first batch: hands over, then waits until the next batch has run
            b.handover()
            b.handover()
            first_waits.set()
            assert second_ran.wait(10), "the queued batch did not run while the first one waited"
        else:
            second_ran.set()
        return [10 * x for x in xs]

    out: dict[int, int] = {}

    def run(x: int) -> None:
        out[x] = b.submit("k", x, fn)

    entered, gate = threading.Event(), threading.Event()

    def gated(xs: list[int]) -> list[int]:  # the first request holds the batcher until the others queued
        if xs == [1]:
            entered.set()
            assert gate.wait(10)
        return fn(xs)

    ts = [_start(lambda: out.__setitem__(1, b.submit("k", 1, gated)))]
    assert entered.wait(10)
    ts += [_start(run, x) for x in (2, 3)]
    _wait_pending(b, 2)
    gate.set()
    _join_all(ts, 10)
    assert out == {1: 10, 2: 20, 3: 30}
    assert calls == [[1], [2, 3]] and first_waits.is_set()
    assert (b.batches, b.items) == (2, 3) and not b._busy


def test_busy_failing_row_does_not_fail_its_neighbours() -> None:
    b = MicroBatcher(max_batch=8, policy="busy")
    fn = Gated()
    out: dict[int, Any] = {}

    def run(x: int) -> None:
        try:
            out[x] = b.submit("k", x, fn)
        except ValueError as e:
            out[x] = str(e)

    ts = [_start(run, 1)]
    assert fn.entered.wait(10)
    for n, x in enumerate([2, -3, 4, 5], 1):
        ts.append(_start(run, x))
        _wait_pending(b, n)
    fn.release()
    _join_all(ts, 10)
    assert out == {1: 10, 2: 20, -3: "bad -3", 4: 40, 5: 50}
    assert fn.calls[1] == [2, -3, 4, 5]  # batched, failed as a whole, then row by row:
    assert fn.calls[2:] == [[2], [-3], [4], [5]]


def test_busy_wrong_row_count_is_retried_row_by_row() -> None:
    b = MicroBatcher(max_batch=8, policy="busy")
    gate = Gated()

    def fn(items):  # noqa: ANN001, ANN202
        out = gate(items)
        return out[:1] if len(items) > 1 else out  # a batch call that drops rows

    res: dict[int, Any] = {}
    ts = [_start(lambda x: res.__setitem__(x, b.submit("k", x, fn)), 1)]
    assert gate.entered.wait(10)
    for n, x in enumerate([2, 3, 4], 1):
        ts.append(_start(lambda x: res.__setitem__(x, b.submit("k", x, fn)), x))
        _wait_pending(b, n)
    gate.release()
    _join_all(ts, 10)
    assert res == {1: 10, 2: 20, 3: 30, 4: 40}


class Abort(BaseException):
    """Not an Exception: escapes the row-by-row retry."""


def test_busy_interrupted_leader_hangs_nobody() -> None:
    """A leader killed by a BaseException: its batch gets errors, the queue still drains."""
    b = MicroBatcher(max_batch=8, policy="busy")
    gate = Gated()

    def fn(items):  # noqa: ANN001, ANN202
        out = gate(items)
        if 99 in items:
            raise Abort()
        return out

    res: dict[int, Any] = {}

    def run(x: int, key: str) -> None:
        try:
            res[x] = b.submit(key, x, fn)
        except BaseException as e:  # noqa: BLE001
            res[x] = type(e).__name__

    ts = [_start(run, 1, "A")]
    assert gate.entered.wait(10)
    for n, (x, key) in enumerate([(99, "B"), (2, "B"), (3, "C")], 1):
        ts.append(_start(run, x, key))
        _wait_pending(b, n)
    gate.release()
    _join_all(ts, 10)
    assert res == {1: 10, 99: "Abort", 2: "RuntimeError", 3: 30}
    assert not b._busy and not b._pending


def test_bad_policy_is_refused() -> None:
    from genrec.serve.config import DEFAULT_MICRO_BATCH, ServeConfig

    cfg = ServeConfig(workdir=Path("."))
    assert MicroBatcher(4).policy == "busy" == cfg.micro_batch_policy  # the default
    assert cfg.micro_batch == DEFAULT_MICRO_BATCH == 32  # batching on by default, up to the largest batch bucket
    with pytest.raises(ConfigError, match="policy"):
        MicroBatcher(4, policy="eager")
    from genrec.cli import app

    r = CliRunner().invoke(app, ["serve", "/nonexistent", "--micro-batch", "4", "--micro-batch-policy", "eager"])
    assert r.exit_code == 2 and "--micro-batch-policy must be busy or timed" in r.output
    r = CliRunner().invoke(app, ["serve", "/nonexistent", "--micro-batch", "0"])
    assert r.exit_code == 2 and "--micro-batch must be >= 1" in r.output


@pytest.mark.parametrize("policy", ["busy", "timed", None, "overlap", "pipeline"])
def test_batched_http_equals_solo(run_dir: Path, policy: str | None) -> None:
    # The timed leader waits long enough that a slow 2-core runner still gathers followers (at 20 ms
    # CI once saw 12 requests in 12 batches); the barrier releases every client's request at once.
    # None: the server as configured by default (it batches); "overlap": that with host_overlap (each request
    # parses and formats in its own thread, the batch runs only the model; a cold history never queues);
    # "pipeline": the next batch forms once this one holds the model (ServeConfig.pipeline).
    cfg = (ServeConfig(workdir=run_dir) if policy is None else
           ServeConfig(workdir=run_dir, host_overlap=True) if policy == "overlap" else
           ServeConfig(workdir=run_dir, pipeline=True) if policy == "pipeline" else
           ServeConfig(workdir=run_dir, micro_batch=4, micro_batch_wait_ms=250, micro_batch_policy=policy))
    app = create_app(cfg)
    assert app.service.batcher.policy == (policy if policy in ("busy", "timed") else "busy")
    hists = [[1, 50, 172, 181, 258], [7, 9, 11], [300, 301, 302, 303, 304, 305], [12], [100, 98, 56, 22], []]
    with ServerThread(app) as s:
        rec = app.service.holder.current.engine.rec
        errors: list[str] = []
        go = threading.Barrier(12)

        def client(i: int) -> None:
            h = [{"item_id": x} for x in hists[i % len(hists)]]
            fusion = {"retrieval_weight": 1.0, "action_weight": 0.0} if i % 3 == 1 else {}  # never batched together
            with httpx.Client(base_url=s.url, timeout=30) as c:
                go.wait(30)
                r = c.post("/v1/recommend", json={"history": h, "k": 6, "beam_width": 10,
                                                  **({"fusion": fusion} if fusion else {})})
            try:
                assert r.status_code == 200, r.text
                if not h:
                    assert r.json()["cold_start"]
                    return
                want = rec.recommend(h, k=6, beam_width=10, **fusion)
                got = r.json()["items"]
                assert [x["item_id"] for x in got] == [w.item_id for w in want]
                np.testing.assert_allclose([x["score"] for x in got], [w.score for w in want], rtol=0, atol=1e-5)
            except AssertionError as e:
                errors.append(str(e)[:300])

        ts = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errors, errors[:3]
        assert app.service.batcher.items > app.service.batcher.batches  # requests really shared forwards
        # /metrics counts the same forwards and requests (what bench_serve's rows_per_batch reads)
        got = batch_counts(s.url)
        assert got is not None, got
        assert (got["genrec_batch_rows_count"], got["genrec_batch_rows_sum"]) == (app.service.batcher.batches,
                                                                                  app.service.batcher.items), got
        # every batched request's wait was observed once; the model's part of a batch is a part of its wall time
        waited = app.service.batcher.items if app.service.batcher.policy == "busy" else 0  # (timed: not observed)
        assert got["genrec_batch_wait_ms_count"] == waited, got
        assert 0 < got["genrec_device_latency_ms_sum"] <= got["genrec_batch_latency_ms_sum"], got
    # a full batch can form while one runs: twice the batch's requests may be in the engine at once
    assert app.service.limiter.total_tokens == 2 * cfg.micro_batch


def test_exact_length_histories_are_real_pieces(run_dir):  # noqa: ANN001
    """``sample_histories(exact=True)``: every history has exactly the asked length and is made of
    contiguous pieces of real users' sequences (each history ends with one user's newest items)."""
    import numpy as np

    from genrec.catalog import open_store
    from genrec.serve.loadgen import sample_histories

    hs = sample_histories(run_dir, 20, 700, seed=3, exact=True)
    assert all(len(h) == 700 for h in hs)
    ev = open_store(run_dir).read_events(columns=["user_id", "item_id", "timestamp"])
    u, it, ts = (ev.column(c).to_numpy() for c in ("user_id", "item_id", "timestamp"))
    o = np.lexsort((ts, u))
    u, it = u[o], it[o]
    seqs = [it[u == x] for x in np.unique(u)]
    tails = {tuple(s[-5:].tolist()) for s in seqs if len(s) >= 5}
    assert all(tuple(h[-5:]) in tails for h in hs)
    short = sample_histories(run_dir, 20, 700, seed=3)
    assert any(len(h) < 700 for h in short) and all(len(h) <= 700 for h in short)


def test_the_batch_runs_only_the_model(run_dir: Path) -> None:
    """The server parses each request's history in its own thread and formats its answer there: the batch is
    ``Engine.run_many`` over parsed histories, under the engine's model lock, and parse + run_many + answer is
    ``recommend_many`` (the answers of a batch as such). ``on_device`` gets the time under the lock."""
    from genrec.serve.engine import Engine

    eng = Engine.load(run_dir)
    hists = [[{"item_id": x} for x in h] for h in ([1, 50, 172], [7, 9, 11, 12], [300, 301])]
    kw: dict[str, Any] = dict(k=6, beam_width=10, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    parsed = [eng.read(h)[0] for h in hists]
    times: list[float] = []
    held: list[bool] = []
    run = eng._run

    def spy(*a: Any, **k: Any) -> Any:
        held.append(eng._model.locked())
        return run(*a, **k)

    eng._run = spy  # type: ignore[method-assign]
    locked: list[bool] = []  # on_lock (ServeConfig.pipeline's handover) is called once, with the model held
    got = [eng.answer(r) for r in eng.run_many(parsed, on_device=times.append,
                                               on_lock=lambda: locked.append(eng._model.locked()), **kw)]
    assert held == [True] and len(times) == 1 and times[0] > 0 and locked == [True]
    want = eng.recommend_many(hists, **kw)
    for g, w in zip(got, want, strict=True):  # (the timings are the calls' own)
        assert g.pop("timings_ms").keys() == w.pop("timings_ms").keys() and g == w


def test_handover_lets_the_next_batch_run_beside_the_first() -> None:
    """Once a batch's fn hands over, the next queued request leads its own batch while the first is still running
    (the first here waits for the second to have run: without the handover it would wait forever)."""
    b = MicroBatcher(4, policy="busy")
    second_ran = threading.Event()
    order: list[str] = []

    def first(items: Sequence[Any]) -> list[Any]:
        t = threading.Thread(target=lambda: order.append(b.submit("k", "second", second)))
        t.start()
        time.sleep(0.05)  # the second request is queued behind this batch
        b.handover()
        assert second_ran.wait(10), "the next batch did not start after the handover"
        t.join(10)  # the second request was answered while this batch still ran
        order.append("first done")
        return list(items)

    def second(items: Sequence[Any]) -> list[Any]:
        second_ran.set()
        return list(items)

    assert b.submit("k", "first", first) == "first"
    assert order == ["second", "first done"] and b.batches == 2


def test_async_requests_batch_with_waiting_ones_and_settle_after_the_handover() -> None:
    """``submit_async`` (what the engine of ``--fronts`` uses): mixed with waiting threads, random keys and pauses,
    every future holds fn of its own item, every item computed, one batch at a time, batches formed; a failing
    item fails alone; and a batch's futures are settled only once the next batch has started (else the callback
    below, which waits for that start, would time out)."""
    b = MicroBatcher(max_batch=6, policy="busy")
    lock, running, overlap = threading.Lock(), [0], [0]
    calls: list[list[Any]] = []

    def make_fn(key: int) -> Callable[[list[Any]], list[Any]]:
        def fn(items):  # noqa: ANN001, ANN202
            with lock:
                running[0] += 1
                overlap[0] = max(overlap[0], running[0])
                calls.append(list(items))
            time.sleep(random.random() * 0.002)
            with lock:
                running[0] -= 1
            if any(it == (0, 13) for it in items):
                raise ValueError("bad row")
            return [(key, it) for it in items]
        return fn

    futs: dict[Any, Any] = {}
    bad: list[str] = []

    def client(t: int) -> None:
        rng = random.Random(t)
        for j in range(20):
            key = rng.randrange(2)
            if t % 2:  # a waiting thread
                try:
                    got = b.submit(key, (t, j), make_fn(key))
                    if got != (key, (t, j)):
                        bad.append(f"{t}/{j}: {got}")
                except ValueError:
                    bad.append(f"{t}/{j} failed")
            else:
                futs[(t, j)] = (key, b.submit_async(key, (t, j), make_fn(key)))
            time.sleep(rng.random() * 0.001)

    _join_all([_start(client, t) for t in range(16)], 60)
    for (t, j), (key, f) in futs.items():
        if (t, j) == (0, 13):
            with pytest.raises(ValueError, match="bad row"):
                f.result(10)
        else:
            assert f.result(10) == (key, (t, j))
    assert not bad, bad[:3]
    done = [it for items in calls for it in items]  # (a failing batch's items are run again one by one)
    assert set(done) == {(t, j) for t in range(16) for j in range(20)}
    assert overlap[0] == 1 and max(len(c) for c in calls) > 1
    t_end = time.monotonic() + 10
    while (b._busy or b._pending) and time.monotonic() < t_end:
        time.sleep(0.01)
    assert not b._pending and not b._busy

    # the answers go out after the next batch has started
    gate, second = threading.Event(), threading.Event()
    seen: list[bool] = []

    def fn2(items):  # noqa: ANN001, ANN202
        if "second" in items:
            second.set()
        else:
            gate.wait(10)
        return list(items)

    f1 = b.submit_async("k", "first", fn2)
    f1.add_done_callback(lambda f: seen.append(second.wait(5)))
    f2 = b.submit_async("k", "second", fn2)  # queued behind the first
    gate.set()
    assert f1.result(10) == "first" and f2.result(10) == "second"
    t_end = time.monotonic() + 10
    while not seen and time.monotonic() < t_end:
        time.sleep(0.01)
    assert seen == [True]


def test_async_needs_the_busy_policy() -> None:
    with pytest.raises(ConfigError, match="busy"):
        MicroBatcher(max_batch=4, policy="timed").submit_async("k", 1, lambda xs: xs)


@pytest.mark.parametrize("waiting", [True, False])
def test_busy_batches_leave_no_reference_cycle(waiting: bool) -> None:
    """A busy-policy batch, led by a waiting thread or run for requests nobody waits on (submit_async), is freed by
    reference counting once answered: no entry ends in a cycle for the cyclic GC (a batch's entries, futures and
    items in one cycle were ~70 objects a request; their collections stalled the engine ~25 ms at a time)."""
    import gc

    from genrec.serve.batcher import _Entry

    b = MicroBatcher(max_batch=4, policy="busy")

    def fn(items: list[int]) -> list[int]:
        time.sleep(0.001)  # long enough for the others to queue: batches of several form
        return [i * 2 for i in items]

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        if waiting:
            ts = [_start(lambda t: [b.submit(0, t * 100 + j, fn) for j in range(20)], t) for t in range(8)]
            _join_all(ts, 60)
        else:
            futs = [b.submit_async(0, j, fn) for j in range(160)]
            assert [f.result(timeout=60) for f in futs] == [j * 2 for j in range(160)]
        assert b.batches < b.items  # batches of several did form
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, _Entry)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not cyclic, f"{len(cyclic)} batch entries were left in reference cycles"


@pytest.mark.parametrize("pipeline", [False, True])
def test_pipeline_parses_the_next_batch_while_one_holds_the_model(run_dir: Path, pipeline: bool) -> None:
    """``ServeConfig.pipeline``: a batch hands the batcher on once it holds the model, so a request that comes while
    it runs is parsed then (its batch waits for the model); without it the request waits for the batch to end. Both
    answers are those of the model either way."""
    app = create_app(ServeConfig(workdir=run_dir, pipeline=pipeline))
    with ServerThread(app) as s:
        eng = app.service.holder.current.engine
        run, read = eng._run, eng.read
        in_model, release, parsed_meanwhile = threading.Event(), threading.Event(), threading.Event()

        def slow_run(*a: Any, **k: Any) -> Any:
            if not in_model.is_set():  # the first batch holds the model until released
                in_model.set()
                release.wait(30)
            return run(*a, **k)

        def spy_read(h: Any) -> Any:
            if in_model.is_set() and not release.is_set():
                parsed_meanwhile.set()
            return read(h)

        eng._run, eng.read = slow_run, spy_read  # type: ignore[method-assign]
        codes: list[int] = []

        def client(h: list[int]) -> None:
            with httpx.Client(base_url=s.url, timeout=60) as c:
                codes.append(c.post("/v1/recommend", json={"history": [{"item_id": x} for x in h], "k": 5,
                                                           "beam_width": 10}).status_code)

        first = threading.Thread(target=client, args=([1, 50, 172],))
        first.start()
        assert in_model.wait(30)
        second = threading.Thread(target=client, args=([7, 9, 11],))
        second.start()
        assert parsed_meanwhile.wait(1.5 if pipeline else 1.0) is pipeline
        release.set()
        first.join(60)
        second.join(60)
        assert codes == [200, 200]


def test_switch_interval_is_set_in_the_engine(run_dir: Path) -> None:
    """``ServeConfig.switch_interval_ms`` ($GENREC_SWITCH_INTERVAL_MS; 0.5 ms unless told) is the engine process's
    thread switch interval once it serves; <= 0 is refused."""
    import sys

    before = sys.getswitchinterval()
    try:
        for ms in (2.0, None):
            sys.setswitchinterval(0.005)
            app = create_app(ServeConfig(workdir=run_dir) if ms is None else ServeConfig(workdir=run_dir,
                                                                                        switch_interval_ms=ms))
            with ServerThread(app):
                assert sys.getswitchinterval() == pytest.approx((ms or 0.5) / 1e3)
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(ConfigError, match="switch_interval_ms"):
        create_app(ServeConfig(workdir=run_dir, switch_interval_ms=0))


def test_serve_switches_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$GENREC_PIPELINE / $GENREC_SWITCH_INTERVAL_MS set the ServeConfig fields (unset: the defaults, the pipeline
    off and 0.5 ms); a value that is not a number is a ConfigError naming the variable."""
    for v in ("GENREC_PIPELINE", "GENREC_SWITCH_INTERVAL_MS"):
        monkeypatch.delenv(v, raising=False)
    cfg = ServeConfig(workdir=tmp_path)
    assert (cfg.pipeline, cfg.switch_interval_ms) == (False, 0.5)
    monkeypatch.setenv("GENREC_PIPELINE", "1")
    monkeypatch.setenv("GENREC_SWITCH_INTERVAL_MS", "5")
    cfg = ServeConfig(workdir=tmp_path)
    assert (cfg.pipeline, cfg.switch_interval_ms) == (True, 5.0)
    monkeypatch.setenv("GENREC_SWITCH_INTERVAL_MS", "half")
    with pytest.raises(ConfigError, match=r"\$GENREC_SWITCH_INTERVAL_MS must be a number, got 'half'"):
        ServeConfig(workdir=tmp_path)


@pytest.mark.parametrize(("queued", "hands"), [(1, False), (2, True)])
def test_ready_only_handover_waits_for_the_next_cohort(queued: int, hands: bool) -> None:
    """``handover(ready_only=True)`` (the pipeline's hand-over) starts the next batch only once the
    requests queued make a batch as large as the one two before (its cohort's last, 2 here); with fewer the next
    batch waits for this one to end, so early hand-overs do not cut batches short."""
    b = MicroBatcher(8, policy="busy")
    b._recent = (0, 2)  # the batch before this one held 2 requests: the next batch's cohort's last
    running, ready, others_ran = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first(xs: Sequence[Any]) -> Sequence[Any]:
        running.set()
        assert ready.wait(10)
        b.handover(ready_only=True)
        seen.append(others_ran.wait(1.0))  # did the next batch start beside this one?
        return xs

    def other(xs: Sequence[Any]) -> Sequence[Any]:
        others_ran.set()
        return xs

    ts = [threading.Thread(target=b.submit, args=("k", 0, first))]
    ts[0].start()
    assert running.wait(10)
    ts += [threading.Thread(target=b.submit, args=("k", i + 1, other)) for i in range(queued)]
    for t in ts[1:]:
        t.start()
    deadline = time.time() + 10
    while len(b._pending) < queued and time.time() < deadline:
        time.sleep(0.01)
    ready.set()
    for t in ts:
        t.join(20)
    assert seen == [hands] and others_ran.is_set() and b.batches == 2
