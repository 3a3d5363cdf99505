"""Static batch shapes (:mod:`genrec.infer.buckets`): the bucket arithmetic, the reused history buffers against a
fresh-array twin, and -- through the real engine on the CPU, the graphed stages' static-shape path run eagerly --
answers with bucket padding equal to answers without it, with one captured shape per bucket, never more."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from genrec.errors import ConfigError
from genrec.infer.buckets import HistoryBuffers, ShapeBuckets, resolve_buckets, slot_bucket
from genrec.serve.engine import Engine
from tests.infer.test_funnel_batch import _assert_same, _requests
from tests.tiny_run import build_run

# ---------------------------------------------------------------- the arithmetic


def test_batch_buckets_chunks_and_slot_grid() -> None:
    bk = ShapeBuckets((1, 2, 4, 8))
    assert [bk.batch(b) for b in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    with pytest.raises(ValueError, match="larger than the largest bucket 8"):
        bk.batch(9)
    assert bk.chunks(19) == [(0, 8), (8, 16), (16, 19)] and bk.chunks(8) == [(0, 8)]
    assert bk.up_to(1) == [1] and bk.up_to(5) == [1, 2, 4, 8] and bk.up_to(99) == [1, 2, 4, 8]
    # the graphed encoder's bucket: powers of two from min_slots, capped at the model's item slots
    assert [slot_bucket(n, 300) for n in (1, 64, 65, 200, 257, 300)] == [64, 64, 128, 256, 300, 300]
    assert bk.slot_grid(300) == [64, 128, 256, 300] and bk.slot_grid(13) == [13]
    assert ShapeBuckets((1, 4), min_slots=4).slot_grid(13) == [4, 8, 13]
    assert ShapeBuckets.parse("1, 2,16") == ShapeBuckets((1, 2, 16))
    for bad in ("2,1", "1,1", "0,4", "a,b", ""):
        with pytest.raises(ConfigError, match="batch buckets"):
            ShapeBuckets.parse(bad)


def test_resolve_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENREC_BATCH_BUCKETS", raising=False)
    assert resolve_buckets(None, graphed=True) == ShapeBuckets() and resolve_buckets(None, graphed=False) is None
    assert resolve_buckets("off", graphed=True) is None
    monkeypatch.setenv("GENREC_BATCH_BUCKETS", "1,8")
    assert resolve_buckets(None, graphed=False) == ShapeBuckets((1, 8))
    assert resolve_buckets("auto", graphed=False) is None  # the argument wins over the variable


# ---------------------------------------------------------------- the reused buffers


def _parsed(rng: np.random.Generator, b: int, n_max: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(b):
        n = int(rng.integers(1, n_max + 1))
        out.append({k: rng.integers(0, 1000, n).astype(np.int64) for k in ("rows", "actions", "surfaces", "ts")})
    return out


def _fresh(parsed: list[dict[str, Any]], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The twin: a new zero array per batch, filled row by row."""
    cols = np.zeros((4, len(parsed), n), np.int64)
    for i, p in enumerate(parsed):
        for c, key in enumerate(("rows", "actions", "surfaces", "ts")):
            cols[c, i, :len(p[key])] = p[key]
    lengths = np.asarray([len(p["rows"]) for p in parsed])
    return cols, lengths, np.asarray([p["surfaces"][-1] for p in parsed])


def test_history_buffers_equal_fresh_arrays_and_are_reused_per_shape_and_thread() -> None:
    buf = HistoryBuffers("cpu")
    rng = np.random.default_rng(0)
    kept = []
    for rep in range(30):  # long and short histories into the same buffers: no stale tail survives
        b, n = [(4, 16), (2, 16), (4, 8)][rep % 3]
        parsed = _parsed(rng, b, n)
        cols, lengths, last = buf.fill(parsed, n)
        want = _fresh(parsed, n)
        np.testing.assert_array_equal(cols.numpy(), want[0])
        np.testing.assert_array_equal(lengths.numpy(), want[1])
        np.testing.assert_array_equal(last.numpy(), want[2])
        kept.append((cols, want[0]))
    assert buf.allocations == 3  # one per (batch, slots) shape
    for cols, want in kept:  # a batch never aliases the buffer its thread refilled since
        np.testing.assert_array_equal(cols.numpy(), want)
    t = threading.Thread(target=lambda: buf.fill(_parsed(rng, 4, 16), 16))
    t.start()
    t.join()
    assert buf.allocations == 4  # another thread: its own buffer
    with pytest.raises(ValueError, match="histories of 1..8 items"):
        buf.fill(_parsed(rng, 2, 16) + [{"rows": np.zeros(9, np.int64)}], 8)


# ---------------------------------------------------------------- the real engine: padding changes no answer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    return build_run(tmp_path_factory.mktemp("buckets"), data_root, seed=3)


CASES: list[dict[str, Any]] = [dict(sources=["sid", "ann"], rank=True), dict(sources=["sid"], rank=False),
                               dict(sources=["sid", "ann"], rank=True, exclude_history=True),
                               dict(sources=["ann"], rank=True, fusion={"retrieval_weight": 0.5})]


def _static(eng: Engine, buckets: ShapeBuckets | None) -> Engine:
    """``eng`` with ``buckets`` and the graphed stages' static-shape path (run eagerly on the CPU)."""
    eng.rec.buckets = buckets
    eng.rec.use_graphs(use_graph=False)
    return eng


def test_bucket_padding_changes_no_answer(run: Path) -> None:
    plain = Engine.load(run)  # no buckets, no static shapes: the reference
    assert plain.rec.buckets is None and plain.rec.graph_captures == {}
    padded = _static(Engine.load(run), ShapeBuckets((1, 2, 4), min_slots=4))
    for c, kw in enumerate(CASES):
        for b in (1, 3, 7):  # 7: chunks of 4 and 3 (padded to 4)
            hs = _requests(plain, 50 + 10 * c + b, b)
            args: dict[str, Any] = dict(k=6, beam_width=10, diversity_lambda=0.0, **kw)
            want = plain.recommend_many(hs, **args)
            got = padded.recommend_many(hs, **args)
            assert len(got) == len(want) == b
            for w, g in zip(want, got):
                _assert_same(w, g, 1e-5)
            for h, g in zip(hs, got):  # and each equals that request alone, padded
                _assert_same(padded.recommend(h, **args), g, 1e-5)


@pytest.mark.parametrize("sid_mode", ["full", "auto"])  # auto: the served default, the coarse prefix + dense leaf
def test_one_capture_per_bucket_never_recaptured(run: Path, sid_mode: str) -> None:
    bk = ShapeBuckets((1, 2, 4, 8), min_slots=4)
    eng = _static(Engine.load(run), bk)
    rec = eng.rec
    rec.sid_mode = sid_mode  # both SID stages replay CUDA graphs
    assert rec.served_sid_mode == ("full" if sid_mode == "full" else "dense")
    grid = bk.slot_grid(rec.config.max_items)
    assert grid == [4, 8, 13]
    rng = np.random.default_rng(1)
    ids = rec.catalog.item_ids
    seen: set[tuple[int, int]] = set()
    args: dict[str, Any] = dict(k=5, beam_width=8, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    for rep in range(2):  # the second pass: other histories, the same shapes
        for n in (3, 7, 12):  # slot buckets 4, 8, 13
            for b in range(1, 9):
                hs = [[{"item_id": int(x)} for x in rng.choice(ids, int(rng.integers(1, n + 1)), replace=False)]
                      for _ in range(b - 1)] + [[{"item_id": int(x)} for x in rng.choice(ids, n, replace=False)]]
                eng.recommend_many(hs, **args)
                seen.add((bk.batch(b), bk.slots(n, rec.config.max_items)))
        caps = rec.graph_captures
        assert caps["encode"] == len(seen)  # exactly one per (batch bucket, slot bucket) run
        assert len(rec._graphed_encode._cache.graphs) <= len(bk.batch_sizes) * len(grid)  # type: ignore[union-attr]
        assert 0 < caps["sid"] <= len(seen) and 0 < caps["rank"] <= 4 * len(seen)
        if rep == 0:
            first = caps
    assert rec.graph_captures == first  # the second pass over every size only replays
    assert rec._buffers.allocations == len(seen)  # one host buffer per shape (this thread)
    # without batch buckets every batch size is a shape of its own
    eng2 = _static(Engine.load(run), None)
    for b in range(1, 9):
        eng2.recommend_many([[{"item_id": int(ids[0])}]] * b, **args)
    assert eng2.rec.graph_captures["encode"] == 8


def test_warmup_runs_each_batch_bucket(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _static(Engine.load(run), ShapeBuckets((1, 2, 4, 8), min_slots=4))
    rec = eng.rec
    rec.cuda_graphs = "all"  # as on a GPU: warmup runs (here on the static-shape path, eagerly)
    sizes: list[int] = []
    orig = rec.run_batch

    def spy(mb: Any, **kw: Any) -> Any:
        sizes.append(int(mb.actions.shape[0]))
        return orig(mb, **kw)

    monkeypatch.setattr(rec, "run_batch", spy)
    assert rec.warmup(batch_sizes=(1, 3), min_bucket=4) == [4, 8, rec.context_len]
    assert sizes == [1, 4] * 3 and rec.graph_captures["encode"] == 6


@pytest.mark.gpu
def test_bucketed_graphs_capture_once_per_bucket_gpu(run: Path) -> None:
    eng = Engine.load(run, device="cuda")
    rec = eng.rec
    assert rec.buckets == ShapeBuckets() and torch.cuda.is_available()
    ids = rec.catalog.item_ids
    args: dict[str, Any] = dict(k=5, beam_width=8, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    for b in (1, 2, 3, 5, 8):
        eng.recommend_many([[{"item_id": int(x)} for x in ids[:10]]] * b, **args)
    caps = rec.graph_captures
    for b in (1, 2, 3, 4, 5, 6, 7, 8):
        eng.recommend_many([[{"item_id": int(x)} for x in ids[:10]]] * b, **args)
    assert rec.graph_captures == caps and caps["encode"] == 4  # buckets 1, 2, 4, 8 (the warmup's: 1)


