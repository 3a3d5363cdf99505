"""The slow twins themselves, checked against loops written straight from the rules (PinGER §3.3.2)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.kernels.reference import cascade_attention_ref, item_block_attention_ref, item_block_mask


def _rule(qs: int, ks: int, T: int, length: int) -> bool:
    """One (query, key) pair, written as plainly as the paper states it."""
    qi, ql = divmod(qs, T)
    ki, kl = divmod(ks, T)
    if qi >= length or ki >= length:
        return False
    q_dense, k_dense = ql == T - 1, kl == T - 1
    if q_dense:
        return k_dense and ki <= qi
    if k_dense:
        return ki < qi
    return ki == qi and kl <= ql


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 5), n_items=st.integers(1, 7), data=st.data())
def test_mask_matches_rules_loop(T: int, n_items: int, data: st.DataObject) -> None:
    lengths = data.draw(st.lists(st.integers(0, n_items), min_size=1, max_size=3))
    mask = item_block_mask(torch.tensor(lengths), n_items, T)
    S = n_items * T
    assert mask.shape == (len(lengths), S, S)
    for b, length in enumerate(lengths):
        expect = torch.tensor([[_rule(i, j, T, length) for j in range(S)] for i in range(S)])
        assert torch.equal(mask[b], expect)


def test_mask_known_pattern() -> None:
    # 2 items, T=3 (SID1, SID2, dense): hand-written from the rules.
    expect = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],  # item0 SID1: own SID1
            [1, 1, 0, 0, 0, 0],  # item0 SID2: own SID1..2
            [0, 0, 1, 0, 0, 0],  # item0 dense: own dense
            [0, 0, 1, 1, 0, 0],  # item1 SID1: dense of item0 + own SID1
            [0, 0, 1, 1, 1, 0],
            [0, 0, 1, 0, 0, 1],  # item1 dense: dense of items 0, 1
        ],
        dtype=torch.bool,
    )
    assert torch.equal(item_block_mask(torch.tensor([2]), 2, 3)[0], expect)


def _naive_item_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], T: int) -> torch.Tensor:
    B, H, S, D = q.shape
    out = torch.zeros(B, H, S, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(S):
                cols = [j for j in range(S) if _rule(i, j, T, lengths[b])]
                if not cols:
                    continue
                s = torch.stack([q[b, h, i].double() @ k[b, h, j].double() for j in cols]) / math.sqrt(D)
                p = torch.softmax(s, 0)
                out[b, h, i] = (p[:, None] * v[b, h, cols].double()).sum(0)
    return out


def test_item_block_ref_matches_naive_loop() -> None:
    torch.manual_seed(0)
    T, n_items, lengths = 3, 4, [4, 2]
    q, k, v = (torch.randn(2, 2, n_items * T, 16) for _ in range(3))
    out = item_block_attention_ref(q, k, v, torch.tensor(lengths), T)
    torch.testing.assert_close(out.double(), _naive_item_block(q, k, v, lengths, T), atol=1e-5, rtol=1e-5)
    assert torch.all(out[1, :, 2 * T :] == 0)  # padding query rows are exactly 0


def test_cascade_ref_matches_naive_loop() -> None:
    torch.manual_seed(1)
    B, W, H, t, n, D = 2, 3, 2, 3, 5, 16
    q, ks, vs = (torch.randn(B, W, H, t, D) for _ in range(3))
    kh, vh = (torch.randn(B, H, n, D) for _ in range(2))
    hist_len = [5, 2]
    out = cascade_attention_ref(q, kh, vh, ks, vs, torch.tensor(hist_len))
    for b in range(B):
        for w in range(W):
            for h in range(H):
                for j in range(t):
                    keys = torch.cat([kh[b, h, : hist_len[b]], ks[b, w, h, : j + 1]])
                    vals = torch.cat([vh[b, h, : hist_len[b]], vs[b, w, h, : j + 1]])
                    p = torch.softmax(keys.double() @ q[b, w, h, j].double() / math.sqrt(D), 0)
                    torch.testing.assert_close(out[b, w, h, j].double(), p @ vals.double(), atol=1e-5, rtol=1e-5)


def test_reference_rejects_bad_input() -> None:
    q = torch.randn(1, 1, 6, 16)
    with pytest.raises(ValueError, match="T"):
        item_block_attention_ref(q, q, q, torch.tensor([2]), 4)
    with pytest.raises(ValueError, match="lengths"):
        item_block_attention_ref(q, q, q, torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="lengths"):
        item_block_attention_ref(q, q, q, torch.tensor([1, 1]), 3)
    kh = torch.randn(1, 1, 6, 8)  # wrong head dim
    with pytest.raises(ValueError, match="k_hist"):
        cascade_attention_ref(torch.randn(1, 2, 1, 3, 16), kh, kh, torch.randn(1, 2, 1, 3, 16), torch.randn(1, 2, 1, 3, 16), [1])


@pytest.mark.parametrize("T,n_items", [(2, 6), (3, 5), (5, 4)])
def test_mask_agrees_with_shared_predicate(T: int, n_items: int) -> None:
    """The kernels' mask equals genrec.model.mask (the one predicate) on the PinGER training layout."""
    layout_mod = pytest.importorskip("genrec.model.layout")
    mask_mod = pytest.importorskip("genrec.model.mask")
    lengths = torch.tensor([n_items, n_items - 2, 0])
    meta = layout_mod.build_layout(lengths, n_items, "pinger", sid_levels=T).meta
    shared = mask_mod.reference_mask(meta, layout="pinger")  # [B, S, S]
    ours = item_block_mask(lengths, n_items, T)
    valid_q = (torch.arange(n_items * T)[None, :] // T) < lengths[:, None]  # [B, S]
    # Padding query rows: the shared predicate lets them see themselves; the kernels output 0 there.
    assert torch.equal(shared & valid_q[:, :, None], ours)
