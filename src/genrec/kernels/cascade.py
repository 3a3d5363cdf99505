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

Split-KV (flash-decoding) for few beams: with W small the grid is only ``cdiv(W, beams per block)
x B*H`` programs, each streaming the whole history serially (latency-bound). ``num_splits=S > 1``
cuts each request's valid history into S balanced chunks (multiples of ``block_n``) handled by
separate programs; each writes a normalised partial and its log2-sum-exp to fp32 scratch (an empty
chunk writes the neutral partial 0, -inf), the last split also takes the block-diagonal suffix
(so its partial is never empty), and a second small kernel merges the S partials exactly.
``num_splits="auto"`` (the default) picks S from the grid size and the SM count, and only for
long histories (``cascade_num_splits``); S = 1 is the single-kernel path with no scratch.
The paper reports 4.25x over paged attention at W=10 and 32x at W=400; the benchmark
``benchmarks/bench_kernels.py`` measures ours against per-beam SDPA over expanded KV.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Literal

import torch
import triton
import triton.language as tl

from genrec.kernels.attention import kernel_head_dim
from genrec.kernels.item_block import _dot
from genrec.kernels.reference import _check_lengths
from genrec.validation import trusted_inputs

__all__ = ["cascade_attention", "cascade_attention_torch", "cascade_attention_triton", "cascade_num_splits"]

_LOG2E = 1.4426950408889634
_INTERPRETER_SMS = 132  # "auto" under TRITON_INTERPRET=1 plans for an H100/H200-sized GPU
# "auto" never makes history chunks shorter than this. Measured on an H200 (8 requests x 1,000
# keys, 12 x 64 heads, t=3, W=10, bf16): the S=1 kernel takes 16 us of device time, S=2..4 take
# 17-19 us with the merge (no gain even under a CUDA graph) and ~50 us more wall time eagerly (one
# more launch and scratch), so short histories stay unsplit. 2,048 is an estimate, not a sweep.
_MIN_CHUNK_KEYS = 2048
NumSplits = int | Literal["auto"]
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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


def _scratch(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """fp32 split-KV scratch (contiguous, uninitialised); tests swap it for a NaN-filled one."""
    return torch.empty(shape, device=device, dtype=torch.float32)


@triton.jit
def _suffix_update(q, m_i, l_i, acc, KS, VS, b, h, beam, pos, row_ok, offs_d,
                   sksb, sksw, sksh, skst, svsb, svsw, svsh, svst, qk_scale,
                   IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # Own suffix: block-diagonal causal mask over the block's beams, folded into the online softmax.
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
    return m_new, l_i, acc


@triton.jit
def _cascade_fwd_kernel(
    Q, KH, VH, KS, VS, O, HLEN, PO, PL,
    sqb, sqw, sqh, sqt, skhb, skhh, skhn, svhb, svhh, svhn,
    sksb, sksw, sksh, skst, svsb, svsw, svsh, svst, sob, sow, soh, sot,
    H, W, NS, qk_scale,
    TS: tl.constexpr, BEAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr,
):
    # SPLIT=False: the whole history + suffix, normalised output to O (NS = 1, PO/PL unused).
    # SPLIT=True: program (m, bh, s) takes chunk s of NS of this request's valid history (the last
    # split also the suffix) and writes its normalised partial to PO [B*H, NS, W*TS, D] and its
    # log2-sum-exp to PL [B*H, NS, W*TS] (0 and -inf for an empty chunk).
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(HLEN + b).to(tl.int32)
    if SPLIT:
        pid_s = tl.program_id(2)
        chunk = tl.cdiv(tl.cdiv(n_valid, NS), BLOCK_N) * BLOCK_N  # balanced per request, whole blocks
        lo = pid_s * chunk
        hi = tl.minimum(lo + chunk, n_valid)  # lo >= hi: an empty chunk, the loop below never runs
    else:
        lo = 0
        hi = n_valid
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
    for start in range(lo, hi, BLOCK_N):
        n_idx = start + offs_n
        n_ok = n_idx < hi
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

    if SPLIT:
        if pid_s == NS - 1:  # the last chunk is the shortest: it also takes the suffix
            m_i, l_i, acc = _suffix_update(q, m_i, l_i, acc, KS, VS, b, h, beam, pos, row_ok, offs_d,
                                           sksb, sksw, sksh, skst, svsb, svsw, svsh, svst, qk_scale, IEEE, UPCAST)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]  # 0 on an empty chunk (acc = 0)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))  # [BM], base 2
        r = (pid_bh.to(tl.int64) * NS + pid_s) * (W * TS) + pid_m * (BEAMS * TS) + rows  # scratch row
        tl.store(PO + r[:, None] * D + offs_d[None, :], out, mask=row_ok[:, None])
        tl.store(PL + r, lse, mask=row_ok)
    else:
        m_i, l_i, acc = _suffix_update(q, m_i, l_i, acc, KS, VS, b, h, beam, pos, row_ok, offs_d,
                                       sksb, sksw, sksh, skst, svsb, svsw, svsh, svst, qk_scale, IEEE, UPCAST)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(O + b * sob + beam[:, None] * sow + h * soh + pos[:, None] * sot + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _cascade_merge_kernel(
    PO, PL, O, sob, sow, soh, sot, H, R, NS,
    TS: tl.constexpr, BLOCK_R: tl.constexpr, D: tl.constexpr,
):
    # Merge the NS partials (out_s, lse_s) of BLOCK_R rows of one (request, head):
    # out = sum_s out_s * 2^(lse_s - M) / sum_s 2^(lse_s - M). The running max starts finite
    # (-1e30), so a neutral partial (lse = -inf) weighs exp2(-inf) = 0, never exp2(-inf - -inf).
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < R
    offs_d = tl.arange(0, D)
    m_i = tl.full([BLOCK_R], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, D], tl.float32)
    for s in range(0, NS):
        row = (pid_bh.to(tl.int64) * NS + s) * R + r
        lse = tl.load(PL + row, mask=r_ok, other=float("-inf"))  # [BR]
        o = tl.load(PO + row[:, None] * D + offs_d[None, :], mask=r_ok[:, None], other=0.0)  # [BR, D]
        m_new = tl.maximum(m_i, lse)
        alpha = tl.exp2(m_i - m_new)
        w = tl.exp2(lse - m_new)
        l_i = l_i * alpha + w
        acc = acc * alpha[:, None] + o * w[:, None]
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    beam = r // TS
    pos = r % TS
    tl.store(O + b * sob + beam[:, None] * sow + h * soh + pos[:, None] * sot + offs_d[None, :], out.to(O.dtype.element_ty), mask=r_ok[:, None])


@functools.lru_cache(maxsize=256)
def _blocks(W: int, t: int, block_m: int, block_n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BEAMS, BLOCK_N): query rows per program (whole beams), beams per program, keys per step."""
    # Few beams: shrink the query block so more programs run (never below one beam or 16 rows).
    block_m = min(block_m, max(16, W * t))
    BLOCK_M = max(16, 1 << max(0, (max(block_m, t) - 1).bit_length()))
    BLOCK_N = max(16, 1 << max(0, (block_n - 1).bit_length()))
    return BLOCK_M, BLOCK_M // t, BLOCK_N


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return _INTERPRETER_SMS


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:  # asked once per GPU: the decode calls "auto" every step
    return torch.cuda.get_device_properties(index).multi_processor_count


def cascade_num_splits(
    q: torch.Tensor,
    k_hist: torch.Tensor,
    num_splits: NumSplits = "auto",
    block_m: int = 64,
    block_n: int = 64,
) -> int:
    """The history split count S ``cascade_attention_triton`` uses for these shapes.

    ``"auto"``: S = 1 when the unsplit grid ``cdiv(W, beams per block) * B * H`` already has
    >= 2x the SM count programs; else the smallest S reaching that, capped so chunks of the
    history capacity n stay >= max(``_MIN_CHUNK_KEYS``, 2 * BLOCK_N) keys.
    """
    if num_splits != "auto":
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
            raise ValueError(f"num_splits: expected an int >= 1 or 'auto', got {num_splits!r}")
        return num_splits
    B, W, H, t, _ = q.shape
    n = k_hist.shape[2]
    BLOCK_M, BEAMS, BLOCK_N = _blocks(W, t, block_m, block_n)
    programs = -(-W // BEAMS) * B * H
    target = 2 * _sm_count(q.device)
    if programs >= target:
        return 1
    return max(1, min(-(-target // programs), n // max(_MIN_CHUNK_KEYS, 2 * BLOCK_N)))


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
    num_splits: NumSplits = "auto",
) -> torch.Tensor:
    """Forward-only Triton cascade attention (no autograd); same contract as ``cascade_attention_torch``.

    ``block_m`` query rows per program (a power of two holding ``block_m // t`` whole beams),
    ``block_n`` history keys per step, ``num_splits`` history chunks per (request, head, query
    block) merged by a second kernel (1: one kernel, no scratch; "auto": ``cascade_num_splits``).
    """
    hl = _check(q, k_hist, v_hist, k_suf, v_suf, hist_len).contiguous()  # int64: the kernel narrows it (no launch here)
    B, W, H, t, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"q: head dim D must be a power of two >= 16, got {D}")
    tensors = (q, k_hist, v_hist, k_suf, v_suf)
    dt = q.dtype
    if not (k_hist.dtype == v_hist.dtype == k_suf.dtype == v_suf.dtype == dt) or dt not in _DTYPES:
        raise ValueError(f"q, k, v: expected one dtype among fp16/bf16/fp32, got {[x.dtype for x in tensors]}")
    if q.stride(-1) != 1 or k_hist.stride(-1) != 1 or v_hist.stride(-1) != 1 or k_suf.stride(-1) != 1 or v_suf.stride(-1) != 1:
        raise ValueError("q, k_hist, v_hist, k_suf, v_suf: last dim must be contiguous (stride 1)")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if not q.is_cuda and not interp:
        raise RuntimeError("cascade_attention_triton: needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); use cascade_attention_torch")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    BLOCK_M, BEAMS, BLOCK_N = _blocks(W, t, block_m, block_n)
    S = cascade_num_splits(q, k_hist, num_splits, block_m, block_n)
    out = _empty(q)
    warps = num_warps or (4 if D <= 64 else 8)
    if S > 1:
        part_o = _scratch((B * H, S, W * t, D), q.device)  # normalised partial outputs
        part_lse = _scratch((B * H, S, W * t), q.device)  # their log2-sum-exps
    else:
        part_o = part_lse = out  # unused by the SPLIT=False kernel
    grid = (-(-W // BEAMS), B * H, S)  # (host-side ceil divisions: plain integers)
    # each tensor's strides read once (one call each: the eager decode pays this host time every step)
    sq, skh, svh, sks, svs, so = (x.stride() for x in (q, k_hist, v_hist, k_suf, v_suf, out))
    _cascade_fwd_kernel[grid](
        q, k_hist, v_hist, k_suf, v_suf, out, hl, part_o, part_lse,
        *sq[:4], *skh[:3], *svh[:3], *sks[:4], *svs[:4], *so[:4],
        H, W, S, scale * _LOG2E,
        TS=t, BEAMS=BEAMS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=D,
        IEEE=q.dtype == torch.float32, UPCAST=interp and q.dtype == torch.bfloat16, SPLIT=S > 1,
        num_warps=warps,
    )
    if S > 1:
        R = W * t
        BLOCK_R = max(16, min(64, 1 << max(0, (R - 1).bit_length())))
        _cascade_merge_kernel[(-(-R // BLOCK_R), B * H)](
            part_o, part_lse, out, out.stride(0), out.stride(1), out.stride(2), out.stride(3), H, R, S,
            TS=t, BLOCK_R=BLOCK_R, D=D, num_warps=4,
        )
    return out


def _kernel_device(q: torch.Tensor) -> bool:
    """Does the Triton kernel take these tensors? CUDA only (tests force it on under the interpreter),
    at the head dims it takes (others, e.g. 96, run the PyTorch two-pass form: the same function)."""
    return q.is_cuda and kernel_head_dim(q.shape[-1])


def cascade_attention(
    q: torch.Tensor,
    k_hist: torch.Tensor,
    v_hist: torch.Tensor,
    k_suf: torch.Tensor,
    v_suf: torch.Tensor,
    hist_len: torch.Tensor | list[int],
    scale: float | None = None,
    num_splits: NumSplits = "auto",
) -> torch.Tensor:
    """Cascade attention: Triton kernel for CUDA tensors when no grad is needed, else the PyTorch two-pass version.

    ``num_splits`` only affects the Triton path (see ``cascade_attention_triton``).
    """
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k_hist, v_hist, k_suf, v_suf))
    if _kernel_device(q) and not needs_grad:
        if torch.compiler.is_compiling():  # traced: the kernel as an opaque op, its Python choices made here
            hl = torch.as_tensor(hist_len, device=q.device)
            sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            return torch.ops.genrec.cascade_fwd(q, k_hist, v_hist, k_suf, v_suf, hl, sc,
                                                cascade_num_splits(q, k_hist, num_splits))
        return cascade_attention_triton(q, k_hist, v_hist, k_suf, v_suf, hist_len, scale, num_splits=num_splits)
    return cascade_attention_torch(q, k_hist, v_hist, k_suf, v_suf, hist_len, scale)


# Under torch.compile, inductor compiled the cascade kernel itself when it met the Triton launch, and
# failed in its compile worker on the H200 (rank() under torch.compile, with and without CUDA graphs). As an op with a shape-only fake, the compiled graph calls the launcher instead,
# as it does for the item-block and SID-fusion kernels. Its range check stays off: under compile the
# callers' inputs are trusted (genrec.validation.checks_on), and a capture (mode="reduce-overhead") must
# not sync.
@torch.library.custom_op("genrec::cascade_fwd", mutates_args=())
def _cascade_op(q: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor, k_suf: torch.Tensor,
                v_suf: torch.Tensor, hist_len: torch.Tensor, scale: float, num_splits: int) -> torch.Tensor:
    with trusted_inputs():
        return cascade_attention_triton(q, k_hist, v_hist, k_suf, v_suf, hist_len, scale, num_splits=num_splits)


@_cascade_op.register_fake
def _(q: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor, k_suf: torch.Tensor, v_suf: torch.Tensor,
      hist_len: torch.Tensor, scale: float, num_splits: int) -> torch.Tensor:
    return q.new_empty(q.shape)
