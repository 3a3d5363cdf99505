"""``KVCache.row`` / ``KVCache.stack`` (two-process mode sends a batch's rows through the KV pool one slot each and
the ranking process stacks them again): the rows of an encoded batch stacked give the batch's cache back, and
ranking over the stacked cache scores exactly as over the batch's own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from genrec.model.kv_cache import KVCache

_spec = importlib.util.spec_from_file_location("eqv", Path(__file__).with_name("test_model_equivalence.py"))
eqv = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(eqv)


@pytest.mark.parametrize("layout,seed", [("pinger", 0), ("dense", 1), ("hstu", 2)])
def test_rows_stacked_are_the_batch(layout: str, seed: int) -> None:
    model = eqv.make_model(seed, layout=layout, target_condition=True, sid_fusion=layout != "hstu")
    g = torch.Generator().manual_seed(seed)
    n, k = 6, 3
    lengths = torch.randint(1, n + 1, (5,), generator=g).tolist()
    batch = eqv.make_batch(model.config, lengths, n, k, seed)
    with torch.no_grad():
        cache, _, _ = model.encode_history(batch, batch.request_surface, batch.request_action)
        vecs = model.item_vectors(batch.cand_feats)
        want = model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
        rows = [cache.row(i) for i in range(cache.batch_size)]
        assert all(r.batch_size == 1 for r in rows)
        back = KVCache.stack(rows)
        got = model.rank(back, vecs, batch.cand_sid_codes, batch.cand_surface)
        # a part of the batch (two-process mode ranks a batch in parts of half the pool's slots)
        part = model.rank(KVCache.stack(rows[1:3]), vecs[1:3], batch.cand_sid_codes[1:3], batch.cand_surface[1:3])
    for a, b in zip(back.k + back.v, cache.k + cache.v):
        assert torch.equal(a, b)
    assert back.meta is not None and cache.meta is not None
    assert torch.equal(back.meta.kind, cache.meta.kind) and torch.equal(back.meta.pos, cache.meta.pos)
    assert torch.equal(back.lengths, cache.lengths) and torch.equal(back.last_hidden, cache.last_hidden)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(part, want[1:3], atol=1e-6, rtol=0)


def test_stack_refuses_caches_that_do_not_fit() -> None:
    model = eqv.make_model(0, layout="pinger", target_condition=True, sid_fusion=True)
    with torch.no_grad():
        a, _, _ = model.encode_history(eqv.make_batch(model.config, [3, 2], 3, 1, 0))
        b, _, _ = model.encode_history(eqv.make_batch(model.config, [5], 5, 1, 1))
    with pytest.raises(ValueError, match="differ in token count"):
        KVCache.stack([a.row(0), b])
    with pytest.raises(ValueError, match="one or more filled caches"):
        KVCache.stack([])
