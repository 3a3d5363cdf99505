"""Micro-batching: grouping by key, failure isolation, and batched HTTP answers == solo answers."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np

from genrec.serve.app import ServeConfig, create_app
from genrec.serve.batcher import MicroBatcher

from ._server import ServerThread


def test_groups_by_key_and_isolates_failures() -> None:
    b = MicroBatcher(max_batch=4, max_wait_ms=50)
    calls: list[list[int]] = []
    lock = threading.Lock()

    def fn(items):  # noqa: ANN001, ANN202
        with lock:
            calls.append(list(items))
        if any(i < 0 for i in items):
            if len(items) == 1:
                raise ValueError(f"bad {items[0]}")
            raise ValueError("batch has a bad row")
        return [i * 10 for i in items]

    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            out[i] = b.submit(i % 2, i if i != 5 else -5, fn)
        except ValueError as e:
            out[i] = str(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert {i: out[i] for i in range(8) if i != 5} == {i: i * 10 for i in range(8) if i != 5}
    assert out[5] == "bad -5"  # only the bad request fails
    for c in calls:  # a batch never mixes keys
        assert len({abs(i) % 2 for i in c}) == 1
    assert max(len(c) for c in calls) > 1  # something was actually batched


def test_batched_http_equals_solo(run_dir: Path) -> None:
    app = create_app(ServeConfig(workdir=run_dir, micro_batch=4, micro_batch_wait_ms=20))
    hists = [[1, 50, 172, 181, 258], [7, 9, 11], [300, 301, 302, 303, 304, 305], [12], [100, 98, 56, 22], []]
    with ServerThread(app) as s:
        rec = app.service.holder.current.engine.rec
        errors: list[str] = []

        def client(i: int) -> None:
            h = [{"item_id": x} for x in hists[i % len(hists)]]
            with httpx.Client(base_url=s.url, timeout=30) as c:
                r = c.post("/v1/recommend", json={"history": h, "k": 6, "beam_width": 10})
            try:
                assert r.status_code == 200, r.text
                if not h:
                    assert r.json()["cold_start"]
                    return
                want = rec.recommend(h, k=6, beam_width=10)
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


def test_exact_length_histories_are_real_pieces(run_dir):  # noqa: ANN001
    """``sample_histories(exact=True)``: every history has exactly the asked length and is made of
    contiguous pieces of real users' sequences (each history ends with one user's newest items)."""
    import numpy as np

    from genrec.pipeline import open_store
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
