"""Beam steps over a shared history (cascade attention, the history KV never copied per beam)
equal the plain path that copies the cache W times, on fresh random models and batches; the
shared path is really taken (not a silent fallback) for the PinGER and TIGER layouts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from genrec.model.layout import TokenMeta

_spec = importlib.util.spec_from_file_location("eqv", Path(__file__).with_name("test_model_equivalence.py"))
eqv = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(eqv)


@pytest.mark.parametrize("layout", ["pinger", "tiger"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_beam_steps_equal_copied_cache(layout: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    model = eqv.make_model(seed, layout=layout, sid_levels=4, sid_codebook_sizes=[7, 6, 5, 4])
    cfg = model.config
    n = int(torch.randint(2, 9, (1,), generator=g))
    lengths = torch.randint(1, n + 1, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
    batch = eqv.make_batch(cfg, lengths, n, 0, seed)
    W = int(torch.randint(1, 7, (1,), generator=g))
    calls = {"plain": 0}
    plain_decode = model.backbone.decode

    def counting(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls["plain"] += 1
        return plain_decode(*a, **k)

    with torch.no_grad():
        cache, _, _ = model.encode_history(batch)
        for d in range(1, cfg.sid_levels):
            prefix = torch.stack([torch.randint(0, K, (len(lengths), W), generator=g)
                                  for K in cfg.sid_codebook_sizes[:d]], -1)  # [B, W, d]
            model.shared_beam_decode = False
            want = model.sid_logits_next(cache, prefix)
            model.shared_beam_decode = True
            monkeypatch.setattr(model.backbone, "decode", counting)
            got = model.sid_logits_next(cache, prefix)
            monkeypatch.setattr(model.backbone, "decode", plain_decode)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    assert calls["plain"] == 0  # the cascade path served every step


def test_plan_refuses_beams_with_different_metadata() -> None:
    model = eqv.make_model(0)
    cfg = model.config
    batch = eqv.make_batch(cfg, [3, 2], 3, 0, 0)
    with torch.no_grad():
        cache, _, _ = model.encode_history(batch)
    W, d = 3, 1
    pos = cache.lengths.repeat_interleave(W)[:, None].clone()
    meta = TokenMeta(pos, torch.ones_like(pos), torch.full_like(pos, cache.n_tokens))
    assert model.backbone.shared_prefix_plan(meta, cache, W) is not None
    pos2 = pos.clone()
    pos2[1, 0] += 1  # one beam at another position: not a shared prefix
    assert model.backbone.shared_prefix_plan(TokenMeta(pos2, meta.kind, meta.tok), cache, W) is None
    assert model.backbone.shared_prefix_plan(meta, cache, W + 1) is None  # rows do not split into W


def _every_depth_plan(model, cache):  # type: ignore[no-untyped-def]
    """The slow twin of ``GenRecModel.shared_plan_lazy``: plan every beam depth 1..L-1 and require them all,
    with one hist_len."""
    plans = [model.backbone.shared_prefix_plan_lazy(model._beam_meta(cache, 1, d), cache, 1)
             for d in range(1, model.config.sid_levels)]
    first = plans[0][0]
    return first, bool(torch.stack([ok & (h == first).all() for h, ok in plans]).all())


@pytest.mark.parametrize("layout", ["pinger", "tiger"])
@pytest.mark.parametrize("seed", range(6))
def test_the_deepest_plan_decides_every_depth(layout: str, seed: int) -> None:
    """The beams' plan is computed for the deepest depth alone (its masks hold every shallower depth's): on fresh
    random caches, and on caches whose metadata is scrambled so that some plans fail, it decides as planning
    every depth does, with the same hist_len."""
    g = torch.Generator().manual_seed(300 + seed)
    model = eqv.make_model(seed, layout=layout, sid_levels=4, sid_codebook_sizes=[7, 6, 5, 4])
    n = int(torch.randint(2, 9, (1,), generator=g))
    lengths = torch.randint(1, n + 1, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
    with torch.no_grad():
        cache, _, _ = model.encode_history(eqv.make_batch(model.config, lengths, n, 0, seed))
    verdicts = set()
    for scramble in range(32):
        if scramble:  # random kinds (padding, dense, SID levels, candidates) and positions in the cached metadata
            m = cache.meta
            kind = torch.randint(-2, 5, m.kind.shape, generator=g)
            pos = torch.randint(0, n + 2, m.pos.shape, generator=g)
            cache.meta = TokenMeta(pos, kind, m.tok)
            cache.plans = {}
        want_h, want_ok = _every_depth_plan(model, cache)
        got = model.shared_plan_lazy(cache)
        assert got is not None and bool(got[1]) is want_ok
        if want_ok:
            assert torch.equal(got[0], want_h)
        verdicts.add(want_ok)
    assert verdicts == {True, False}  # both verdicts met: the comparison could fail either way
