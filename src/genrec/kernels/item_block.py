"""PinGER item-block attention in Triton: forward + backward (PinGER §3.3.4, mask rules §3.3.2).

Non-standard here: the mask (see ``reference.item_block_mask``) is neither causal nor sparse
in FlexAttention's sense -- every block below the diagonal holds dense columns, so no block can
be skipped. Instead each query block holds WHOLE items (``BLOCK_ITEMS`` items x ``T`` tokens,
padded to the power of two ``BLOCK_M``) and attention splits in two parts:

1. every query of the block attends, UNMASKED, to the dense tokens of all items before the
   block. The dense K/V are read through a strided view ``k[:, :, T-1::T]`` -- i.e. the gathered
   compact ``[B, H, n_items, D]`` tensor without a copy -- in a plain flash loop;
2. a small masked attention of the block's queries against the block's own tokens.

Both parts feed the same running max / running sum (online softmax), in fp32, so the result
equals one softmax over all visible keys. The backward pass is three Triton kernels (no
recomputation in PyTorch): ``dq`` per query block (the same two parts, recomputing P from the
saved logsumexp); ``dk/dv`` of SID keys per item block (an SID key is read only inside its own
item); ``dk/dv`` of dense keys in tiles of ``BLOCK_M`` dense keys against every later query
token (item-causal, masked only near the diagonal). The two dk/dv kernels write disjoint rows.

Layout: q, k, v ``[B, H, S, D]``, ``S = n_items * T``; token s is item ``s // T``, slot
``s % T``; slots ``0..T-2`` are SID levels, slot ``T-1`` the dense token. ``lengths`` int ``[B]``
valid items per row; padding keys are invisible, padding query rows output 0 (their logsumexp
is stored as 0). Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["item_block_attention", "item_block_attention_fwd", "ItemBlockAttention"]

_LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # IEEE: exact fp32 products for fp32 inputs (no tf32). UPCAST only under TRITON_INTERPRET=1,
    # whose tl.dot mis-handles bf16 operands (values blow up); on a GPU it is always False.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _item_block_fwd_kernel(
    Q, K, V, O, LSE, LENGTHS,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos, slb, slh,
    H, S, qk_scale,
    T: tl.constexpr, BLOCK_ITEMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest (latest) query blocks first
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(LENGTHS + b)
    item0 = pid_m * BLOCK_ITEMS
    rows = tl.arange(0, BLOCK_M)
    in_block = rows < BLOCK_ITEMS * T
    tok = item0 * T + rows  # [BLOCK_M]
    q_item = item0 + rows // T
    q_dense = (rows % T) == T - 1
    q_slot = rows % T
    row_ok = in_block & (q_item < n_valid)
    offs_d = tl.arange(0, D)

    q = tl.load(Q + b * sqb + h * sqh + tok[:, None] * sqs + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [BM, D]
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # Part 1: unmasked flash loop over the dense tokens of items [0, item0) (all valid if the block is).
    hi = tl.where(item0 < n_valid, item0, 0)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, hi, BLOCK_N):
        n_idx = start + offs_n  # item index of each dense key  [BN]
        n_ok = n_idx < hi
        dtok = n_idx * T + (T - 1)
        kd = tl.load(K + b * skb + h * skh + dtok[:, None] * sks + offs_d[None, :], mask=n_ok[:, None], other=0.0)  # [BN, D]
        vd = tl.load(V + b * svb + h * svh + dtok[:, None] * svs + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        s = _dot(q, tl.trans(kd), IEEE, UPCAST) * qk_scale  # [BM, BN], log2 domain
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(vd.dtype), vd, IEEE, UPCAST)
        m_i = m_new

    # Part 2: masked attention of the block's queries against the block's own tokens.
    k_item = q_item  # same token range: keys are indexed by the same `rows`
    k_ok = row_ok
    kb = tl.load(K + b * skb + h * skh + tok[:, None] * sks + offs_d[None, :], mask=k_ok[:, None], other=0.0)  # [BM, D]
    vb = tl.load(V + b * svb + h * svh + tok[:, None] * svs + offs_d[None, :], mask=k_ok[:, None], other=0.0)
    s = _dot(q, tl.trans(kb), IEEE, UPCAST) * qk_scale  # [BM(q), BM(k)]
    qi = q_item[:, None]
    ki = k_item[None, :]
    qd = q_dense[:, None]
    kd_ = q_dense[None, :]
    vis_dense = kd_ & ((qd & (ki <= qi)) | ((~qd) & (ki < qi)))
    vis_sid = (~kd_) & (~qd) & (ki == qi) & (q_slot[None, :] <= q_slot[:, None])
    vis = (vis_dense | vis_sid) & row_ok[:, None] & k_ok[None, :]
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(vb.dtype), vb, IEEE, UPCAST)
    m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    out = tl.where(row_ok[:, None], out, 0.0)
    lse = tl.where(row_ok, (m_i + tl.log2(l_safe)) / 1.4426950408889634, 0.0)  # natural-log LSE
    st_ok = in_block & (tok < S)
    tl.store(O + b * sob + h * soh + tok[:, None] * sos + offs_d[None, :], out.to(O.dtype.element_ty), mask=st_ok[:, None])
    tl.store(LSE + b * slb + h * slh + tok, lse, mask=st_ok)


@triton.jit
def _item_block_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, LENGTHS,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos, slb, slh, sdqb, sdqh, sdqs,
    H, S, qk_scale, sm_scale,
    T: tl.constexpr, BLOCK_ITEMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest (latest) query blocks first
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(LENGTHS + b)
    item0 = pid_m * BLOCK_ITEMS
    rows = tl.arange(0, BLOCK_M)
    in_block = rows < BLOCK_ITEMS * T
    tok = item0 * T + rows
    q_item = item0 + rows // T
    q_slot = rows % T
    q_dense = q_slot == T - 1
    row_ok = in_block & (q_item < n_valid)
    offs_d = tl.arange(0, D)

    q = tl.load(Q + b * sqb + h * sqh + tok[:, None] * sqs + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [BM, D]
    do = tl.load(DO + b * sdob + h * sdoh + tok[:, None] * sdos + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    lse2 = tl.load(LSE + b * slb + h * slh + tok, mask=row_ok, other=0.0) * 1.4426950408889634  # [BM]
    delta = tl.load(DELTA + b * slb + h * slh + tok, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)

    hi = tl.where(item0 < n_valid, item0, 0)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, hi, BLOCK_N):
        n_idx = start + offs_n
        n_ok = n_idx < hi
        dtok = n_idx * T + (T - 1)
        kd = tl.load(K + b * skb + h * skh + dtok[:, None] * sks + offs_d[None, :], mask=n_ok[:, None], other=0.0)  # [BN, D]
        vd = tl.load(V + b * svb + h * svh + dtok[:, None] * svs + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        s = _dot(q, tl.trans(kd), IEEE, UPCAST) * qk_scale
        p = tl.exp2(s - lse2[:, None])
        p = tl.where(n_ok[None, :] & row_ok[:, None], p, 0.0)  # [BM, BN]
        dp = _dot(do, tl.trans(vd), IEEE, UPCAST)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(kd.dtype), kd, IEEE, UPCAST)

    kb = tl.load(K + b * skb + h * skh + tok[:, None] * sks + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    vb = tl.load(V + b * svb + h * svh + tok[:, None] * svs + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    s = _dot(q, tl.trans(kb), IEEE, UPCAST) * qk_scale
    qi = q_item[:, None]
    ki = q_item[None, :]
    qd = q_dense[:, None]
    kd_ = q_dense[None, :]
    vis_dense = kd_ & ((qd & (ki <= qi)) | ((~qd) & (ki < qi)))
    vis_sid = (~kd_) & (~qd) & (ki == qi) & (q_slot[None, :] <= q_slot[:, None])
    vis = (vis_dense | vis_sid) & row_ok[:, None] & row_ok[None, :]
    p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
    dp = _dot(do, tl.trans(vb), IEEE, UPCAST)
    ds = p * (dp - delta[:, None])
    dq += _dot(ds.to(kb.dtype), kb, IEEE, UPCAST)

    dq = dq * sm_scale
    st_ok = in_block & (tok < S)
    tl.store(DQ + b * sdqb + h * sdqh + tok[:, None] * sdqs + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=st_ok[:, None])


@triton.jit
def _item_block_bwd_sid_kv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, LENGTHS,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos, slb, slh,
    sdkb, sdkh, sdks, sdvb, sdvh, sdvs,
    H, S, qk_scale, sm_scale,
    T: tl.constexpr, BLOCK_ITEMS: tl.constexpr, BLOCK_M: tl.constexpr,
    D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    # dk/dv of SID keys: an SID key is read only by its own item's SID queries of level >= its
    # own, so each program handles one block of whole items, masked, and stores the SID rows.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(LENGTHS + b)
    item0 = pid_m * BLOCK_ITEMS
    rows = tl.arange(0, BLOCK_M)
    in_block = rows < BLOCK_ITEMS * T
    tok = item0 * T + rows
    r_item = item0 + rows // T
    r_slot = rows % T
    r_sid = r_slot < T - 1
    r_ok = in_block & (r_item < n_valid) & r_sid
    offs_d = tl.arange(0, D)

    k = tl.load(K + b * skb + h * skh + tok[:, None] * sks + offs_d[None, :], mask=r_ok[:, None], other=0.0)  # [BM, D]
    v = tl.load(V + b * svb + h * svh + tok[:, None] * svs + offs_d[None, :], mask=r_ok[:, None], other=0.0)
    q = tl.load(Q + b * sqb + h * sqh + tok[:, None] * sqs + offs_d[None, :], mask=r_ok[:, None], other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + tok[:, None] * sdos + offs_d[None, :], mask=r_ok[:, None], other=0.0)
    lse2 = tl.load(LSE + b * slb + h * slh + tok, mask=r_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + b * slb + h * slh + tok, mask=r_ok, other=0.0)
    st = _dot(k, tl.trans(q), IEEE, UPCAST) * qk_scale  # [BM(k), BM(q)]
    vis = (r_item[:, None] == r_item[None, :]) & (r_slot[:, None] <= r_slot[None, :]) & r_ok[:, None] & r_ok[None, :]
    pt = tl.where(vis, tl.exp2(st - lse2[None, :]), 0.0)  # [BM(k), BM(q)]
    dv = _dot(pt.to(do.dtype), do, IEEE, UPCAST)  # [BM, D]
    dpt = _dot(v, tl.trans(do), IEEE, UPCAST)
    dst = pt * (dpt - delta[None, :])
    dk = _dot(dst.to(q.dtype), q, IEEE, UPCAST) * sm_scale
    st_ok = in_block & (tok < S) & r_sid
    tl.store(DK + b * sdkb + h * sdkh + tok[:, None] * sdks + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=st_ok[:, None])
    tl.store(DV + b * sdvb + h * sdvh + tok[:, None] * sdvs + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=st_ok[:, None])


@triton.jit
def _item_block_bwd_dense_kv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, LENGTHS,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos, slb, slh,
    sdkb, sdkh, sdks, sdvb, sdvh, sdvs,
    H, N_ITEMS, qk_scale, sm_scale,
    T: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_Q: tl.constexpr,
    D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    # dk/dv of dense keys: dense key j is read by the dense queries of items >= j and the SID
    # queries of items > j -- whichever forward part (unmasked gather or in-block) served them.
    # BLOCK_I dense keys (the compact strided view k[:, :, T-1::T]) per program, a flash-style
    # loop over every query token from item j0 on; only the first BLOCK_I items' worth is masked.
    pid_i = tl.program_id(0)  # heaviest (earliest) keys first: most later queries
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(LENGTHS + b)
    j0 = pid_i * BLOCK_I
    offs_i = tl.arange(0, BLOCK_I)
    j = j0 + offs_i  # item index of each dense key  [BI]
    j_ok = j < n_valid
    dtok = j * T + (T - 1)
    offs_d = tl.arange(0, D)
    kd = tl.load(K + b * skb + h * skh + dtok[:, None] * sks + offs_d[None, :], mask=j_ok[:, None], other=0.0)  # [BI, D]
    vd = tl.load(V + b * svb + h * svh + dtok[:, None] * svs + offs_d[None, :], mask=j_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_I, D], tl.float32)
    dv = tl.zeros([BLOCK_I, D], tl.float32)
    q_hi = n_valid * T
    offs_q = tl.arange(0, BLOCK_Q)
    for start in range(j0 * T, q_hi, BLOCK_Q):
        qt = start + offs_q  # query tokens  [BQ]
        q_ok = qt < q_hi
        q_item = qt // T
        q_dense = (qt % T) == T - 1
        qq = tl.load(Q + b * sqb + h * sqh + qt[:, None] * sqs + offs_d[None, :], mask=q_ok[:, None], other=0.0)  # [BQ, D]
        qdo = tl.load(DO + b * sdob + h * sdoh + qt[:, None] * sdos + offs_d[None, :], mask=q_ok[:, None], other=0.0)
        l2 = tl.load(LSE + b * slb + h * slh + qt, mask=q_ok, other=0.0) * 1.4426950408889634
        dl = tl.load(DELTA + b * slb + h * slh + qt, mask=q_ok, other=0.0)
        st = _dot(kd, tl.trans(qq), IEEE, UPCAST) * qk_scale  # [BI, BQ]
        vis = (q_dense[None, :] & (j[:, None] <= q_item[None, :])) | ((~q_dense[None, :]) & (j[:, None] < q_item[None, :]))
        vis = vis & j_ok[:, None] & q_ok[None, :]
        pt = tl.where(vis, tl.exp2(st - l2[None, :]), 0.0)
        dv += _dot(pt.to(qdo.dtype), qdo, IEEE, UPCAST)
        dpt = _dot(vd, tl.trans(qdo), IEEE, UPCAST)
        dst = pt * (dpt - dl[None, :])
        dk += _dot(dst.to(qq.dtype), qq, IEEE, UPCAST)
    dk = dk * sm_scale
    st_ok = j < N_ITEMS  # padding items' rows are written too (as zeros)
    tl.store(DK + b * sdkb + h * sdkh + dtok[:, None] * sdks + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=st_ok[:, None])
    tl.store(DV + b * sdvb + h * sdvh + dtok[:, None] * sdvs + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=st_ok[:, None])


def _empty(shape: tuple[int, ...] | torch.Size, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Output allocation (contiguous, uninitialised); tests swap it for a NaN-filled one."""
    return torch.empty(tuple(shape), device=like.device, dtype=dtype or like.dtype)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, T: int) -> int:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v: expected equal [B, H, S, D] shapes, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v: expected one dtype among fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, S, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"q: head dim D must be a power of two >= 16, got {D}")
    if T < 1 or S % T:
        raise ValueError(f"T: sequence length {S} is not a multiple of tokens per item T={T}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name}: last dim must be contiguous (stride 1), got strides {x.stride()}")
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("item_block_attention: Triton needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); use reference.item_block_attention_ref")
    if lengths.dim() != 1 or lengths.shape[0] != B:
        raise ValueError(f"lengths: expected shape [{B}], got {tuple(lengths.shape)}")
    n_items = S // T
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > n_items):
        raise ValueError(f"lengths: values must lie in [0, {n_items}], got {lengths.tolist()}")
    return n_items


def _upcast(x: torch.Tensor) -> bool:
    """True when the Triton interpreter runs this dtype: its tl.dot is wrong for bf16, so upcast."""
    return os.environ.get("TRITON_INTERPRET") == "1" and x.dtype == torch.bfloat16


def _default_warps(D: int) -> int:
    return 4 if D <= 64 else 8


def _blocks(T: int, block_m: int) -> tuple[int, int]:
    block_m = max(16, _next_pow2(max(block_m, T)))
    return block_m, block_m // T


def item_block_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    T: int,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only: returns ``out [B, H, S, D]`` (q's dtype) and natural-log ``lse [B, H, S]`` fp32."""
    lengths = torch.as_tensor(lengths, device=q.device).to(torch.int32).contiguous()
    n_items = _check_inputs(q, k, v, lengths, T)
    B, H, S, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    BLOCK_M, BLOCK_ITEMS = _blocks(T, block_m)
    BLOCK_N = max(16, _next_pow2(block_n))
    out = _empty(q.shape, q)
    lse = _empty((B, H, S), q, torch.float32)
    if out.numel() == 0:
        return out, lse.zero_()
    grid = (triton.cdiv(n_items, BLOCK_ITEMS), B * H)
    _item_block_fwd_kernel[grid](
        q, k, v, out, lse, lengths,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1),
        H, S, scale * _LOG2E,
        T=T, BLOCK_ITEMS=BLOCK_ITEMS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=D,
        IEEE=q.dtype == torch.float32, UPCAST=_upcast(q),
        num_warps=num_warps or _default_warps(D),
    )
    return out, lse


def _item_block_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, lengths: torch.Tensor, T: int, scale: float, block_m: int, block_n: int,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, S, D = q.shape
    n_items = S // T
    if do.stride(-1) != 1:
        do = do.contiguous()
    delta = (do.float() * out.float()).sum(-1).contiguous()  # [B, H, S]
    BLOCK_M, BLOCK_ITEMS = _blocks(T, block_m)
    BLOCK_N = max(16, _next_pow2(block_n))
    BLOCK_I = BLOCK_M  # dense keys per program of the dense dk/dv kernel
    dq, dk, dv = _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)
    if dq.numel() == 0:
        return dq, dk, dv
    grid = (triton.cdiv(n_items, BLOCK_ITEMS), B * H)
    common = (
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        lse.stride(0), lse.stride(1),
    )
    kv_strides = (dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2))
    _item_block_bwd_dq_kernel[grid](
        q, k, v, do, lse, delta, dq, lengths, *common,
        dq.stride(0), dq.stride(1), dq.stride(2),
        H, S, scale * _LOG2E, scale,
        T=T, BLOCK_ITEMS=BLOCK_ITEMS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=D, IEEE=q.dtype == torch.float32, UPCAST=_upcast(q),
        num_warps=num_warps or _default_warps(D),
    )
    if T > 1:
        _item_block_bwd_sid_kv_kernel[grid](
            q, k, v, do, lse, delta, dk, dv, lengths, *common, *kv_strides,
            H, S, scale * _LOG2E, scale,
            T=T, BLOCK_ITEMS=BLOCK_ITEMS, BLOCK_M=BLOCK_M, D=D, IEEE=q.dtype == torch.float32, UPCAST=_upcast(q),
            num_warps=num_warps or _default_warps(D),
        )
    _item_block_bwd_dense_kv_kernel[(triton.cdiv(n_items, BLOCK_I), B * H)](
        q, k, v, do, lse, delta, dk, dv, lengths, *common, *kv_strides,
        H, n_items, scale * _LOG2E, scale,
        T=T, BLOCK_I=BLOCK_I, BLOCK_Q=BLOCK_N, D=D, IEEE=q.dtype == torch.float32, UPCAST=_upcast(q),
        num_warps=num_warps or _default_warps(D),
    )
    return dq, dk, dv


class ItemBlockAttention(torch.autograd.Function):
    """Autograd wrapper: Triton forward (saves out + lse) and Triton backward (dq, dk, dv)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, T: int,
        scale: float | None = None, block_m: int = 64, block_n: int = 64, num_warps: int | None = None,
    ) -> torch.Tensor:
        lengths = torch.as_tensor(lengths, device=q.device).to(torch.int32).contiguous()
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        out, lse = item_block_attention_fwd(q, k, v, lengths, T, scale, block_m, block_n, num_warps)
        ctx.save_for_backward(q, k, v, out, lse, lengths)
        ctx.cfg = (T, scale, block_m, block_n, num_warps)
        return out

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse, lengths = ctx.saved_tensors
        T, scale, block_m, block_n, num_warps = ctx.cfg
        dq, dk, dv = _item_block_bwd(q, k, v, out, lse, do, lengths, T, scale, block_m, block_n, num_warps)
        return dq, dk, dv, None, None, None, None, None, None


def item_block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    T: int,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int | None = None,
) -> torch.Tensor:
    """PinGER item-block attention (Triton). q, k, v ``[B, H, S, D]``, lengths int ``[B]`` -> ``[B, H, S, D]``.

    Same contract as ``reference.item_block_attention_ref``; differentiable in q, k, v.
    ``block_m`` tokens per query block (rounded to a power of two; holds ``block_m // T`` whole
    items), ``block_n`` dense keys per step of the unmasked loop; ``num_warps`` defaults to 4
    (D <= 64) or 8.
    """
    return ItemBlockAttention.apply(q, k, v, lengths, T, scale, block_m, block_n, num_warps)
