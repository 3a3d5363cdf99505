"""PinGER's diverse beam selection as one Triton launch (PinGER §decoding, "beam 为什么要加多样性惩罚").

:func:`genrec.decode.beam.select_diverse` picks the W surviving beams one at a time: after each
pick every remaining candidate pays λ × (leading SID levels its parent shares with the pick's
parent), summed over picks (``penalty="sum"``) or maxed (``"max"``). On a GPU the torch loop is
~15 tiny kernels per pick (W=200 × 3 levels ≈ 9,000 launches). Here the whole greedy loop runs
inside ONE kernel: one program per batch row, the W picks a loop in the program.

What is non-standard, and why it is exact (same picks as ``select_diverse_reference``, ties
included):

* **Per-parent state.** All children of a parent pay the same penalty, so per pick the
  program only compares the Wc parents' ``key = fl(head − fl(λ·pen))``, ``head`` = the
  parent's best untaken raw score (rounding is monotone, so this is the parent's best
  candidate key). The first parent with the largest key wins (lowest flat index on ties);
  if every key is −inf, the first parent with an untaken child.
* **Rounding ties inside a parent.** Two children with different raw scores can round to
  the same penalised key; the reference then takes the lower *code*, not the higher raw
  score. So the child is not "the parent's next child in raw-score order": the program
  loads the picked parent's K scores, recomputes their keys with the same rounding, and
  takes the first untaken child whose key equals the winning key (= the first untaken
  child when the key is −inf, which reproduces the reference's "lowest untaken flat index"
  fallback). This is also why no pre-sorted child lists are used.
* **Same arithmetic as torch.** Keys are computed as torch does (``λ·pen`` then the
  subtraction, two roundings, no FMA: the launch sets ``enable_fp_fusion=False``), in fp32
  (fp64 for fp64 scores), with fp16/bf16 results rounded back to the score dtype after each
  op, as torch stores them; bf16 rounding is done with integer bit operations (round to
  nearest even) so the CPU interpreter rounds exactly like the GPU.
* **Taken flags in global scratch.** Which children are taken is an int8 ``[B, Wc*K]``
  buffer: the pick writes its flag, ``tl.debug_barrier()`` (a CTA barrier, which also makes
  the write visible to the program's other threads) and a volatile load on the next read.

NaN scores are read as +inf (picked first, so ``advance_state``'s NaN check still fires; the
order among NaN/+inf candidates is not the reference's). Limits: ``next_pow2(Wc)`` and
``next_pow2(K)`` at most :data:`MAX_BLOCK` (parents and one parent's children are each one
register block), finite λ ≥ 0, ``n_keep <= Wc*K``; :func:`supports` says whether a call is
covered, and ``select_diverse`` uses the torch loop otherwise. Runs on CUDA, or on CPU tensors
under ``TRITON_INTERPRET=1`` (tests). On one H200 it takes about 0.3 ms per level where the torch loop
takes ~100 ms (B=64, Wc=200, K=256; ``genrec bench kernels``, figures in docs/RESULTS.md).
"""

from __future__ import annotations

import math
import os
from typing import Literal

import torch
import triton
import triton.language as tl

__all__ = ["MAX_BLOCK", "select_diverse_triton", "supports"]

MAX_BLOCK = 8192
"""Largest power-of-two block for the parents (Wc) and for one parent's children (K)."""

_MODES = {torch.float32: 0, torch.float64: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def _as_score(x, MODE: tl.constexpr):
    """Round an fp32 value to the score dtype and back (MODE 1: fp16, 2: bf16, 0: no-op)."""
    if MODE == 1:
        return x.to(tl.float16).to(tl.float32)
    elif MODE == 2:  # round to nearest even on the bits, as c10::BFloat16 does
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x


@triton.jit
def _select_diverse_kernel(
    CAND, PREFIX, TAKEN, OUT, LAM64,
    Wc, K, d, n_keep, lam,
    BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK_K: tl.constexpr,
    SUM: tl.constexpr, MODE: tl.constexpr, F64: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cand_row = CAND + row * Wc * K  # [Wc, K] scores of this row
    taken_row = TAKEN + row * Wc * K  # [Wc, K] int8 taken flags
    prefix_row = PREFIX + row * Wc * d  # [Wc, d] parent codes
    out_row = OUT + row * n_keep
    offs_w = tl.arange(0, BLOCK_W)
    w_ok = offs_w < Wc
    offs_k = tl.arange(0, BLOCK_K)
    k_ok = offs_k < K
    if F64:
        lam_c = tl.load(LAM64)
        zero = tl.zeros([BLOCK_W], tl.float64)
    else:
        lam_c = lam
        zero = tl.zeros([BLOCK_W], tl.float32)

    # head[w] = best raw score of parent w (NaN read as +inf), in [BLOCK_W, CHUNK_K] tiles
    head = zero + float("-inf")  # [BW]
    offs_c = tl.arange(0, CHUNK_K)
    for k0 in range(0, K, CHUNK_K):
        kc = k0 + offs_c
        m = w_ok[:, None] & (kc < K)[None, :]
        tile = tl.load(cand_row + offs_w[:, None] * K + kc[None, :], mask=m, other=float("-inf")).to(zero.dtype)
        tile = tl.where(tile != tile, float("inf"), tile)  # [BW, CK]
        head = tl.maximum(head, tl.max(tile, axis=1))
    pen = zero  # [BW] accumulated shared depth, in the score dtype's values
    n_taken = tl.zeros([BLOCK_W], tl.int32)  # [BW]

    for i in range(n_keep):
        open_ = w_ok & (n_taken < K)  # [BW] parents with an untaken child
        prod = _as_score(lam_c * pen, MODE)  # [BW] λ·pen as torch stores it
        key = _as_score(head - prod, MODE)  # [BW] the parent's best candidate key
        key = tl.where(open_, key, float("-inf"))
        best = tl.max(key, axis=0)
        p = tl.min(tl.where(open_ & (key == best), offs_w, BLOCK_W), axis=0)  # first max / first open parent
        t_p = tl.sum(tl.where(offs_w == p, prod, 0.0), axis=0)  # scalar λ·pen[p] (one non-zero term: exact)
        # the picked parent's children: first untaken one whose key equals the winning key
        c = tl.load(cand_row + p * K + offs_k, mask=k_ok, other=float("-inf")).to(zero.dtype)  # [BK]
        c = tl.where(c != c, float("inf"), c)
        tk = tl.load(taken_row + p * K + offs_k, mask=k_ok, other=1, volatile=True)  # [BK]
        free = k_ok & (tk == 0)
        ckey = tl.where(free, _as_score(c - t_p, MODE), float("-inf"))  # [BK]
        code = tl.min(tl.where(free & (ckey == best), offs_k, BLOCK_K), axis=0)
        tl.store(out_row + i, (p * K + code).to(tl.int64))
        tl.store(taken_row + p * K + code, tl.full([], 1, tl.int8))
        tl.debug_barrier()  # the flag is visible to every thread before the next pick reads it
        free = free & (offs_k != code)
        new_head = tl.max(tl.where(free, c, float("-inf")), axis=0)
        head = tl.where(offs_w == p, new_head, head)
        n_taken = tl.where(offs_w == p, n_taken + 1, n_taken)
        # shared[w] = leading levels parent w's prefix shares with parent p's (0 when d == 0)
        run = w_ok
        shared = tl.zeros([BLOCK_W], tl.int32)  # [BW]
        for j in range(d):
            col = tl.load(prefix_row + offs_w * d + j, mask=w_ok, other=0)  # [BW]
            pj = tl.load(prefix_row + p * d + j)
            run = run & (col == pj)
            shared += run.to(tl.int32)
        if SUM:
            pen = _as_score(pen + shared.to(zero.dtype), MODE)
        else:
            pen = tl.maximum(pen, shared.to(zero.dtype))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def supports(cand: torch.Tensor, prefix: torch.Tensor, n_keep: int, diversity_lambda: float) -> bool:
    """Whether :func:`select_diverse_triton` covers this call (dtype, sizes, λ, n_keep)."""
    if cand.ndim != 3 or prefix.ndim != 3 or cand.dtype not in _MODES:
        return False
    _, wc, k = cand.shape
    return (
        math.isfinite(diversity_lambda) and diversity_lambda >= 0.0 and 0 <= n_keep <= wc * k
        and _next_pow2(wc) <= MAX_BLOCK and _next_pow2(k) <= MAX_BLOCK
        and not prefix.is_floating_point() and not prefix.is_complex()
    )


def select_diverse_triton(
    cand: torch.Tensor,
    prefix: torch.Tensor,
    n_keep: int,
    diversity_lambda: float,
    penalty: Literal["sum", "max"] = "sum",
    *,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One-launch Triton twin of :func:`genrec.decode.beam.select_diverse` (same arguments, same result).

    cand: [B, Wc, K] scores (fp16/bf16/fp32/fp64; -inf = illegal). prefix: int [B, Wc, d] parent
    codes, distinct within a row. Returns int64 flat indices [B, n_keep] into Wc*K, in pick order.
    Raises ValueError for calls outside :func:`supports`. ``num_warps`` overrides the launch heuristic.
    """
    if cand.ndim != 3 or prefix.ndim != 3 or prefix.shape[:2] != cand.shape[:2]:
        raise ValueError(f"cand [B, Wc, K] and prefix [B, Wc, d] expected, got {tuple(cand.shape)}, {tuple(prefix.shape)}")
    if penalty not in ("sum", "max"):
        raise ValueError(f"penalty must be 'sum' or 'max', got {penalty!r}")
    if not supports(cand, prefix, n_keep, diversity_lambda):
        raise ValueError(
            f"select_diverse_triton: unsupported call (dtype {cand.dtype}, shape {tuple(cand.shape)}, "
            f"n_keep {n_keep}, lambda {diversity_lambda}); limits: float scores, finite lambda >= 0, "
            f"n_keep <= Wc*K, next_pow2(Wc) and next_pow2(K) <= {MAX_BLOCK}"
        )
    if prefix.device != cand.device:
        raise ValueError(f"cand on {cand.device}, prefix on {prefix.device}")
    if not cand.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("select_diverse_triton: needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); use select_diverse")
    b, wc, k = cand.shape
    d = prefix.shape[2]
    out = torch.empty(b, n_keep, dtype=torch.int64, device=cand.device)  # [B, n_keep]
    if b == 0 or n_keep == 0:
        return out
    cand = cand.contiguous()  # [B, Wc, K]
    prefix = prefix.contiguous() if d > 0 else torch.zeros(1, dtype=torch.int64, device=cand.device)  # [B, Wc, d]
    taken = torch.zeros(b, wc * k, dtype=torch.int8, device=cand.device)  # [B, Wc*K] scratch flags
    f64 = cand.dtype == torch.float64
    lam64 = torch.full((1,), diversity_lambda, dtype=torch.float64, device=cand.device) if f64 else cand  # no host copy
    block_w, block_k = _next_pow2(wc), _next_pow2(k)
    _select_diverse_kernel[(b,)](
        cand, prefix, taken, out, lam64,
        wc, k, d, n_keep, float(diversity_lambda),
        BLOCK_W=block_w, BLOCK_K=block_k, CHUNK_K=min(block_k, max(1, 4096 // block_w)),
        SUM=penalty == "sum", MODE=_MODES[cand.dtype], F64=f64,
        num_warps=num_warps or (4 if max(block_w, block_k) <= 1024 else 8), num_stages=1, enable_fp_fusion=False,
    )
    return out
