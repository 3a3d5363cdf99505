"""Masked attention op with switchable implementations + the cascade-attention building blocks.

Non-standard: the op never sees model classes; visibility comes as a FlexAttention-style
``mask_mod(b, h, q_idx, kv_idx) -> bool`` written with broadcastable ops, which the reference
path evaluates on broadcast index grids (an explicit ``[B, 1, Sq, Sk]`` bool mask for SDPA) and
the flex path hands to ``create_block_mask``. The same function therefore defines both.

Implementations: ``reference`` (SDPA + explicit mask; the CPU default and, measured, the faster
one on GPU at moderate lengths), ``flex`` (FlexAttention; compiled on CUDA, the unfused eager
fallback on CPU — it runs there in torch 2.13, slowly), ``triton`` (PinGER §3.3.4 item-block
kernel, :mod:`genrec.kernels.item_block`: CUDA only, full forward of the PinGER training layout;
a trailing candidate segment (M-FALCON: each candidate sees the history's dense tokens and
itself) is split off and attended by :func:`candidate_attention`; anything else — CPU, decode
steps — falls back to ``reference``; neither has attention-probability dropout). The token-causal
layouts (TIGER / dense / HSTU) in a full forward without candidates (training, the serving
prefill) take :class:`CausalMask` on CUDA under ``auto`` and ``triton`` (see
:func:`gpu_fast_path`): SDPA with ``is_causal=True`` (FlashAttention, attention dropout
included), equal to the explicit mask on every valid token of right-padded rows. ``GENREC_ATTN=<impl>`` in the environment overrides everything,
so every fast path can be forced off.

``attention_with_lse`` / ``merge_attention`` are the two halves of cascade attention (PinGER
§3.3.4 / serving): attend to disjoint key sets separately, then combine with the online-softmax
merge; the result equals one softmax over all keys.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from genrec.errors import ConfigError

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
IMPLS = ("reference", "flex", "triton")

_compiled_flex: Any = None

# "auto" picks flex on CUDA only when the explicit bool mask would exceed this many elements.
# Measured on one H200 (torch 2.11, bf16, gpu-base preset, B=32, S=816 PinGER tokens, 4 layers):
# reference 3.3 ms vs flex 7.4 ms per forward — the PinGER mask has a dense column in every block
# below the diagonal, so FlexAttention skips nothing (PinGER §3.3.4); flex pays off only where the
# [B, Sq, Sk] mask itself gets too big.
AUTO_FLEX_MIN_MASK_ELEMS = 1 << 28


def resolve_impl(
    impl: str | None = "auto", device: torch.device | str = "cpu", mask_elems: int | None = None
) -> str:
    """Pick the implementation: env ``GENREC_ATTN`` > explicit ``impl`` > auto.

    auto: CPU -> reference; CUDA -> flex if ``mask_elems`` (B*Sq*Sk) >= ``AUTO_FLEX_MIN_MASK_ELEMS``,
    else reference.
    """
    env = os.environ.get("GENREC_ATTN")
    choice = env if env else (impl or "auto")
    if choice == "auto":
        big = mask_elems is not None and mask_elems >= AUTO_FLEX_MIN_MASK_ELEMS
        choice = "flex" if torch.device(device).type == "cuda" and big else "reference"
    if choice not in IMPLS:
        src = "environment variable GENREC_ATTN" if env else "attn_impl"
        raise ConfigError(f"{src}: unknown attention implementation {choice!r}; choose one of {IMPLS} or 'auto'")
    if choice == "triton" and torch.device(device).type != "cuda":
        choice = "reference"  # fast paths are forced off on CPU
    return choice


def kernel_head_dim(dh: int) -> bool:
    """Can the Triton attention kernels (item-block, cascade) take this head dim? A power of two from 16
    to 128, the range their tests cover; other head dims take the reference paths (the same function)."""
    return 16 <= dh <= 128 and not dh & (dh - 1)


def gpu_fast_path(impl: str | None, device: torch.device | str) -> bool:
    """May a fast path that has no FlexAttention twin run (the causal SDPA of :class:`CausalMask`,
    SID fusion's kernel)? On CUDA under ``auto`` or ``triton`` (after ``GENREC_ATTN``); never on
    CPU, and never when ``reference`` or ``flex`` is asked for."""
    choice = os.environ.get("GENREC_ATTN") or impl or "auto"
    return torch.device(device).type == "cuda" and choice in ("auto", "triton")


class CausalMask:
    """Token-causal attention over right-padded rows, as SDPA's ``is_causal=True`` computes it.

    For a TIGER / dense / HSTU layout without candidates or cache this equals the explicit mask
    (``k_tok <= q_tok``, padding keys hidden) on every valid query: padding sits after the valid
    tokens of its row, so no valid query can reach it. Padding queries differ (they see the tokens
    before them instead of only themselves); nothing reads them and no loss counts them."""


class ItemBlockMask:
    """The PinGER training mask in the form the Triton kernel takes: valid items per row, tokens
    per item, and the number of candidate tokens after the history (the same in every row)."""

    def __init__(self, lengths: torch.Tensor, tokens_per_item: int, n_cand: int = 0) -> None:
        if n_cand < 0:
            raise ValueError(f"ItemBlockMask: n_cand must be >= 0, got {n_cand}")
        self.lengths = lengths.to(torch.int32)  # [B]
        self.T = int(tokens_per_item)
        self.n_cand = int(n_cand)


def candidate_attention(q: torch.Tensor, k_dense: torch.Tensor, v_dense: torch.Tensor, k_self: torch.Tensor,
                        v_self: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """M-FALCON candidates: q ``[B, H, m, D]``; each attends to its row's first ``lengths[b]``
    history dense tokens ``k_dense/v_dense [B, H, n, D]`` and to itself (``k_self/v_self
    [B, H, m, D]``), never to another candidate. One softmax over both parts (fp32), so a
    candidate's output depends on no other candidate. Differentiable (plain PyTorch ops)."""
    n = k_dense.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    s_hist = torch.matmul(q, k_dense.transpose(-1, -2)).float() * scale  # [B, H, m, n]
    seen = torch.arange(n, device=q.device)[None, :] < lengths.to(q.device)[:, None]  # [B, n]
    s_hist = s_hist.masked_fill(~seen[:, None, None, :], float("-inf"))
    s_self = (q.float() * k_self.float()).sum(-1, keepdim=True) * scale  # [B, H, m, 1]
    p = torch.softmax(torch.cat([s_hist, s_self], -1), -1)
    out = torch.matmul(p[..., :n].to(v_dense.dtype), v_dense).float() + p[..., n:] * v_self.float()
    return out.to(q.dtype)


def _item_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: ItemBlockMask) -> torch.Tensor:
    """The Triton kernel over the history segment, :func:`candidate_attention` over the candidates."""
    from genrec.kernels.item_block import ItemBlockConfig, item_block_attention  # local: imports triton

    # traced by torch.compile the kernel is a custom op that runs the tuned configuration itself, and
    # dynamo cannot trace tuned's lru_cache (a graph break in every layer)
    cfg = None if torch.compiler.is_compiling() else ItemBlockConfig.tuned(q.shape[-1], q.dtype)
    T, m = mask.T, mask.n_cand
    if m == 0:
        return item_block_attention(q, k, v, mask.lengths, T, config=cfg)
    sh = q.shape[2] - m
    if sh < 0 or sh % T:
        raise ValueError(f"attention: {q.shape[2]} tokens minus {m} candidates is not a whole number of "
                         f"{T}-token items")
    out_h = item_block_attention(q[:, :, :sh], k[:, :, :sh], v[:, :, :sh], mask.lengths, T, config=cfg)
    dense = slice(T - 1, sh, T)  # the dense token is the last of each item's T
    out_c = candidate_attention(q[:, :, sh:], k[:, :, dense], v[:, :, dense], k[:, :, sh:], v[:, :, sh:],
                                mask.lengths)
    return torch.cat([out_h, out_c], 2)


def _dense_mask(mask_mod: MaskMod, b: int, sq: int, sk: int, device: torch.device) -> torch.Tensor:
    bi = torch.arange(b, device=device)[:, None, None]
    qi = torch.arange(sq, device=device)[None, :, None]
    ki = torch.arange(sk, device=device)[None, None, :]
    h = torch.zeros((), dtype=torch.int64, device=device)
    m = mask_mod(bi, h, qi, ki)  # [B, Sq, Sk]
    return m.expand(b, sq, sk)[:, None]  # [B, 1, Sq, Sk]


def prepare_mask(mask_mod: MaskMod, b: int, sq: int, sk: int, impl: str, device: torch.device | str) -> Any:
    """Build the per-forward mask object once (bool tensor or BlockMask) for reuse across layers."""
    device = torch.device(device)
    if impl == "reference":
        return _dense_mask(mask_mod, b, sq, sk, device)
    if impl == "flex":
        # on CUDA compile the mask construction too (eager vmap over Sq x Sk dominates otherwise)
        return create_block_mask(mask_mod, b, None, sq, sk, device=str(device), _compile=device.type == "cuda")
    raise ConfigError(f"attn_impl {impl!r}: cannot prepare a mask; choose one of ('reference', 'flex')")


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any) -> torch.Tensor:
    global _compiled_flex
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        return _compiled_flex(q, k, v, block_mask=block_mask)
    return flex_attention(q, k, v, block_mask=block_mask)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: Any = None,
    mask_mod: MaskMod | None = None,
    impl: str | None = "auto",
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Masked attention. q ``[B, H, Sq, Dh]``, k/v ``[B, H, Sk, Dh]`` -> ``[B, H, Sq, Dh]``.

    Pass either a prepared ``mask`` (from :func:`prepare_mask`: bool ``[B, 1, Sq, Sk]`` or a
    BlockMask) or a ``mask_mod``. Every query row must see at least one key.
    """
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention: bad shapes q={tuple(q.shape)} k={tuple(k.shape)} v={tuple(v.shape)}")
    b, _, sq, _ = q.shape
    sk = k.shape[2]
    if mask is None:
        if mask_mod is None:
            raise ValueError("attention: pass mask= or mask_mod=")
        mask = prepare_mask(mask_mod, b, sq, sk, resolve_impl(impl, q.device, b * sq * sk), q.device)
    if isinstance(mask, ItemBlockMask):
        return _item_block(q, k, v, mask)
    if isinstance(mask, CausalMask):
        if sq != sk:
            raise ValueError(f"attention: CausalMask needs as many keys as queries, got Sq={sq}, Sk={sk}")
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if isinstance(mask, torch.Tensor):
        if mask.shape[-2:] != (sq, sk):
            raise ValueError(f"attention: mask shape {tuple(mask.shape)} does not match Sq={sq}, Sk={sk}")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if dropout_p > 0.0:
        raise ValueError("attention: the flex path has no attention dropout; set dropout_p=0")
    return _flex(q, k, v, mask)


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain attention returning ``(out [B, H, Sq, Dh], lse [B, H, Sq])`` (natural-log sum-exp).

    ``mask`` is bool, broadcastable to ``[B, H, Sq, Sk]``. A row with no visible key returns
    out = 0 and lse = -inf, so it drops out of :func:`merge_attention`.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [B, H, Sq, Sk]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, H, Sq]
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - safe[..., None])  # masked -> exp(-inf) = 0
    out = torch.matmul(p, v.float())
    return out.to(q.dtype), lse


def merge_attention(
    out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online-softmax merge of attention over two disjoint key sets -> ``(out, lse)``."""
    lse = torch.logaddexp(lse1.float(), lse2.float())  # [B, H, Sq]
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w1 = torch.exp(lse1.float() - safe)[..., None]
    w2 = torch.exp(lse2.float() - safe)[..., None]
    out = out1.float() * w1 + out2.float() * w2
    return out.to(out1.dtype), lse
