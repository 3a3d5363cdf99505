"""Attention op: reference vs FlexAttention (same predicate), split-and-merge (cascade) vs full."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import ConfigError
from genrec.kernels.attention import (
    CausalMask,
    attention,
    attention_with_lse,
    gpu_fast_path,
    merge_attention,
    prepare_mask,
    resolve_impl,
)
from genrec.model.layout import build_layout
from genrec.model.mask import flex_block_mask, make_mask_mod, reference_mask


def _qkv(b: int, h: int, sq: int, sk: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=g) for s in (sq, sk, sk))


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3), h=st.integers(1, 3), sq=st.integers(1, 9), sk=st.integers(2, 12),
    split=st.floats(0.0, 1.0), p=st.floats(0.2, 1.0), seed=st.integers(0, 10_000),
)
def test_split_and_merge_equals_full_attention(b, h, sq, sk, split, p, seed) -> None:
    q, k, v = _qkv(b, h, sq, sk, 8, seed)
    g = torch.Generator().manual_seed(seed + 1)
    mask = torch.rand(b, 1, sq, sk, generator=g) < p
    mask[..., 0] = True  # every row sees at least one key overall (part 2 may see none)
    cut = max(1, min(sk - 1, int(split * sk)))
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    o1, l1 = attention_with_lse(q, k[:, :, :cut], v[:, :, :cut], mask[..., :cut])
    o2, l2 = attention_with_lse(q, k[:, :, cut:], v[:, :, cut:], mask[..., cut:])
    merged, lse = merge_attention(o1, l1, o2, l2)
    o_all, l_all = attention_with_lse(q, k, v, mask)
    torch.testing.assert_close(merged, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o_all, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, l_all, atol=1e-5, rtol=1e-5)


def test_merge_of_naive_average_would_differ() -> None:
    """Sanity: the merge weights matter (a plain average of the halves is wrong)."""
    q, k, v = _qkv(1, 1, 4, 6, 8, 3)
    o1, l1 = attention_with_lse(q, k[:, :, :2], v[:, :, :2])
    o2, l2 = attention_with_lse(q, k[:, :, 2:], v[:, :, 2:])
    full = F.scaled_dot_product_attention(q, k, v)
    assert not torch.allclose((o1 + o2) / 2, full, atol=1e-3)
    torch.testing.assert_close(merge_attention(o1, l1, o2, l2)[0], full, atol=1e-5, rtol=1e-5)


def test_reference_attention_uses_the_predicate_mask() -> None:
    lay = build_layout(torch.tensor([3, 2]), 3, "pinger", 3, 2)
    b, s = lay.meta.shape
    q, k, v = _qkv(b, 2, s, s, 8, 0)
    out = attention(q, k, v, mask_mod=make_mask_mod(lay.meta, lay.meta, "pinger"), impl="reference")
    m = reference_mask(lay.meta, layout="pinger")[:, None]
    scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    slow = torch.softmax(scores.masked_fill(~m, float("-inf")), -1) @ v
    torch.testing.assert_close(out, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["pinger", "tiger", "hstu"])
def test_flex_equals_reference(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexAttention runs on CPU in torch 2.13 (unfused eager path), so this is a CPU test."""
    monkeypatch.delenv("GENREC_ATTN", raising=False)
    k_cand = 0 if layout == "tiger" else 3
    lay = build_layout(torch.tensor([5, 2, 0]), 5, layout, 3, k_cand)
    b, s = lay.meta.shape
    q, k, v = _qkv(b, 2, s, s, 16, 1)
    ref = attention(q, k, v, mask=prepare_mask(make_mask_mod(lay.meta, lay.meta, layout), b, s, s, "reference", "cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fx = attention(q, k, v, mask=flex_block_mask(lay.meta, layout=layout))
    torch.testing.assert_close(fx, ref, atol=1e-5, rtol=1e-5)


def test_impl_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENREC_ATTN", raising=False)
    assert resolve_impl("auto", "cpu") == "reference"
    assert resolve_impl("flex", "cpu") == "flex"
    assert resolve_impl("auto", "cuda", 1000) == "reference"
    assert resolve_impl("auto", "cuda", 1 << 30) == "flex"
    assert resolve_impl("auto", "cpu", 1 << 30) == "reference"
    monkeypatch.setenv("GENREC_ATTN", "reference")
    assert resolve_impl("flex", "cuda") == "reference"  # the env var forces every fast path off
    monkeypatch.setenv("GENREC_ATTN", "bogus")
    with pytest.raises(ConfigError, match="GENREC_ATTN"):
        resolve_impl("auto", "cpu")
    monkeypatch.delenv("GENREC_ATTN")
    assert resolve_impl("triton", "cpu") == "reference"  # forced off on CPU
    assert resolve_impl("triton", "cuda") == "triton"


@settings(max_examples=30, deadline=None)
@given(
    layout=st.sampled_from(["tiger", "dense", "hstu"]), n=st.integers(1, 7), data=st.data(),
    h=st.integers(1, 2), seed=st.integers(0, 10_000),
)
def test_gpu_fast_path_equals_the_layout_mask_on_valid_tokens(layout, n, data, h, seed) -> None:
    """SDPA is_causal (CausalMask) vs the explicit mask of a right-padded token-causal layout: the
    same outputs on every valid query and the same q/k/v gradients of a loss over valid queries."""
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=3)))
    lay = build_layout(lengths, n, layout, 3)
    b, s = lay.meta.shape
    q, k, v = (x.requires_grad_() for x in _qkv(b, h, s, s, 8, seed))
    ref_mask = prepare_mask(make_mask_mod(lay.meta, lay.meta, layout), b, s, s, "reference", "cpu")
    valid = (lay.meta.kind != -2)[:, None, :, None]  # [B, 1, S, 1]
    w = torch.randn(b, h, s, 8, generator=torch.Generator().manual_seed(seed + 1))
    outs, grads = [], []
    for mask in (ref_mask, CausalMask()):
        out = attention(q, k, v, mask=mask)
        outs.append(out)
        grads.append(torch.autograd.grad((out * w * valid).sum(), (q, k, v)))
    keep = valid.expand_as(outs[0])
    torch.testing.assert_close(outs[1][keep], outs[0][keep], atol=1e-5, rtol=1e-5)
    for a, c in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


def test_gpu_fast_path_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENREC_ATTN", raising=False)
    assert gpu_fast_path("auto", "cuda") and gpu_fast_path("triton", "cuda")
    assert not gpu_fast_path("auto", "cpu") and not gpu_fast_path("triton", "cpu")  # forced off on CPU
    assert not gpu_fast_path("reference", "cuda") and not gpu_fast_path("flex", "cuda")
    monkeypatch.setenv("GENREC_ATTN", "reference")
    assert not gpu_fast_path("auto", "cuda")  # the env var forces it off
    q, k, v = _qkv(1, 1, 3, 4, 8, 0)
    with pytest.raises(ValueError, match="CausalMask"):
        attention(q, k, v, mask=CausalMask())


def test_bad_shapes_raise() -> None:
    q, k, v = _qkv(1, 1, 3, 4, 8, 0)
    with pytest.raises(ValueError, match="shapes"):
        attention(q, k[..., :4], v, mask=torch.ones(1, 1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask shape"):
        attention(q, k, v, mask=torch.ones(1, 1, 3, 3, dtype=torch.bool))
