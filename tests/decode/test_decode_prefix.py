"""Coarse-prefix SID retrieval (`genrec.decode.prefix`): the device expansion against its slow per-item twin on
fresh random tries, logits and known flags (a last level wider than the model's head included), and the full-code
beams' known items inside the merged list with the same scores."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.decode.beam import beam_search
from genrec.decode.prefix import PrefixLeaves, pad_codebooks, prefix_lists_reference, prefix_search
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError
from tests.decode.test_decode_trie_torch import build_trie_arrays


def _case(seed: int, b: int, grown: int) -> tuple:  # type: ignore[type-arg]
    """A random SID set (3 levels), its trie, a step function over random tables, leaf rows and known flags."""
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(2, 5)), int(rng.integers(2, 5)), int(rng.integers(3, 7))]
    km = sizes[-1] - grown  # the model's last-level head (the trie's last level may have grown past it)
    all_codes = np.stack(np.meshgrid(*[np.arange(k) for k in sizes], indexing="ij"), -1).reshape(-1, 3)
    n = int(rng.integers(4, len(all_codes) + 1))
    codes = all_codes[np.sort(rng.choice(len(all_codes), n, replace=False))]  # lexicographic: the leaf order
    a = build_trie_arrays(codes)
    trie = TorchTrie.from_arrays(a["offsets"], a["codes"], a["children"], sizes)
    tables = [torch.from_numpy(rng.normal(size=(b, *sizes[:d], sizes[d] if d < 2 else km)) * 2).float()
              for d in range(3)]

    def step(prefix: torch.Tensor) -> torch.Tensor:  # [B, W, d] -> log-probs [B, W, K]
        bb, w, d = prefix.shape
        idx = (torch.arange(bb)[:, None].expand(bb, w),) + tuple(prefix[..., j] for j in range(d))
        return torch.log_softmax(tables[d][idx], -1)

    rows = rng.permutation(n + 5)[:n].astype(np.int64)
    rows[rng.random(n) < 0.1] = -1  # a leaf whose item left the catalogue
    known = rng.random(n) < 0.7
    return trie, step, codes, rows, known, sizes, km


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(1, 8), st.sampled_from([0.0, 0.7]),
       st.sampled_from(["prefix", "merged"]), st.integers(0, 2), st.integers(1, 40))
def test_prefix_search_equals_the_per_item_twin(seed: int, b: int, w: int, lam: float, order: str, grown: int,
                                                limit: int) -> None:
    trie, step, codes, rows, known, _, _ = _case(seed, b, grown)
    got = prefix_search(step, trie, PrefixLeaves.build(rows, known, "cpu"), b, w, limit, order=order,  # type: ignore[arg-type]
                        diversity_lambda=lam)
    beams = got.beams
    last = step(beams.codes.clamp_min(0)).numpy()
    want_r, want_s = prefix_lists_reference(beams.codes.numpy(), beams.scores.numpy(), beams.valid.numpy(), last,
                                            codes, rows, known, limit, order)  # type: ignore[arg-type]
    s = got.scores.numpy().astype(np.float64)
    np.testing.assert_allclose(s, want_s, atol=1e-5, rtol=0)
    r = got.rows.numpy()
    # the same rows in the same order, except where two scores tie within float32 rounding
    differ = np.argwhere(r != want_r)
    for i, j in differ:
        near = np.abs(want_s[i] - s[i, j]) < 1e-5
        assert r[i, j] in want_r[i][near], (i, j)
    assert ((r >= 0) == np.isfinite(s)).all()
    for i in range(b):
        kept = r[i][r[i] >= 0]
        assert len(set(kept.tolist())) == len(kept)  # no item twice


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(1, 8), st.sampled_from(["prefix", "merged"]),
       st.integers(0, 2), st.integers(1, 40))
def test_dense_leaf_rule_equals_the_per_item_twin(seed: int, b: int, w: int, order: str, grown: int,
                                                  limit: int) -> None:
    """With leaf_logits the item inside a prefix is scored by the softmax of its dense score over the prefix's
    catalogue items, known flags and the last SID level aside; each kept prefix's items sum to its probability."""
    trie, step, codes, rows, known, _, _ = _case(seed, b, grown)
    dense = np.random.default_rng(seed + 1).normal(size=(b, len(rows) + 5)) * 3
    dense_t = torch.from_numpy(dense).float()

    def leaf(r: torch.Tensor) -> torch.Tensor:
        return dense_t.gather(1, r.reshape(r.shape[0], -1)).reshape(r.shape)

    got = prefix_search(step, trie, PrefixLeaves.build(rows, known, "cpu"), b, w, limit, order=order,  # type: ignore[arg-type]
                        leaf_logits=leaf)
    beams = got.beams
    last = step(beams.codes.clamp_min(0)).numpy()
    want_r, want_s = prefix_lists_reference(beams.codes.numpy(), beams.scores.numpy(), beams.valid.numpy(), last,
                                            codes, rows, known, limit, order, item_scores=dense)  # type: ignore[arg-type]
    s = got.scores.numpy().astype(np.float64)
    np.testing.assert_allclose(s, want_s, atol=1e-5, rtol=0)
    r = got.rows.numpy()
    for i, j in np.argwhere(r != want_r):
        assert r[i, j] in want_r[i][np.abs(want_s[i] - s[i, j]) < 1e-5], (i, j)
    # the whole list of one prefix: its items' probabilities add up to the prefix's
    full = prefix_search(step, trie, PrefixLeaves.build(rows, known, "cpu"), b, w, 10_000, order="prefix",
                         leaf_logits=leaf)
    for i in range(b):
        for j in range(w):
            if not beams.valid[i, j]:
                continue
            under = [rows[n] for n in range(len(codes))
                     if list(codes[n][:-1]) == beams.codes[i, j].tolist() and rows[n] >= 0]
            if under:
                got_p = [math.exp(float(full.scores[i, k])) for k in range(full.rows.shape[1])
                         if int(full.rows[i, k]) in under]
                assert sum(got_p) == pytest.approx(math.exp(float(beams.scores[i, j])), rel=1e-4)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(1, 8), st.integers(0, 2))
def test_merged_list_holds_the_full_code_beams_with_their_scores(seed: int, b: int, w: int, grown: int) -> None:
    """Every known item of the full-code beams (beam search over the whole trie; no logit past the model's head)
    is in the merged list, with the beam's log-probability; at lambda = 0 they are its top known items."""
    trie, step, codes, rows, known, sizes, _ = _case(seed, b, grown)
    full = beam_search(pad_codebooks(step, sizes), b, 3, sizes, w, trie=trie)
    merged = prefix_search(step, trie, PrefixLeaves.build(rows, known, "cpu"), b, w, 10_000)
    leaf = trie.walk(full.codes.clamp_min(0))[..., -1]
    for i in range(b):
        got = {int(r): float(s) for r, s in zip(merged.rows[i], merged.scores[i]) if r >= 0}
        beam_items = []
        for j in range(w):
            if not bool(full.valid[i, j]):
                continue
            n = int(leaf[i, j])
            if rows[n] < 0 or not known[n]:
                continue
            assert got[int(rows[n])] == pytest.approx(float(full.scores[i, j]), abs=1e-5)
            beam_items.append(int(rows[n]))
        known_rows = [int(r) for r, k in zip(merged.rows[i], merged.known[i]) if r >= 0 and k]
        assert set(beam_items) == set(known_rows[:len(beam_items)])  # the full beams are its best known items


def test_pad_codebooks_and_errors() -> None:
    trie, step, codes, rows, known, sizes, km = _case(3, 1, 2)
    padded = pad_codebooks(step, sizes)
    lp = padded(torch.zeros(1, 2, 2, dtype=torch.int64))
    assert lp.shape == (1, 2, sizes[-1]) and torch.isinf(lp[..., km:]).all()
    leaves = PrefixLeaves.build(rows, known, "cpu")
    with pytest.raises(ConfigError, match="order"):
        prefix_search(step, trie, leaves, 1, 2, 5, order="best")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="limit"):
        prefix_search(step, trie, leaves, 1, 2, 0)
    with pytest.raises(ConfigError, match="leaves"):
        prefix_search(step, trie, PrefixLeaves.build(rows[:-1], None, "cpu"), 1, 2, 5)


def test_leaves_reused_while_the_arrays_and_device_are_the_same() -> None:
    """A server keeps one device copy of the leaves (the graphed SID stage keys its graphs by it): "cpu:0" and
    "cpu" (as "cuda" and "cuda:0") name one device, so the copy is not rebuilt per request."""
    rows, known = np.arange(6), np.ones(6, bool)
    held = PrefixLeaves.reuse(None, rows, known, "cpu:0")
    assert PrefixLeaves.reuse(held, rows, known, "cpu:0") is held
    assert PrefixLeaves.reuse(held, rows, known, torch.device("cpu")) is held
    assert PrefixLeaves.reuse(held, rows.copy(), known, "cpu") is not held  # arrays swapped (sid assign)
