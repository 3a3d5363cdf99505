"""Cascade attention for beam-search decoding over a shared history (PinGER, serving: cascade attention).

Non-standard here: the W beams of one request share the same history KV; only their short
SID suffixes (t tokens each) differ. Instead of expanding the history KV W times (per-beam SDPA
reads it W times), the W*t beam queries of a request are treated as ONE batch of queries against
the request's history -- one pass over the history per request -- and then each beam attends to
its own causal suffix. The two partial results are merged exactly with their log-sum-exps:
``lse = logaddexp(lse_h, lse_s)``, ``out = out_h * exp(lse_h - lse) + out_s * exp(lse_s - lse)``.

Two implementations with the same signature as ``reference.cascade_attention_ref``:
``cascade_attention_torch`` (two explicit passes + LSE merge, differentiable, any device) and
``cascade_attention_triton`` (one forward-only kernel: query blocks hold whole beams, an unmasked
flash loop over the history, then a block-diagonal causal part over the block's own suffixes --
both in one online softmax). ``cascade_attention`` picks Triton for CUDA tensors without grad.
The paper reports 4.25x over paged attention at W=10 and 32x at W=400; the benchmark
``benchmarks/bench_kernels.py`` measures ours against per-beam SDPA over expanded KV.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from genrec.kernels.item_block import _dot
from genrec.kernels.reference import _check_lengths

__all__ = ["cascade_attention", "cascade_attention_torch", "cascade_attention_triton"]

_LOG2E = 1.4426950408889634


def _check(q: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor, k_suf: torch.Tensor, v_suf: torch.Tensor,
           hist_len: torch.Tensor | list[int]) -> torch.Tensor:
    if q.dim() != 5 or k_suf.shape != q.shape or v_suf.shape != q.shape:
        raise ValueError(f"q, k_suf, v_suf: expected equal [B, W, H, t, D] shapes, got {tuple(q.shape)}, {tuple(k_suf.shape)}, {tuple(v_suf.shape)}")
    B, W, H, t, D = q.shape
    if k_hist.dim() != 4 or k_hist.shape != v_hist.shape or k_hist.shape[0] != B or k_hist.shape[1] != H or k_hist.shape[3] != D:
        raise ValueError(f"k_hist, v_hist: expected [B={B}, H={H}, n, D={D}], got {tuple(k_hist.shape)}, {tuple(v_hist.shape)}")
    return _check_lengths(hist_len, B, k_hist.shape[2], q.device, name="hist_len")


def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention restricted to ``mask`` in fp32; returns (out, lse), with out = 0, lse = -inf on empty rows."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [..., Mq, Mk]
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [..., Mq]
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    return torch.matmul(p, v.float()), lse


def cascade_attention_torch(
    q: torch.Tensor,
    k_hist: torch.Tensor,
    v_hist: torch.Tensor,
    k_suf: torch.Tensor,
    v_suf: torch.Tensor,
    hist_len: torch.Tensor | list[int],
    scale: float | None = None,
) -> torch.Tensor:
    """Two-pass PyTorch cascade attention. q, k_suf, v_suf ``[B, W, H, t, D]``; k_hist, v_hist ``[B, H, n, D]``.

    Returns ``[B, W, H, t, D]`` in q's dtype. Differentiable.
    """
    hl = _check(q, k_hist, v_hist, k_suf, v_suf, hist_len)
    B, W, H, t, D = q.shape
    n = k_hist.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    # Pass 1: all W*t beam queries of a request as one query batch against its history.
    qh = q.permute(0, 2, 1, 3, 4).reshape(B, H, W * t, D)  # [B, H, W*t, D]
    hist_ok = (torch.arange(n, device=q.device)[None, :] < hl[:, None])[:, None, None, :]  # [B, 1, 1, n]
    out_h, lse_h = _partial(qh, k_hist, v_hist, hist_ok, scale)  # [B, H, W*t, D], [B, H, W*t]
    out_h = out_h.reshape(B, H, W, t, D).permute(0, 2, 1, 3, 4)  # [B, W, H, t, D]
    lse_h = lse_h.reshape(B, H, W, t).permute(0, 2, 1, 3)  # [B, W, H, t]
    # Pass 2: each beam against its own suffix, causal.
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    out_s, lse_s = _partial(q, k_suf, v_suf, causal, scale)  # [B, W, H, t, D], [B, W, H, t]
    lse = torch.logaddexp(lse_h, lse_s)  # finite: the suffix diagonal is always visible
    out = out_h * torch.exp(lse_h - lse)[..., None] + out_s * torch.exp(lse_s - lse)[..., None]
    return out.to(q.dtype)


def _empty(like: torch.Tensor) -> torch.Tensor:
    """Output allocation (contiguous, uninitialised); tests swap it for a NaN-filled one."""
    return torch.empty(like.shape, device=like.device, dtype=like.dtype)


@triton.jit
def _cascade_fwd_kernel(
    Q, KH, VH, KS, VS, O, HLEN,
    sqb, sqw, sqh, sqt, skhb, skhh, skhn, svhb, svhh, svhn,
    sksb, sksw, sksh, skst, svsb, svsw, svsh, svst, sob, sow, soh, sot,
    H, W, qk_scale,
    TS: tl.constexpr, BEAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(HLEN + b)
    rows = tl.arange(0, BLOCK_M)
    beam = pid_m * BEAMS + rows // TS
    pos = rows % TS
    row_ok = (rows < BEAMS * TS) & (beam < W)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + beam[:, None] * sqw + h * sqh + pos[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [BM, D]
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # Shared history: one unmasked flash pass for all beams in the block.
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_valid, BLOCK_N):
        n_idx = start + offs_n
        n_ok = n_idx < n_valid
        kh = tl.load(KH + b * skhb + h * skhh + n_idx[:, None] * skhn + offs_d[None, :], mask=n_ok[:, None], other=0.0)  # [BN, D]
        vh = tl.load(VH + b * svhb + h * svhh + n_idx[:, None] * svhn + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        s = _dot(q, tl.trans(kh), IEEE, UPCAST) * qk_scale  # [BM, BN]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = _dot(p.to(vh.dtype), vh, IEEE, UPCAST)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # Own suffix: block-diagonal causal mask over the block's beams.
    ks = tl.load(KS + b * sksb + beam[:, None] * sksw + h * sksh + pos[:, None] * skst + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    vs = tl.load(VS + b * svsb + beam[:, None] * svsw + h * svsh + pos[:, None] * svst + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    s = _dot(q, tl.trans(ks), IEEE, UPCAST) * qk_scale  # [BM, BM]
    vis = (beam[:, None] == beam[None, :]) & (pos[None, :] <= pos[:, None]) & row_ok[:, None] & row_ok[None, :]
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pv = _dot(p.to(vs.dtype), vs, IEEE, UPCAST)
    acc = acc * alpha[:, None] + pv
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(O + b * sob + beam[:, None] * sow + h * soh + pos[:, None] * sot + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])


def cascade_attention_triton(
    q: torch.Tensor,
    k_hist: torch.Tensor,
    v_hist: torch.Tensor,
    k_suf: torch.Tensor,
    v_suf: torch.Tensor,
    hist_len: torch.Tensor | list[int],
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Forward-only Triton cascade attention (no autograd); same contract as ``cascade_attention_torch``.

    ``block_m`` query rows per program (a power of two holding ``block_m // t`` whole beams),
    ``block_n`` history keys per step.
    """
    hl = _check(q, k_hist, v_hist, k_suf, v_suf, hist_len).to(torch.int32).contiguous()
    B, W, H, t, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"q: head dim D must be a power of two >= 16, got {D}")
    tensors = (q, k_hist, v_hist, k_suf, v_suf)
    if len({x.dtype for x in tensors}) != 1 or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v: expected one dtype among fp16/bf16/fp32, got {[x.dtype for x in tensors]}")
    if any(x.stride(-1) != 1 for x in tensors):
        raise ValueError("q, k_hist, v_hist, k_suf, v_suf: last dim must be contiguous (stride 1)")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if not q.is_cuda and not interp:
        raise RuntimeError("cascade_attention_triton: needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); use cascade_attention_torch")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    # Few beams: shrink the query block so more programs run (never below one beam or 16 rows).
    block_m = min(block_m, max(16, W * t))
    BLOCK_M = max(16, 1 << max(0, (max(block_m, t) - 1).bit_length()))
    BEAMS = BLOCK_M // t
    BLOCK_N = max(16, 1 << max(0, (block_n - 1).bit_length()))
    out = _empty(q)
    grid = (triton.cdiv(W, BEAMS), B * H)
    _cascade_fwd_kernel[grid](
        q, k_hist, v_hist, k_suf, v_suf, out, hl,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k_hist.stride(0), k_hist.stride(1), k_hist.stride(2), v_hist.stride(0), v_hist.stride(1), v_hist.stride(2),
        k_suf.stride(0), k_suf.stride(1), k_suf.stride(2), k_suf.stride(3),
        v_suf.stride(0), v_suf.stride(1), v_suf.stride(2), v_suf.stride(3),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        H, W, scale * _LOG2E,
        TS=t, BEAMS=BEAMS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=D,
        IEEE=q.dtype == torch.float32, UPCAST=interp and q.dtype == torch.bfloat16,
        num_warps=num_warps or (4 if D <= 64 else 8),
    )
    return out


def cascade_attention(
    q: torch.Tensor,
    k_hist: torch.Tensor,
    v_hist: torch.Tensor,
    k_suf: torch.Tensor,
    v_suf: torch.Tensor,
    hist_len: torch.Tensor | list[int],
    scale: float | None = None,
) -> torch.Tensor:
    """Cascade attention: Triton kernel for CUDA tensors when no grad is needed, else the PyTorch two-pass version."""
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k_hist, v_hist, k_suf, v_suf))
    if q.is_cuda and not needs_grad:
        return cascade_attention_triton(q, k_hist, v_hist, k_suf, v_suf, hist_len, scale)
    return cascade_attention_torch(q, k_hist, v_hist, k_suf, v_suf, hist_len, scale)
