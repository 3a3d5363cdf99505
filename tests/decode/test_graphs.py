"""The SID beam search replayed as a CUDA graph equals the eager beam search over the same
context -- every level, trie constraints, diverse selection -- on fresh random models and
histories; a replay with a new history in the same bucket never returns the old one's beams.
The eager twin is ``beam_search`` over ``sid_logits_ctx``, itself tested equal to the path that
copies the cache per beam (tests/model/test_shared_beam_decode.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from genrec.decode.beam import beam_search
from genrec.decode.graphs import GraphedBeamSearch, bucket_length
from genrec.decode.prefix import PrefixLeaves, dense_leaf, prefix_search
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError
from genrec.sid.trie import SidTrie

_spec = importlib.util.spec_from_file_location(
    "eqv", Path(__file__).resolve().parents[1] / "model" / "test_model_equivalence.py")
eqv = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(eqv)

KS = [16, 12, 8, 6]

# compiled Triton kernels inside the graph: a test module that enabled the CPU interpreter in the
# same pytest process (tests/kernels) would turn them into interpreter calls on CUDA tensors
needs_compiled = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                    reason="compiled Triton needed: run with TRITON_INTERPRET=0")


def test_bucket_length() -> None:
    assert [bucket_length(n) for n in (1, 63, 64, 65, 1000, 1024, 1025)] == [64, 64, 64, 128, 1024, 1024, 2048]
    assert bucket_length(5, min_bucket=8) == 8


def _setup(seed: int, lengths: list[int], n: int, bf16: bool = False, device: str = "cuda",
           grown: int = 0):  # type: ignore[no-untyped-def]
    """A random model, a trie of random SIDs (its last level ``grown`` codes past the model's head) and the
    cached context of a random batch, on ``device``."""
    model = eqv.make_model(seed, layout="pinger", sid_levels=len(KS), sid_codebook_sizes=KS, max_items=200).to(device)
    rng = np.random.default_rng(seed)
    ks = KS[:-1] + [KS[-1] + grown]
    codes = np.unique(np.stack([rng.integers(0, k, 3000) for k in ks], 1), axis=0)
    st = SidTrie.build(codes, np.arange(len(codes)), ks)
    trie = TorchTrie.from_arrays(st.offsets, st.codes, st.children, ks, device=device, dense_max_entries=64)
    batch = eqv.make_batch(model.config, lengths, n, 0, seed)
    batch = type(batch)(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()})
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        cache, _, _ = model.encode_history(batch)
    ctx = model.beam_context(cache)
    assert ctx is not None
    return model, trie, ctx


def _eager(model, trie, ctx, W: int, lam: float, constrain: bool):  # type: ignore[no-untyped-def]
    def step(prefix: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(model.sid_logits_ctx(ctx, prefix).float(), dim=-1)

    with torch.no_grad():
        return beam_search(step, ctx.batch_size, len(KS), KS, W, diversity_lambda=lam, trie=trie,
                           constrain=constrain, device=ctx.lengths.device)


@pytest.mark.gpu
@needs_compiled
@pytest.mark.parametrize("seed,W,lam,constrain", [(0, 5, 0.0, True), (1, 40, 0.7, True), (2, 17, 0.3, False),
                                                   (3, 100, 0.0, True)])
def test_graphed_equals_eager(seed: int, W: int, lam: float, constrain: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(5, 90, (1,), generator=g))
    lengths = torch.randint(1, n + 1, (3,), generator=g).tolist()
    model, trie, ctx = _setup(seed, lengths, n)
    graphed = GraphedBeamSearch(model, trie, min_bucket=16)
    want = _eager(model, trie, ctx, W, lam, constrain)
    for _ in range(2):  # capture, then a pure replay
        got = graphed(ctx, W, diversity_lambda=lam, constrain=constrain)
        assert torch.equal(got.codes, want.codes)
        assert torch.equal(got.valid, want.valid)
        torch.testing.assert_close(got.scores, want.scores, atol=1e-5, rtol=0)
    assert graphed.captures == 1
    if constrain:
        assert bool(got.valid[torch.isfinite(got.scores)].all())


@pytest.mark.gpu
@needs_compiled
def test_replay_with_a_new_history_is_not_stale() -> None:
    model, trie, ctx_a = _setup(5, [40, 33], 40)
    graphed = GraphedBeamSearch(model, trie, min_bucket=16)
    batch = eqv.make_batch(model.config, [50, 61], 61, 0, 6)  # another history, same bucket (64)
    batch = type(batch)(**{k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()})
    with torch.no_grad():
        cache_b, _, _ = model.encode_history(batch)
    ctx_b = model.beam_context(cache_b)
    assert ctx_b is not None
    assert bucket_length(ctx_a.n_tokens, 16) == bucket_length(ctx_b.n_tokens, 16)
    a1 = graphed(ctx_a, 30, diversity_lambda=0.5)
    b1 = graphed(ctx_b, 30, diversity_lambda=0.5)
    a2 = graphed(ctx_a, 30, diversity_lambda=0.5)
    assert graphed.captures == 1
    assert torch.equal(b1.codes, _eager(model, trie, ctx_b, 30, 0.5, True).codes)
    assert torch.equal(a1.codes, a2.codes)
    assert not torch.equal(a1.codes, b1.codes)


@pytest.mark.gpu
@needs_compiled
def test_graphed_under_bf16_autocast_matches_eager_autocast() -> None:
    model, trie, ctx = _setup(7, [70, 12, 45], 70, bf16=True)
    graphed = GraphedBeamSearch(model, trie, min_bucket=16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = _eager(model, trie, ctx, 24, 0.0, True)
        got = graphed(ctx, 24)
    assert torch.equal(got.codes, want.codes)
    torch.testing.assert_close(got.scores, want.scores, atol=1e-4, rtol=0)


@pytest.mark.gpu
@needs_compiled
def test_capture_while_another_thread_uses_the_gpu() -> None:
    """The server runs several inference threads: a capture must not fail (or corrupt) because
    another thread launches eager GPU work meanwhile."""
    import threading

    model, trie, ctx = _setup(9, [40, 20], 40)
    batch = eqv.make_batch(model.config, [40, 20], 40, 0, 9)
    batch = type(batch)(**{k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()})
    graphed = GraphedBeamSearch(model, trie, min_bucket=16)
    want = {W: _eager(model, trie, ctx, W, 0.3, True) for W in (12, 13, 14)}
    stop, errors = threading.Event(), []

    def busy() -> None:
        try:
            while not stop.is_set():
                with torch.no_grad():
                    model.encode_history(batch)  # eager work with allocations on the default stream
        except Exception as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    t = threading.Thread(target=busy)
    t.start()
    try:
        got = {W: graphed(ctx, W, diversity_lambda=0.3) for W in (12, 13, 14)}  # three captures
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert graphed.captures == 3
    for W in want:
        assert torch.equal(got[W].codes, want[W].codes)


# ------------------------------------------------------------------ the coarse-prefix SID stage


def _prefix_case(seed: int, device: str, grown: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(5, 60, (1,), generator=g))
    lengths = torch.randint(1, n + 1, (3,), generator=g).tolist()
    model, trie, ctx = _setup(seed, lengths, n, device=device, grown=grown)
    n_leaves = trie.n_nodes(trie.n_levels)
    rows = torch.randperm(n_leaves, generator=g)
    rows[torch.rand(n_leaves, generator=g) < 0.1] = -1  # leaves outside the catalogue
    leaves = PrefixLeaves.build(rows.numpy(), (torch.rand(n_leaves, generator=g) < 0.8).numpy(), device)
    item_vecs = torch.randn(n_leaves, 8, generator=g).to(device)
    user = torch.randn(len(lengths), 8, generator=g).to(device)
    return model, trie, ctx, leaves, item_vecs, user


def _prefix_eager(model, trie, ctx, leaves, item_vecs, user, W, limit, order, lam):  # type: ignore[no-untyped-def]
    def step(prefix: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(model.sid_logits_ctx(ctx, prefix).float(), dim=-1)

    leaf = None if user is None else dense_leaf(user, item_vecs, 0.7)
    with torch.no_grad():
        return prefix_search(step, trie, leaves, ctx.batch_size, W, limit, order=order, diversity_lambda=lam,
                             device=ctx.lengths.device, leaf_logits=leaf)


def _same_prefix(got, want) -> None:  # type: ignore[no-untyped-def]
    assert torch.equal(got.rows, want.rows)
    assert torch.equal(got.known, want.known)
    torch.testing.assert_close(got.scores, want.scores, atol=1e-5, rtol=0)
    assert torch.equal(got.beams.codes, want.beams.codes)


@pytest.mark.parametrize("seed,W,limit,order,lam,dense,grown", [
    (0, 6, 20, "merged", 0.0, True, 0), (1, 9, 7, "prefix", 0.5, False, 0), (2, 4, 50, "merged", 0.0, False, 2),
    (3, 12, 30, "merged", 0.3, True, 3)])
def test_prefix_static_program_equals_eager_prefix_search(seed: int, W: int, limit: int, order: str, lam: float,
                                                          dense: bool, grown: int) -> None:
    """The program the graph captures (run eagerly on its static inputs, CPU) equals the eager coarse-prefix
    search: beams, rows, scores and known flags, dense leaf or the SID head's last level, a grown last level."""
    model, trie, ctx, leaves, item_vecs, user = _prefix_case(seed, "cpu", grown)
    u = user if dense else None
    want = _prefix_eager(model, trie, ctx, leaves, item_vecs, u, W, limit, order, lam)
    graphed = GraphedBeamSearch(model, trie, min_bucket=16, use_graph=False)
    assert graphed.supports_prefix(ctx)
    for _ in range(2):  # the static inputs filled again for the same shape
        got = graphed.prefix(ctx, leaves, W, limit, order=order, diversity_lambda=lam, user=u, item_vecs=item_vecs,
                             temperature=0.7)
        _same_prefix(got, want)
    other = user.flip(0) if dense else None  # new user vectors reach the static buffer
    if other is not None:
        _same_prefix(graphed.prefix(ctx, leaves, W, limit, order=order, diversity_lambda=lam, user=other,
                                    item_vecs=item_vecs, temperature=0.7),
                     _prefix_eager(model, trie, ctx, leaves, item_vecs, other, W, limit, order, lam))
    assert graphed.captures == 1
    with pytest.raises(ConfigError, match="limit"):
        graphed.prefix(ctx, leaves, W, 0)


@pytest.mark.gpu
@needs_compiled
@pytest.mark.parametrize("seed,dense,grown", [(4, True, 0), (5, False, 2)])
def test_graphed_prefix_equals_eager(seed: int, dense: bool, grown: int) -> None:
    model, trie, ctx, leaves, item_vecs, user = _prefix_case(seed, "cuda", grown)
    u = user if dense else None
    graphed = GraphedBeamSearch(model, trie, min_bucket=16)
    want = _prefix_eager(model, trie, ctx, leaves, item_vecs, u, 30, 60, "merged", 0.0)
    for _ in range(2):  # capture, then a pure replay
        _same_prefix(graphed.prefix(ctx, leaves, 30, 60, user=u, item_vecs=item_vecs, temperature=0.7), want)
    assert graphed.captures == 1
