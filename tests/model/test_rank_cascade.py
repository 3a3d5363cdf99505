"""Ranking by cascade attention (the GPU fast path of ``GenRecModel.rank``): each candidate is one
"beam" of one token over its row's cached history, so the history is read once per row and no
[B, k, n + k] mask is built. It must compute the masked decode's function: checked here on fresh
random models and batches with the fast path forced on (on the CPU cascade attention runs its
PyTorch two-pass form; on a GPU, the Triton kernel), against the masked decode and the full
forward; with a cache whose visible keys are not a prefix (the fallback); through the static-shape
ranker that CUDA graphs replay; and under bf16 on a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import genrec.model.genrec_model as gm
from genrec.model.graphs import GraphedRanker
from genrec.model.layout import PAD

_spec = importlib.util.spec_from_file_location("eqv", Path(__file__).with_name("test_model_equivalence.py"))
eqv = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(eqv)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _to(batch, dev: str):  # type: ignore[no-untyped-def]
    return type(batch)(**{f: (v.to(dev) if isinstance(v, torch.Tensor) else v) for f, v in vars(batch).items()})


def _force(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(gm, "gpu_fast_path", lambda impl, device: on)


def _masked_then_fast(monkeypatch: pytest.MonkeyPatch, model, batch):  # type: ignore[no-untyped-def]
    """Encode the batch, rank its candidates (as stored item vectors) by the masked decode, then force
    the fast path on: (cache, vecs, the masked decode's scores)."""
    cache, _, _ = model.encode_history(batch)
    vecs = model.item_vectors(batch.cand_feats)
    _force(monkeypatch, False)
    want = model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
    _force(monkeypatch, True)
    return cache, vecs, want


def _spy(monkeypatch: pytest.MonkeyPatch, model) -> list[int]:  # type: ignore[no-untyped-def]
    """Record each cascade decode's candidate count; it must run without value-range checks (each a
    device->host sync per layer: hist_len comes from the cache, not from the caller)."""
    from genrec.validation import checks_on

    calls: list[int] = []
    real = model.backbone.decode_planned

    def planned(x, ks, vs, hist_len, w):  # type: ignore[no-untyped-def]
        assert not checks_on()
        calls.append(w)
        return real(x, ks, vs, hist_len, w)
    monkeypatch.setattr(model.backbone, "decode_planned", planned)
    return calls


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("layout,seed", [("pinger", 0), ("pinger", 1), ("dense", 2), ("hstu", 3)])
def test_rank_by_cascade_equals_masked_decode_and_forward(layout: str, seed: int, dev: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model = eqv.make_model(seed, layout=layout, target_condition=True, sid_fusion=layout != "hstu").to(dev)
    g = torch.Generator().manual_seed(seed)
    n, k = 7, int(torch.randint(1, 9, (1,), generator=g))
    lengths = torch.randint(1, n + 1, (4,), generator=g).tolist()
    lengths[0] = n
    batch = _to(eqv.make_batch(model.config, lengths, n, k, seed), dev)
    calls = _spy(monkeypatch, model)
    with torch.no_grad():
        out = model(batch)
        cache, _, _ = model.encode_history(batch, batch.request_surface, batch.request_action)
        _force(monkeypatch, False)
        masked = model.rank(cache, out.cand_vecs, batch.cand_sid_codes, batch.cand_surface)
        assert not calls and "cand_ok" not in cache.plans
        _force(monkeypatch, True)
        fast = model.rank(cache, out.cand_vecs, batch.cand_sid_codes, batch.cand_surface)
    assert calls == [k] and cache.plans["cand_ok"] is True
    torch.testing.assert_close(fast, masked, atol=2e-5, rtol=0)
    torch.testing.assert_close(fast, out.cand_action_logits, atol=2e-5, rtol=0)
    # each candidate's score depends on no other candidate: the first one alone scores the same
    with torch.no_grad():
        one = model.rank(cache, out.cand_vecs[:, :1], batch.cand_sid_codes[:, :1], batch.cand_surface)
        none = model.rank(cache, out.cand_vecs[:, :0], batch.cand_sid_codes[:, :0], batch.cand_surface)
    torch.testing.assert_close(one, fast[:, :1], atol=2e-5, rtol=0)
    assert none.shape == (len(lengths), 0, fast.shape[-1])


@pytest.mark.parametrize("dev", DEVICES)
def test_rank_falls_back_where_the_visible_keys_are_not_a_prefix(dev: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hole in the cache (a key no candidate may see, before keys it may) rules cascade attention out:
    rank must notice, run the masked decode, and give its result."""
    model = eqv.make_model(5, layout="pinger", target_condition=True, sid_fusion=True).to(dev)
    batch = _to(eqv.make_batch(model.config, [6, 6, 4], 6, 3, 5), dev)
    calls = _spy(monkeypatch, model)
    with torch.no_grad():
        cache, _, _ = model.encode_history(batch, batch.request_surface, batch.request_action)
        assert model.candidate_plan_ok(cache)
        cache.meta.kind[1, 2] = PAD  # row 1: keys 0, 1, 3, 4, 5 visible
        cache.plans.clear()
        vecs = model.item_vectors(batch.cand_feats)
        _force(monkeypatch, False)
        masked = model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
        _force(monkeypatch, True)
        fast = model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
    assert cache.plans["cand_ok"] is False and not calls
    torch.testing.assert_close(fast, masked, atol=0, rtol=0)
    hist_len, ok = model.backbone.candidate_plan_lazy(cache)
    assert not bool(ok) and hist_len.tolist() == [6, 5, 4]


def test_rank_plan_is_not_decided_where_nothing_may_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a capture (trusted inputs) an undecided plan means the masked decode, not a sync;
    a decided one is used."""
    from genrec.validation import trusted_inputs

    model = eqv.make_model(6, layout="pinger", sid_fusion=True)
    batch = eqv.make_batch(model.config, [5, 2], 5, 2, 6)
    _force(monkeypatch, True)
    calls = _spy(monkeypatch, model)
    with torch.no_grad():
        cache, _, _ = model.encode_history(batch)
        vecs = model.item_vectors(batch.cand_feats)
        with trusted_inputs():
            model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
        assert not calls and "cand_ok" not in cache.plans
        model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)  # eager: decided (one sync), memoised
        with trusted_inputs():
            model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
    assert calls == [2, 2]


@pytest.mark.parametrize("seed", [0, 1])
def test_static_shape_ranker_with_cascade_equals_masked_decode(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The static-shape ranker (what a CUDA graph captures; here run eagerly on the CPU) decides the plan
    on the caller's cache, fixes it in its key, and pads the cache to a bucket: still the same scores."""
    model = eqv.make_model(seed, layout="pinger", sid_fusion=True, max_items=100)
    cfg = model.config
    rnk = GraphedRanker(model, min_bucket=8, min_cand_bucket=4, use_graph=False)
    calls = _spy(monkeypatch, model)
    g = torch.Generator().manual_seed(seed)
    for n, m in ((30, 13), (17, 3)):
        lengths = torch.randint(1, n + 1, (3,), generator=g).tolist()
        lengths[0] = n
        batch = eqv.make_batch(cfg, lengths, n, m, seed * 10 + n)
        with torch.no_grad():
            cache, vecs, want = _masked_then_fast(monkeypatch, model, batch)
            before = len(calls)
            got = rnk(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
        assert len(calls) == before + 1
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


@pytest.mark.gpu
def test_rank_by_cascade_in_bf16_on_gpu() -> None:
    """On a GPU under ``auto`` the cascade kernel ranks; in bf16 it stays within bf16 rounding of the
    masked decode (the same model with the reference attention)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = eqv.make_model(7, layout="pinger", sid_fusion=True, d_model=128, n_heads=2, max_items=300).cuda()
    batch = _to(eqv.make_batch(model.config, [300, 120, 1, 77], 300, 40, 7), "cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cache, _, _ = model.encode_history(batch)
        vecs = model.item_vectors(batch.cand_feats)
        fast = model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface).float()
        assert cache.plans["cand_ok"] is True
        model.config.attn_impl = "reference"
        masked = model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface).float()
    err = (fast - masked).abs().max() / masked.abs().max()
    assert err < 2e-2, float(err)


def test_compiled_rank_with_the_cascade_is_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile of rank() with the fast path on and the plan memoised traces as one graph (no
    sync, no ContextVar) and equals the eager masked decode. (On the CPU cascade attention takes its
    PyTorch form; the kernel's own op is traced in tests/kernels/test_cascade.py.)"""
    from torch._dynamo.testing import CompileCounterWithBackend

    model = eqv.make_model(8, layout="pinger", sid_fusion=True)
    batch = eqv.make_batch(model.config, [5, 3, 1], 5, 4, 8)
    with torch.no_grad():
        cache, vecs, want = _masked_then_fast(monkeypatch, model, batch)
        assert model.candidate_plan_ok(cache)
        calls = _spy(monkeypatch, model)
        counter = CompileCounterWithBackend("aot_eager")
        torch._dynamo.reset()
        got = torch.compile(model.rank, backend=counter, fullgraph=True)(cache, vecs, batch.cand_sid_codes,
                                                                         batch.cand_surface)
        torch._dynamo.reset()
    assert counter.frame_count == 1 and calls == [4]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
