"""SID fusion's attention as one Triton kernel per pass (PinGER §3.3.2, SID fusion).

The fusion layer gives each item's dense token one query over L + 1 keys: the item's L SID
tokens and the dense token itself (``genrec.model.fusion``). A SID token's key and value depend
only on its (level, code), so the model projects each codebook row once per call
(``kv_rows [R, 2D]``: keys in columns ``[0, D)``, values in ``[D, 2D)``) and names every item's
SID rows by index (``rows [N, L]``). The dense token's own key and value are per item
(``kv_dense [N, 2D]``).

Non-standard here: done in PyTorch this attention is a handful of elementwise passes over a
gathered ``[N, L+1, 2D]`` tensor (and their backward, and the embedding backward that scatters the
gathered rows' gradients), each a full trip through memory; at 8,192 items and d 768 that took
most of the layer's GPU time. Here the forward gathers the L + 1 keys and values of a block of
items inside the kernel (the codebook rows stay in L2), keeps the softmax in registers and writes
the output and one log-sum-exp per (item, head); the backward recomputes the probabilities from
it (and its own fp32 delta) and adds the SID rows' gradients into an fp32 ``[R, 2D]`` buffer with
atomics (so the sum's order, and its last bits, vary from run to run: under
``torch.use_deterministic_algorithms`` the model takes the PyTorch path instead).

``fusion_attention_torch`` (in ``reference``, importable without Triton) is the PyTorch twin with
the same signature (gather, then softmax in fp32); ``fusion_attention`` runs the kernels, differentiable in ``q``, ``kv_rows`` and
``kv_dense``, and under ``torch.compile`` as the ``genrec::sid_fusion_fwd`` / ``_bwd`` custom ops.
Attention-probability dropout comes as a keep mask ``[N, H, L+1]`` drawn by the caller, applied
after the softmax as ``F.dropout`` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from genrec.kernels import item_block  # its _empty: the output allocation that tests poison
from genrec.kernels.reference import check_fusion_inputs as _check
from genrec.kernels.reference import dropout_keep, fusion_attention_torch
from genrec.validation import checks_on

__all__ = ["fusion_attention", "fusion_attention_torch", "dropout_keep"]


@triton.jit
def _keep(KEEP, n, nm, h, lvl, H: tl.constexpr, L: tl.constexpr):
    return tl.load(KEEP + (n.to(tl.int64) * H + h) * (L + 1) + lvl, mask=nm, other=0).to(tl.float32)


@triton.jit
def _key_value(KVR, ROWS, KVD, n64, nm, col, lvl: tl.constexpr, D: tl.constexpr, L: tl.constexpr):
    # key and value [BN, DH] (fp32) of slot lvl for a block of items: SID level lvl < L, else the dense token
    if lvl < L:
        r = tl.load(ROWS + n64 * L + lvl, mask=nm, other=0)
        base = KVR + r.to(tl.int64)[:, None] * (2 * D) + col[None, :]
    else:
        r = n64
        base = KVD + n64[:, None] * (2 * D) + col[None, :]
    k = tl.load(base, mask=nm[:, None], other=0.0).to(tl.float32)
    v = tl.load(base + D, mask=nm[:, None], other=0.0).to(tl.float32)
    return r, k, v


@triton.jit
def _items(N, BN: tl.constexpr, DH: tl.constexpr):
    # this program's head, its block of BN items (int64 too, and which exist), and the head's columns
    h = tl.program_id(1)
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    return h, n, n.to(tl.int64), n < N, h * DH + tl.arange(0, DH)


@triton.jit
def _fusion_fwd_kernel(Q, KVR, ROWS, KVD, KEEP, O, LSE, N, qk_scale, keep_scale,
                       H: tl.constexpr, D: tl.constexpr, DH: tl.constexpr, L: tl.constexpr, BN: tl.constexpr,
                       HAS_KEEP: tl.constexpr):
    # one block of BN items x one head: the L + 1 keys in an online softmax (log2 domain), the dense
    # key first; the output and the natural-log lse per (item, head)
    h, n, n64, nm, col = _items(N, BN, DH)
    q = tl.load(Q + n64[:, None] * D + col[None, :], mask=nm[:, None], other=0.0).to(tl.float32)
    _, k, v = _key_value(KVR, ROWS, KVD, n64, nm, col, L, D, L)
    m = tl.sum(q * k, 1) * qk_scale
    z = tl.full([BN], 1.0, tl.float32)
    w = z
    if HAS_KEEP:
        w = _keep(KEEP, n, nm, h, L, H, L) * keep_scale
    acc = w[:, None] * v
    for lvl in tl.static_range(L):
        _, k, v = _key_value(KVR, ROWS, KVD, n64, nm, col, lvl, D, L)
        s = tl.sum(q * k, 1) * qk_scale
        m_new = tl.maximum(m, s)
        alpha = tl.exp2(m - m_new)
        e = tl.exp2(s - m_new)
        z = z * alpha + e
        if HAS_KEEP:
            e = e * _keep(KEEP, n, nm, h, lvl, H, L) * keep_scale
        acc = acc * alpha[:, None] + e[:, None] * v
        m = m_new
    tl.store(O + n64[:, None] * D + col[None, :], (acc / z[:, None]).to(O.dtype.element_ty), mask=nm[:, None])
    tl.store(LSE + n64 * H + h, (m + tl.log2(z)) * 0.6931471805599453, mask=nm)


@triton.jit
def _fusion_bwd_kernel(Q, KVR, ROWS, KVD, KEEP, LSE, DO, DQ, DKVR, DKVD, N, qk_scale, sm_scale, keep_scale,
                       H: tl.constexpr, D: tl.constexpr, DH: tl.constexpr, L: tl.constexpr, BN: tl.constexpr,
                       HAS_KEEP: tl.constexpr):
    # Two passes over the L + 1 keys (their rows stay in L2): the first recomputes p from lse and sums
    # delta = sum_l p_l dP_l in fp32 (from the bf16 output, as FlashAttention does, it lost up to ~2%
    # of dq where the few terms of dS cancel); the second forms dS = p (dP - delta), dq, and the keys'
    # and values' gradients -- the SID rows' added into the fp32 DKVR with atomics.
    h, n, n64, nm, col = _items(N, BN, DH)
    tile = n64[:, None] * D + col[None, :]
    q = tl.load(Q + tile, mask=nm[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + tile, mask=nm[:, None], other=0.0).to(tl.float32)
    lse2 = tl.load(LSE + n64 * H + h, mask=nm, other=0.0) * 1.4426950408889634
    delta = tl.zeros([BN], tl.float32)
    for lvl in tl.static_range(L + 1):
        r, k, v = _key_value(KVR, ROWS, KVD, n64, nm, col, lvl, D, L)
        dp = tl.sum(do * v, 1)
        if HAS_KEEP:
            dp = dp * _keep(KEEP, n, nm, h, lvl, H, L) * keep_scale
        delta += tl.exp2(tl.sum(q * k, 1) * qk_scale - lse2) * dp
    dq = tl.zeros([BN, DH], tl.float32)
    for lvl in tl.static_range(L + 1):
        r, k, v = _key_value(KVR, ROWS, KVD, n64, nm, col, lvl, D, L)
        p = tl.where(nm, tl.exp2(tl.sum(q * k, 1) * qk_scale - lse2), 0.0)
        dp = tl.sum(do * v, 1)
        pd = p
        if HAS_KEEP:
            kp = _keep(KEEP, n, nm, h, lvl, H, L) * keep_scale
            pd = p * kp
            dp = dp * kp
        ds = p * (dp - delta)
        dq += ds[:, None] * k
        dk = ds[:, None] * q * sm_scale
        dv = pd[:, None] * do
        if lvl < L:
            base = DKVR + r.to(tl.int64)[:, None] * (2 * D) + col[None, :]
            tl.atomic_add(base, dk, mask=nm[:, None], sem="relaxed")
            tl.atomic_add(base + D, dv, mask=nm[:, None], sem="relaxed")
        else:
            dense_g = DKVD + n64[:, None] * (2 * D) + col[None, :]
            tl.store(dense_g, dk.to(DKVD.dtype.element_ty), mask=nm[:, None])
            tl.store(dense_g + D, dv.to(DKVD.dtype.element_ty), mask=nm[:, None])
    tl.store(DQ + tile, (dq * sm_scale).to(DQ.dtype.element_ty), mask=nm[:, None])


_LOG2E = 1.4426950408889634
BLOCK_ITEMS = 16  # items per program: with head dims up to 128 the [BN, DH] fp32 tiles stay in registers


def _fwd(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor, keep: torch.Tensor | None,
         heads: int, p_drop: float) -> tuple[torch.Tensor, torch.Tensor]:
    n, d, levels = _check(q, kv_rows, rows, kv_dense, heads, keep)
    dh = d // heads
    if dh & (dh - 1):
        raise ValueError(f"fusion_attention: the head dim {dh} must be a power of two for the kernel")
    q, kv_rows, kv_dense = q.contiguous(), kv_rows.contiguous(), kv_dense.contiguous()
    rows = rows.to(torch.int32).contiguous()
    out = item_block._empty(q.shape, q)
    lse = item_block._empty((n, heads), q, torch.float32)
    keep_t = keep.to(torch.uint8).contiguous() if keep is not None else rows  # any pointer when unused
    if n:
        _fusion_fwd_kernel[(triton.cdiv(n, BLOCK_ITEMS), heads)](
            q, kv_rows, rows, kv_dense, keep_t, out, lse, n, _LOG2E / math.sqrt(dh), 1.0 / (1.0 - p_drop),
            H=heads, D=d, DH=dh, L=levels, BN=BLOCK_ITEMS, HAS_KEEP=keep is not None)
    return out, lse


def _bwd(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor, keep: torch.Tensor | None,
         lse: torch.Tensor, dout: torch.Tensor, heads: int, p_drop: float
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d, levels = _check(q, kv_rows, rows, kv_dense, heads, keep)
    dh = d // heads
    q, kv_rows, kv_dense, dout = (x.contiguous() for x in (q, kv_rows, kv_dense, dout))
    rows = rows.to(torch.int32).contiguous()
    dq = item_block._empty(q.shape, q)
    dkv_rows = torch.zeros(kv_rows.shape, device=q.device, dtype=torch.float32)  # the atomics add into it
    dkv_dense = item_block._empty(kv_dense.shape, kv_dense)
    keep_t = keep.to(torch.uint8).contiguous() if keep is not None else rows
    if n:
        _fusion_bwd_kernel[(triton.cdiv(n, BLOCK_ITEMS), heads)](
            q, kv_rows, rows, kv_dense, keep_t, lse, dout, dq, dkv_rows, dkv_dense, n,
            _LOG2E / math.sqrt(dh), 1.0 / math.sqrt(dh), 1.0 / (1.0 - p_drop),
            H=heads, D=d, DH=dh, L=levels, BN=BLOCK_ITEMS, HAS_KEEP=keep is not None)
    return dq, dkv_rows.to(kv_rows.dtype), dkv_dense


# torch.compile cannot trace Triton launches with Python-side choices: the kernels are custom ops
# with fake (shape-only) implementations and the autograd formula registered, as item_block's are.
@torch.library.custom_op("genrec::sid_fusion_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor,
            keep: torch.Tensor | None, heads: int, p_drop: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd(q, kv_rows, rows, kv_dense, keep, heads, p_drop)


@_fwd_op.register_fake
def _(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor,
      keep: torch.Tensor | None, heads: int, p_drop: float) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty((q.shape[0], heads), dtype=torch.float32)


@torch.library.custom_op("genrec::sid_fusion_bwd", mutates_args=())
def _bwd_op(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor,
            keep: torch.Tensor | None, lse: torch.Tensor, dout: torch.Tensor, heads: int,
            p_drop: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd(q, kv_rows, rows, kv_dense, keep, lse, dout, heads, p_drop)


@_bwd_op.register_fake
def _(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor,
      keep: torch.Tensor | None, lse: torch.Tensor, dout: torch.Tensor, heads: int,
      p_drop: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), kv_rows.new_empty(kv_rows.shape), kv_dense.new_empty(kv_dense.shape)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, kv_rows, rows, kv_dense, keep, heads, p_drop = inputs
    ctx.save_for_backward(q, kv_rows, rows, kv_dense, keep, output[1])
    ctx.heads, ctx.p_drop = heads, p_drop


def _backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    q, kv_rows, rows, kv_dense, keep, lse = ctx.saved_tensors
    dq, dkv_rows, dkv_dense = _bwd_op(q, kv_rows, rows, kv_dense, keep, lse, dout, ctx.heads, ctx.p_drop)
    return dq, dkv_rows, None, dkv_dense, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup)


def fusion_attention(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor,
                     heads: int, keep: torch.Tensor | None = None, p_drop: float = 0.0, *,
                     check_rows: bool = True) -> torch.Tensor:
    """The Triton kernels; same contract as :func:`fusion_attention_torch` (head dim a power of two).
    Differentiable in ``q``, ``kv_rows`` and ``kv_dense``. The kernel gathers without bounds checks, so
    ``rows`` are checked first (one host sync; skipped with ``check_rows=False`` -- for callers that
    checked them already -- inside ``genrec.validation.trusted_inputs`` and under ``torch.compile``)."""
    if keep is not None and not 0.0 <= p_drop < 1.0:
        raise ValueError(f"fusion_attention: p_drop must lie in [0, 1), got {p_drop}")
    if check_rows and checks_on() and rows.numel():
        lo, hi = (int(x) for x in torch.aminmax(rows))
        if lo < 0 or hi >= kv_rows.shape[0]:
            raise ValueError(f"fusion_attention: rows must index kv_rows' {kv_rows.shape[0]} rows, got values in "
                             f"[{lo}, {hi}]")
    return _fwd_op(q, kv_rows, rows, kv_dense, keep, heads, float(p_drop) if keep is not None else 0.0)[0]
