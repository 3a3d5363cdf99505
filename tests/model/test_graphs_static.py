"""The graphed serving forwards (history encode, ranking decode) pad to static bucket shapes; the
padding changes nothing. Checked on the CPU by running the same static-shape path eagerly
(``use_graph=False``) against the plain forwards on fresh random models and batches -- including
calls that reuse a bucket's buffers after a longer history or more candidates left stale values
there -- and on a GPU with the graphs captured and replayed."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import torch

import genrec.model.genrec_model as gm
from genrec.model.graphs import GraphedEncoder, GraphedRanker, bucket_length

_spec = importlib.util.spec_from_file_location("eqv", Path(__file__).with_name("test_model_equivalence.py"))
eqv = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(eqv)


def _to(batch, dev: str):  # type: ignore[no-untyped-def]
    return type(batch)(**{k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()})


def _serving_batch(cfg, lengths: list[int], n: int, seed: int, dev: str):  # type: ignore[no-untyped-def]
    b = eqv.make_batch(cfg, lengths, n, 0, seed, feats=False)
    return _to(replace(b, action_mask=None, target_actions=None), dev)


def _cands(cfg, b: int, m: int, seed: int, dev: str):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    vecs = torch.nn.functional.normalize(torch.randn(b, m, cfg.item_dim, generator=g), dim=-1)
    codes = torch.stack([torch.randint(0, k, (b, m), generator=g) for k in cfg.sid_codebook_sizes], -1)
    surf = torch.randint(0, cfg.n_surfaces, (b,), generator=g)
    return vecs.to(dev), codes.to(dev), surf.to(dev)


def _check(dev: str, use_graph: bool, seed: int) -> None:
    model = eqv.make_model(seed, layout="pinger", sid_fusion=True, max_items=100).to(dev)
    cfg = model.config
    enc = GraphedEncoder(model, min_bucket=8, use_graph=use_graph)
    rnk = GraphedRanker(model, min_bucket=8, min_cand_bucket=4, use_graph=use_graph)
    g = torch.Generator().manual_seed(seed)
    # longest first, so later calls in the same bucket meet stale values past their own lengths
    # the last history fills the model's context (100 items): its bucket is capped at 100, not 128
    for n, m in ((30, 13), (23, 9), (17, 3), (100, 5)):
        lengths = torch.randint(1, n + 1, (3,), generator=g).tolist()
        lengths[0] = n
        batch = _serving_batch(cfg, lengths, n, seed * 10 + n, dev)
        with torch.no_grad():
            want_cache, want_user, want_h = model.encode_history(batch)
            got_cache, got_user, got_h = enc(batch)
            assert got_cache.n_tokens == min(bucket_length(want_cache.n_tokens, 8), max(n, cfg.max_items))
            torch.testing.assert_close(got_user, want_user, atol=2e-5, rtol=0)
            torch.testing.assert_close(got_h, want_h, atol=2e-5, rtol=0)
            # the beams' plan comes memoised from the graph, equal to computing it on either cache
            plan = got_cache.plans["hist_len"]
            assert plan is not None
            assert torch.equal(plan, model._shared_plan(got_cache)) and torch.equal(plan, model._shared_plan(want_cache))
            # and the ranking's candidate plan, read later without computing it again (no launches, no sync)
            want_hist, want_ok = model.backbone.candidate_plan_lazy(want_cache)
            want_ok = bool(want_ok)
            assert want_ok and got_cache.plans["cand_ok"] is want_ok
            assert torch.equal(got_cache.plans["cand_hist_len"], want_hist)
            with mock.patch.object(model.backbone, "candidate_plan_lazy", side_effect=AssertionError("planned again")):
                assert model.candidate_plan_ok(got_cache) is want_ok
            # speculated: the same plans, taken as holding, the verdict left on the device (True here)
            spec = enc(batch, speculate=True)[0].plans
            assert "assumed" not in got_cache.plans and bool(spec["assumed"]) and spec["cand_ok"] is True
            assert torch.equal(spec["hist_len"], plan) and torch.equal(spec["cand_hist_len"], want_hist)
            # the padded cache serves every later stage as the plain one does
            prefix = torch.stack([torch.randint(0, k, (3, 4), generator=g) for k in cfg.sid_codebook_sizes[:2]], -1).to(dev)
            torch.testing.assert_close(model.sid_logits_next(got_cache, prefix), model.sid_logits_next(want_cache, prefix),
                                       atol=2e-5, rtol=0)
            vecs, codes, surf = _cands(cfg, 3, m, seed + m, dev)
            want = model.rank(want_cache, vecs, codes, surf)
            torch.testing.assert_close(model.rank(got_cache, vecs, codes, surf), want, atol=2e-5, rtol=0)
            torch.testing.assert_close(rnk(want_cache, vecs, codes, surf), want, atol=2e-5, rtol=0)  # eager cache
            torch.testing.assert_close(rnk(got_cache, vecs, codes, surf), want, atol=2e-5, rtol=0)  # bucketed cache
            # by cascade attention (forced on the CPU): the encoder's memo fed into the ranker, no planning again
            with mock.patch.object(gm, "gpu_fast_path", lambda impl, device: True), \
                    mock.patch.object(model.backbone, "candidate_plan_lazy", side_effect=AssertionError("planned again")):
                torch.testing.assert_close(rnk(got_cache, vecs, codes, surf), want, atol=2e-5, rtol=0)
    assert enc.captures == 2  # one bucket (32 slots) for the first three histories, one of 100
    assert rnk.captures == (3 if dev == "cuda" else 6)  # candidate buckets 16 and 4 with cache bucket 32; 8 with
    # cache bucket 128 (on the CPU each again with cascade attention forced on)


@pytest.mark.parametrize("seed", [0, 1])
def test_static_shape_paths_equal_the_plain_forwards(seed: int) -> None:
    _check("cpu", use_graph=False, seed=seed)


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels needed")
def test_captured_graphs_equal_the_plain_forwards() -> None:
    _check("cuda", use_graph=True, seed=3)


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels needed")
def test_captures_from_several_threads_at_once() -> None:
    """Micro-batched serving captures new (batch size, bucket) shapes from several request threads
    at once, while others replay or run eagerly. Four threads, released together, each capture
    encoder and ranker graphs of their own batch sizes; every output equals the plain forward."""
    import threading

    model = eqv.make_model(5, layout="pinger", sid_fusion=True, max_items=100).cuda()
    cfg = model.config
    enc = GraphedEncoder(model, min_bucket=8)
    rnk = GraphedRanker(model, min_bucket=8, min_cand_bucket=4)
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            start.wait()
            for rep in range(3):
                b = 1 + (t + rep) % 4  # batch sizes differ between threads: captures overlap
                batch = _serving_batch(cfg, [40] * b, 40, 100 * t + rep, "cuda")
                vecs, codes, surf = _cands(cfg, b, 7, t + rep, "cuda")
                with torch.no_grad():
                    want_cache, want_user, _ = model.encode_history(batch)
                    got_cache, got_user, _ = enc(batch)
                    torch.testing.assert_close(got_user, want_user, atol=2e-5, rtol=0)
                    torch.testing.assert_close(rnk(got_cache, vecs, codes, surf), model.rank(want_cache, vecs, codes, surf),
                                               atol=2e-5, rtol=0)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    assert enc.captures == 4  # batch sizes 1-4, one bucket


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels needed")
def test_capture_survives_garbage_graphs_collected_during_it() -> None:
    """Garbage holding an earlier captured graph, collected by Python's cyclic GC while a new capture
    is under way in the same thread, would destroy that graph inside the capture and invalidate it
    (how the concurrent-capture test above failed on the H200 after earlier tests' graphs became
    garbage). capture() pauses the GC, so the garbage is collected after."""
    import gc
    import weakref

    from genrec.model.graphs import capture

    x = torch.arange(4.0, device="cuda")
    box: dict[str, torch.cuda.CUDAGraph] = {}
    box["old"], _ = capture(lambda: x + 1)
    old = weakref.ref(box["old"])
    seen: list[bool] = []
    calls: list[int] = []

    def run() -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:  # the captured call (the first is capture()'s warm-up)
            cycle: list[object] = [box.pop("old")]  # the old graph becomes cyclic garbage ...
            cycle.append(cycle)
            del cycle
            junk = [[] for _ in range(20_000)]  # ... then far more allocations than the young generation holds
            del junk
            seen.append(old() is not None)  # still alive: no collection ran inside the capture
        return x * 2

    graph, out = capture(run)
    x.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full((4,), 6.0, device="cuda"))
    assert seen == [True]
    gc.collect()
    assert old() is None  # collected after the capture
