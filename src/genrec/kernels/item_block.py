"""PinGER item-block attention in Triton: forward + backward (PinGER §3.3.4, mask rules §3.3.2).

Non-standard here: the mask (see ``reference.item_block_mask``) is neither causal nor sparse
in FlexAttention's sense -- every block below the diagonal holds dense columns, so no block can
be skipped. Instead each query block holds WHOLE items (``BLOCK_ITEMS`` items x ``T`` tokens,
padded to the power of two ``BLOCK_M``) and attention splits in two parts:

1. every query of the block attends, UNMASKED, to the dense tokens of all items before the
   block, in a plain flash loop over the compact ``[B, H, n_items, D]`` dense K/V: either the
   strided view ``k[:, :, T-1::T]`` (no copy) or, with ``gather_dense``, a contiguous copy of it;
2. a small masked attention of the block's queries against the block's own tokens.

Both parts feed the same running max / running sum (online softmax), in fp32, so the result
equals one softmax over all visible keys. The backward pass is three Triton kernels (no
recomputation in PyTorch): ``dq`` per query block (the same two parts, recomputing P from the
saved logsumexp; with ``fuse_delta`` it also computes and stores ``delta = rowsum(dO * O)``, with
``fuse_sid_kv`` also the SID keys' dk/dv);
``dk/dv`` of SID keys per item block (an SID key is read only inside its own item); ``dk/dv`` of
dense keys in tiles of dense keys against every later query token (item-causal, masked only
near the diagonal). The two dk/dv kernels write disjoint rows.

Tuning knobs live in :class:`ItemBlockConfig`; every setting computes the same function (up to
fp32 rounding order) and ``ItemBlockConfig()`` is the original kernel. ``split_tail`` runs the
loops over full tiles without any masking and masks only the last partial tile (forward, dq) or
only the tiles near the diagonal (dense dk/dv); the backward kernels have their own tile sizes,
warps and pipeline depths.

Layout: q, k, v ``[B, H, S, D]``, ``S = n_items * T``; token s is item ``s // T``, slot
``s % T``; slots ``0..T-2`` are SID levels, slot ``T-1`` the dense token. ``lengths`` int ``[B]``
valid items per row; padding keys are invisible, padding query rows output 0 (their logsumexp
is stored as 0). Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from genrec.kernels.item_block_sm90 import (
    launch_dense_kv_sm90,
    launch_dq_sm90,
    launch_fwd_sm90,
    launch_grid,
    sm90_available,
    tma_ready,
)
from genrec.validation import checks_on

__all__ = ["item_block_attention", "item_block_attention_fwd", "ItemBlockAttention", "ItemBlockConfig"]

_LOG2E = 1.4426950408889634
_TRITON = tuple(int(x) for x in triton.__version__.split(".")[:2])  # tuned() depends on its ptxas


@dataclass(frozen=True)
class ItemBlockConfig:
    """Tuning knobs of the item-block kernels. The defaults are the original kernel.

    Forward: ``block_m`` query tokens per program (rounded to a power of two, whole items),
    ``block_n`` dense keys per step, ``num_warps`` (None: 4 if D <= 64 else 8), ``num_stages``
    (software-pipelining depth; None: Triton's default). The backward kernels take the forward's
    values unless their own knob is set: ``dq_*`` (query tokens per program, dense keys per
    step), ``kv_block_i`` dense keys per program and ``kv_block_q`` query tokens per step of the
    dense dk/dv kernel, ``sid_block_m`` tokens per program of the SID dk/dv kernel.
    ``gather_dense``: read dense K/V from a contiguous copy instead of the strided view.
    ``split_tail``: no masking work on full tiles (see the module docstring).
    ``fuse_delta``: the dq kernel computes ``delta`` (else a PyTorch op before the backward).
    ``fuse_sid_kv``: the dq kernel also computes dk/dv of the SID keys from the in-block tiles it
    already holds (no separate SID dk/dv kernel; ``sid_*`` knobs unused).
    ``maxnreg`` / ``dq_maxnreg`` / ``kv_maxnreg``: a cap on registers per thread for the forward / dq /
    dense dk/dv kernel (more resident programs per SM, or spills); None: the compiler's choice.
    ``lpt`` / ``dq_lpt`` / ``kv_lpt``: launch the forward / dq / dense dk/dv grid with the block
    index slowest, so the heaviest blocks of every head go first (longest-processing-time order) and
    light ones fill the tail; else each head's blocks in turn, heaviest first within the head (the
    concurrent programs then share that head's K/V in L2). The backward ones default to ``lpt``.
    ``sm90_fwd`` = ``(block_m, block_n, warps, stages)``: on a Hopper GPU (bf16/fp16) run the
    forward as the Gluon kernel of ``item_block_sm90`` (TMA ring of ``stages`` dense K/V tiles,
    asynchronous warpgroup MMAs overlapped with the softmax); elsewhere the Triton forward runs with
    the knobs above. ``sm90_dense_kv`` = ``(keys per program, queries per step, warps, stages)``:
    likewise the dense keys' dk/dv kernel. ``sm90_dq`` = ``(block_m, block_n, warps, stages)``,
    block_n = block_m: likewise the dq kernel, which then also computes delta and the SID keys' dk/dv (as
    ``fuse_delta`` and ``fuse_sid_kv`` do). The backward ones run when TMA can read q, k, v and dO
    in place (any strides with 16-byte alignment, as the model's head-split views have). None: the
    Triton kernel everywhere. An optional fifth element holds that many of the loop's A operands in
    registers instead of shared memory (forward: Q; dq: Q, then dO; dense dk/dv: K, then V).
    """

    block_m: int = 64
    block_n: int = 64
    num_warps: int | None = None
    num_stages: int | None = None
    gather_dense: bool = False
    split_tail: bool = False
    fuse_delta: bool = False
    fuse_sid_kv: bool = False
    maxnreg: int | None = None
    dq_block_m: int | None = None
    dq_block_n: int | None = None
    dq_warps: int | None = None
    dq_stages: int | None = None
    kv_block_i: int | None = None
    kv_block_q: int | None = None
    kv_warps: int | None = None
    kv_stages: int | None = None
    dq_maxnreg: int | None = None
    kv_maxnreg: int | None = None
    sid_block_m: int | None = None
    sid_warps: int | None = None
    lpt: bool = False
    dq_lpt: bool | None = None
    kv_lpt: bool | None = None
    sm90_fwd: tuple[int, ...] | None = None
    sm90_dense_kv: tuple[int, ...] | None = None
    sm90_dq: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            x = getattr(self, f.name)
            if f.name.startswith("sm90_") and x is not None:
                if not (isinstance(x, tuple) and len(x) in (4, 5) and all(isinstance(i, int) and i > 0 for i in x[:4])
                        and (len(x) == 4 or (isinstance(x[4], int) and 0 <= x[4] <= 2))):
                    raise ValueError(f"ItemBlockConfig.{f.name}: expected None, 4 positive ints or 4 positive ints "
                                     f"and a register-operand count 0-2, got {x!r}")
                if f.name == "sm90_dq" and x[0] != x[1]:
                    raise ValueError(f"ItemBlockConfig.sm90_dq: block_n must equal block_m (the block's own keys ride "
                                     f"the dense ring as its last tile), got {x!r}")
                continue
            if isinstance(x, bool) or x is None:
                continue
            if not isinstance(x, int) or x < 1 or ("warps" in f.name and x & (x - 1)):
                raise ValueError(f"ItemBlockConfig.{f.name}: expected a positive int (warps: a power of two), got {x!r}")

    def replace(self, **changes: Any) -> ItemBlockConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    @functools.lru_cache(maxsize=None)  # frozen, and validating its ~30 fields costs ~30 us a call
    def tuned(cls, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> ItemBlockConfig:
        """The configuration the model uses: the best of ``benchmarks/sweep_item_block.py`` on an H200
        (bf16, B 8 x 1,024 items x 5 tokens) for head dims 64 and 128; other head dims take the head-dim-64
        one. On a Hopper GPU at head dims 64 and 128 the Gluon kernels (forward, dq, dense dk/dv;
        :mod:`genrec.kernels.item_block_sm90`) replace their Triton twins, with 3-stage rings and loop
        operands in registers (the tuples' 5th element). The dense dk/dv grid runs heads-first (``kv_lpt``:
        fewer idle SMs in its tail); the forward and dq keep each head's blocks together. Re-measure with
        ``genrec bench kernels --only train`` (figures: docs/RESULTS.md).

        ``dtype``: the tiles were tuned for 2-byte inputs. Rows wider than 256 bytes (fp32 at head dim
        128) would need more shared memory than an H100/H200 program may have (dq 320 KB, dense dk/dv
        289 KB against 227 KB), so they get 64-row tiles and 2 stages there; every fp32 configuration
        also gets :meth:`_fp32`'s smaller key steps (checked by compiling,
        ``tests/kernels/test_inspect_item_block_cpu.py``); not tuned for speed."""
        fused = dict(num_stages=3, split_tail=True, fuse_delta=True, fuse_sid_kv=True, kv_lpt=True)
        if head_dim >= 128:
            # dq with Q in registers and dense dk/dv with K in registers: at head dim 128 the loop's operands
            # read from shared memory would use all of its bandwidth (the 32-query tiles' K Q^T reads a 2 KB
            # A tile per 64 K FLOP). dO in registers too does not fit Triton >= 3.9's register budget for the
            # pipelined dq loop (ptxas serializes its matmuls, C7512). Dense dk/dv's K in registers spills
            # under Triton >= 3.7's ptxas in its mask-split loops, so it is held in shared memory there
            # (the same time under 3.9 either way).
            sm90: dict[str, tuple[int, ...]] = dict(sm90_fwd=(64, 64, 4, 2), sm90_dq=(64, 64, 4, 2, 1),
                                                    sm90_dense_kv=(64, 32, 4, 3, int(_TRITON < (3, 7))))
            cfg = cls(num_warps=4, dq_block_m=128, dq_block_n=64, dq_warps=8, dq_stages=3,
                      kv_block_i=128, kv_block_q=64, kv_warps=8, kv_stages=3,
                      **(sm90 if head_dim == 128 else {}), **fused)  # type: ignore[arg-type]
            if head_dim * dtype.itemsize > 256:
                cfg = cfg.replace(dq_block_m=64, dq_warps=4, dq_stages=2, kv_block_i=64, kv_warps=4, kv_stages=2)
            return cfg._fp32(dtype)
        # head dim 64: the Gluon kernels too, Q (forward, dq) and K (dense dk/dv) held in registers (the 5th
        # tuple element); each Gluon launch costs more host time than a Triton one, which an eager call
        # alone can feel.
        sm90_64: dict[str, tuple[int, ...]] = dict(sm90_fwd=(64, 64, 4, 2, 1), sm90_dq=(64, 64, 4, 3, 1),
                                                   sm90_dense_kv=(64, 64, 4, 3, 1))
        return cls(num_warps=4, dq_block_m=64, dq_block_n=32, dq_warps=4, dq_stages=3,
                   kv_block_i=64, kv_block_q=128, kv_warps=4, kv_stages=2,
                   **(sm90_64 if head_dim == 64 else {}), **fused)._fp32(dtype)  # type: ignore[arg-type]

    def _fp32(self, dtype: torch.dtype) -> ItemBlockConfig:
        """4-byte inputs: key steps of at most 32 keys, a forward pipeline of at most 2 stages (never larger
        than asked for). Each fp32 product is three TF32 ones over split operands, which need twice the
        registers and shared memory of a bf16 tile: with the bf16 tiles dense dk/dv wanted 256.5 KB of
        shared memory at head dim 128 (an H200 program may have 227 KB), and at 64 kept 3 KB per thread on
        the stack; with these, 96-192 KB and at most ~2.5 KB (``benchmarks/inspect_item_block.py --dtype float32``, Triton 3.6). Not tuned
        for speed: nobody trains in fp32 for speed; the path exists for exact checks."""
        if dtype.itemsize < 4:
            return self
        return self.replace(block_n=min(self.block_n, 32), num_stages=min(self.num_stages or 2, 2),
                            dq_block_n=min(self.dq_block_n or self.block_n, 32),
                            kv_block_q=min(self.kv_block_q or self.block_n, 32))


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # IEEE: fp32 inputs get fp32-accurate products: three TF32 tensor-core products per dot (each
    # operand split into a TF32 high part and a TF32 remainder; the remainders' product dropped, ~1e-6
    # relative). "ieee" products run on the FMA units instead: at head dim 128 ptxas kept 14-22 KB of
    # each thread's state on the stack and took ~50 s per kernel to compile for sm_90, long enough
    # that the fp32 model test never finished on the H200. UPCAST only under TRITON_INTERPRET=1,
    # whose tl.dot mis-handles bf16 operands (values blow up); on a GPU it is always False.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="tf32x3")
    else:
        return tl.dot(a, b)


@triton.jit
def _inblock_index(tok, slot, ok, T: tl.constexpr):
    # The PinGER mask inside a block of whole items as two integer comparisons. For query token r
    # and key token c of the same block, visible <=> c <= r and key_rank(c) >= query_floor(r), with
    #   key_rank  = c for an SID key, BIG for a dense key (a dense key passes the second test);
    #   query_floor = first token of r's item for an SID query (its own item's SID keys of level
    #                 <= its own pass), BIG for a dense query (no SID key passes);
    # so a dense key is visible iff c <= r (an earlier item's dense token, or r itself when r is
    # dense), an SID key iff it lies in r's own item at or before r and r is an SID query.
    # Invalid rows get r = -1 and invalid keys c = BIG: nothing visible.
    BIG: tl.constexpr = 1 << 30
    is_sid = slot < T - 1
    r = tl.where(ok, tok, -1)
    floor = tl.where(is_sid, tok - slot, BIG)
    c = tl.where(ok, tok, BIG)
    rank = tl.where(is_sid, tok, BIG)
    return r, floor, c, rank


@triton.jit
def _online_softmax_step(acc, l_i, m_i, s, v, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # One flash-attention update: scores s [BM, BN] (log2 domain, -inf where invisible) and values
    # v [BN, D] folded into the running max m_i, sum l_i and output acc.
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, UPCAST)
    return acc, l_i, m_new


@triton.jit
def _fwd_dense_tiles(
    acc, l_i, m_i, q, KD, VD, skdn, svdn, start, end, hi, qk_scale,
    BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    # Flash loop over dense keys [start, end); keys >= hi are invisible (only when MASKED).
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for s0 in range(start, end, BLOCK_N):
        n_idx = s0 + offs_n  # item index of each dense key  [BN]
        n_ok = n_idx < hi
        if MASKED:
            kd = tl.load(KD + n_idx[:, None] * skdn + offs_d[None, :], mask=n_ok[:, None], other=0.0)  # [BN, D]
            vd = tl.load(VD + n_idx[:, None] * svdn + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        else:
            kd = tl.load(KD + n_idx[:, None] * skdn + offs_d[None, :])
            vd = tl.load(VD + n_idx[:, None] * svdn + offs_d[None, :])
        s = _dot(q, tl.trans(kd), IEEE, UPCAST) * qk_scale  # [BM, BN], log2 domain
        if MASKED:
            s = tl.where(n_ok[None, :], s, float("-inf"))
        acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, s, vd, IEEE, UPCAST)
    return acc, l_i, m_i


@triton.jit
def _block_rows(qptr, sqs, item0, n_valid, T: tl.constexpr, BLOCK_ITEMS: tl.constexpr, BLOCK_M: tl.constexpr,
                    D: tl.constexpr):
    # The rows of one query block of whole items starting at item0 (forward and dq kernels):
    # tokens, slots, validity, q [BM, D].
    rows = tl.arange(0, BLOCK_M)
    in_block = rows < BLOCK_ITEMS * T
    tok = item0 * T + rows  # [BLOCK_M]
    q_slot = rows % T
    row_ok = in_block & (item0 + rows // T < n_valid)
    offs_d = tl.arange(0, D)
    q = tl.load(qptr + tok[:, None] * sqs + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [BM, D]
    return tok, q_slot, row_ok, in_block, q


@triton.jit
def _fwd_finish(
    acc, l_i, m_i, q, kptr, vptr, sks, svs, optr, sos, lptr, tok, q_slot, row_ok, in_block, S, qk_scale,
    T: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    # Part 2: masked attention of the block's queries against the block's own tokens (the keys
    # are the same token range, indexed by the same rows); then normalise and store out and lse.
    offs_d = tl.arange(0, D)
    kb = tl.load(kptr + tok[:, None] * sks + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [BM, D]
    vb = tl.load(vptr + tok[:, None] * svs + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    s = _dot(q, tl.trans(kb), IEEE, UPCAST) * qk_scale  # [BM(q), BM(k)]
    r, floor, c, rank = _inblock_index(tok, q_slot, row_ok, T)
    vis = (c[None, :] <= r[:, None]) & (rank[None, :] >= floor[:, None])
    s = tl.where(vis, s, float("-inf"))
    acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, s, vb, IEEE, UPCAST)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    out = tl.where(row_ok[:, None], out, 0.0)
    lse = tl.where(row_ok, (m_i + tl.log2(l_safe)) / 1.4426950408889634, 0.0)  # natural-log LSE
    st_ok = in_block & (tok < S)
    tl.store(optr + tok[:, None] * sos + offs_d[None, :], out.to(optr.dtype.element_ty), mask=st_ok[:, None])
    tl.store(lptr + tok, lse, mask=st_ok)


@triton.jit
def _block_and_head(LPT: tl.constexpr, LAST_FIRST: tl.constexpr):
    # (block, batch*head) of this program. The grid is (blocks, B*H), or (B*H, blocks) with LPT --
    # see launch_grid -- and block ids run backwards when the last blocks are the heaviest.
    ax: tl.constexpr = 1 if LPT else 0
    blk = tl.program_id(ax)
    if LAST_FIRST:
        blk = tl.num_programs(ax) - 1 - blk
    return blk, tl.program_id(1 - ax)


@triton.jit
def _item_block_fwd_kernel(
    Q, K, V, KD, VD, O, LSE, LENGTHS,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, skdb, skdh, skdn, svdb, svdh, svdn,
    sob, soh, sos, slb, slh,
    H, S, qk_scale,
    T: tl.constexpr, BLOCK_ITEMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, SPLIT_TAIL: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, LPT: tl.constexpr,
):
    pid_m, pid_bh = _block_and_head(LPT, True)  # heaviest (latest) query blocks first
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(LENGTHS + b)
    item0 = pid_m * BLOCK_ITEMS
    tok, q_slot, row_ok, in_block, q = _block_rows(Q + b * sqb + h * sqh, sqs, item0, n_valid, T, BLOCK_ITEMS,
                                                       BLOCK_M, D)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # Part 1: unmasked flash loop over the dense tokens of items [0, item0) (all valid if the block is).
    hi = tl.where(item0 < n_valid, item0, 0)
    kd_ptr = KD + b * skdb + h * skdh
    vd_ptr = VD + b * svdb + h * svdh
    if SPLIT_TAIL:
        hi_full = (hi // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _fwd_dense_tiles(acc, l_i, m_i, q, kd_ptr, vd_ptr, skdn, svdn, 0, hi_full, hi, qk_scale,
                                         BLOCK_N, D, False, IEEE, UPCAST)
        acc, l_i, m_i = _fwd_dense_tiles(acc, l_i, m_i, q, kd_ptr, vd_ptr, skdn, svdn, hi_full, hi, hi, qk_scale,
                                         BLOCK_N, D, True, IEEE, UPCAST)
    else:
        acc, l_i, m_i = _fwd_dense_tiles(acc, l_i, m_i, q, kd_ptr, vd_ptr, skdn, svdn, 0, hi, hi, qk_scale,
                                         BLOCK_N, D, True, IEEE, UPCAST)
    _fwd_finish(acc, l_i, m_i, q, K + b * skb + h * skh, V + b * svb + h * svh, sks, svs, O + b * sob + h * soh, sos,
                LSE + b * slb + h * slh, tok, q_slot, row_ok, in_block, S, qk_scale, T, D, IEEE, UPCAST)


@triton.jit
def _dq_dense_tiles(
    dq, q, do, lse2, delta, row_ok, KD, VD, skdn, svdn, start, end, hi, qk_scale,
    BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    # dq over dense keys [start, end). Unmasked tiles need no `where`: a padding query row has
    # q = dO = lse = delta = 0, so its dS is exactly 0.
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for s0 in range(start, end, BLOCK_N):
        n_idx = s0 + offs_n
        n_ok = n_idx < hi
        if MASKED:
            kd = tl.load(KD + n_idx[:, None] * skdn + offs_d[None, :], mask=n_ok[:, None], other=0.0)  # [BN, D]
            vd = tl.load(VD + n_idx[:, None] * svdn + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        else:
            kd = tl.load(KD + n_idx[:, None] * skdn + offs_d[None, :])
            vd = tl.load(VD + n_idx[:, None] * svdn + offs_d[None, :])
        s = _dot(q, tl.trans(kd), IEEE, UPCAST) * qk_scale
        p = tl.exp2(s - lse2[:, None])
        if MASKED:
            p = tl.where(n_ok[None, :] & row_ok[:, None], p, 0.0)  # [BM, BN]
        dp = _dot(do, tl.trans(vd), IEEE, UPCAST)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(kd.dtype), kd, IEEE, UPCAST)
    return dq


@triton.jit
def _item_block_bwd_dq_kernel(
    Q, K, V, KD, VD, O, DO, LSE, DELTA, DQ, DK, DV, LENGTHS,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, skdb, skdh, skdn, svdb, svdh, svdn,
    sob, soh, sos, sdob, sdoh, sdos, slb, slh, sdqb, sdqh, sdqs, sdkb, sdkh, sdks, sdvb, sdvh, sdvs,
    H, S, qk_scale, sm_scale,
    T: tl.constexpr, BLOCK_ITEMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, SPLIT_TAIL: tl.constexpr, FUSE_DELTA: tl.constexpr, FUSE_SID_KV: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, LPT: tl.constexpr,
):
    pid_m, pid_bh = _block_and_head(LPT, True)  # heaviest (latest) query blocks first
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(LENGTHS + b)
    item0 = pid_m * BLOCK_ITEMS
    tok, q_slot, row_ok, in_block, q = _block_rows(Q + b * sqb + h * sqh, sqs, item0, n_valid, T, BLOCK_ITEMS,
                                                   BLOCK_M, D)
    st_ok = in_block & (tok < S)
    offs_d = tl.arange(0, D)
    do = tl.load(DO + b * sdob + h * sdoh + tok[:, None] * sdos + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    lse2 = tl.load(LSE + b * slb + h * slh + tok, mask=row_ok, other=0.0) * 1.4426950408889634  # [BM]
    if FUSE_DELTA:  # delta = rowsum(dO * O), stored for the two dk/dv kernels that run after this one
        o = tl.load(O + b * sob + h * soh + tok[:, None] * sos + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
        tl.store(DELTA + b * slb + h * slh + tok, delta, mask=st_ok)
    else:
        delta = tl.load(DELTA + b * slb + h * slh + tok, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)

    hi = tl.where(item0 < n_valid, item0, 0)
    kd_ptr = KD + b * skdb + h * skdh
    vd_ptr = VD + b * svdb + h * svdh
    if SPLIT_TAIL:
        hi_full = (hi // BLOCK_N) * BLOCK_N
        dq = _dq_dense_tiles(dq, q, do, lse2, delta, row_ok, kd_ptr, vd_ptr, skdn, svdn, 0, hi_full, hi, qk_scale,
                             BLOCK_N, D, False, IEEE, UPCAST)
        dq = _dq_dense_tiles(dq, q, do, lse2, delta, row_ok, kd_ptr, vd_ptr, skdn, svdn, hi_full, hi, hi, qk_scale,
                             BLOCK_N, D, True, IEEE, UPCAST)
    else:
        dq = _dq_dense_tiles(dq, q, do, lse2, delta, row_ok, kd_ptr, vd_ptr, skdn, svdn, 0, hi, hi, qk_scale,
                             BLOCK_N, D, True, IEEE, UPCAST)

    kb = tl.load(K + b * skb + h * skh + tok[:, None] * sks + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    vb = tl.load(V + b * svb + h * svh + tok[:, None] * svs + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    s = _dot(q, tl.trans(kb), IEEE, UPCAST) * qk_scale
    r, floor, c, rank = _inblock_index(tok, q_slot, row_ok, T)
    vis = (c[None, :] <= r[:, None]) & (rank[None, :] >= floor[:, None])
    p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
    dp = _dot(do, tl.trans(vb), IEEE, UPCAST)
    ds = p * (dp - delta[:, None])
    dq += _dot(ds.to(kb.dtype), kb, IEEE, UPCAST)
    if FUSE_SID_KV:  # an SID key is seen only inside its own item: its dk/dv come from this tile alone
        pt = tl.trans(p)  # [BM(k), BM(q)]; dense keys' rows are computed but not stored
        dst = tl.trans(ds)
        dv_s = _dot(pt.to(do.dtype), do, IEEE, UPCAST)  # [BM, D]
        dk_s = _dot(dst.to(q.dtype), q, IEEE, UPCAST) * sm_scale
        sid_ok = st_ok & (q_slot < T - 1)
        tl.store(DK + b * sdkb + h * sdkh + tok[:, None] * sdks + offs_d[None, :], dk_s.to(DK.dtype.element_ty), mask=sid_ok[:, None])
        tl.store(DV + b * sdvb + h * sdvh + tok[:, None] * sdvs + offs_d[None, :], dv_s.to(DV.dtype.element_ty), mask=sid_ok[:, None])

    dq = dq * sm_scale
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
    r, floor, c, rank = _inblock_index(tok, r_slot, r_ok, T)  # dense rows: r_ok is False, so invisible
    vis = (c[:, None] <= r[None, :]) & (rank[:, None] >= floor[None, :])  # [BM(k), BM(q)]
    pt = tl.where(vis, tl.exp2(st - lse2[None, :]), 0.0)  # [BM(k), BM(q)]
    dv = _dot(pt.to(do.dtype), do, IEEE, UPCAST)  # [BM, D]
    dpt = _dot(v, tl.trans(do), IEEE, UPCAST)
    dst = pt * (dpt - delta[None, :])
    dk = _dot(dst.to(q.dtype), q, IEEE, UPCAST) * sm_scale
    st_ok = in_block & (tok < S) & r_sid
    tl.store(DK + b * sdkb + h * sdkh + tok[:, None] * sdks + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=st_ok[:, None])
    tl.store(DV + b * sdvb + h * sdvh + tok[:, None] * sdvs + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=st_ok[:, None])


@triton.jit
def _kv_query_tiles(
    dk, dv, kd, vd, jtok, Q, DO, LSE, DELTA, sqs, sdos, start, end, q_hi, qk_scale,
    T: tl.constexpr, BLOCK_Q: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    # dk/dv of dense keys j over query tokens [start, end). Unmasked tiles (every query item > every
    # key j) need no `where`: a query token >= q_hi loads q = dO = lse = delta = 0, so dP = dS = 0.
    offs_q = tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D)
    for s0 in range(start, end, BLOCK_Q):
        qt = s0 + offs_q  # query tokens  [BQ]
        q_ok = qt < q_hi
        qq = tl.load(Q + qt[:, None] * sqs + offs_d[None, :], mask=q_ok[:, None], other=0.0)  # [BQ, D]
        qdo = tl.load(DO + qt[:, None] * sdos + offs_d[None, :], mask=q_ok[:, None], other=0.0)
        l2 = tl.load(LSE + qt, mask=q_ok, other=0.0) * 1.4426950408889634
        dl = tl.load(DELTA + qt, mask=q_ok, other=0.0)
        st = _dot(kd, tl.trans(qq), IEEE, UPCAST) * qk_scale  # [BI, BQ]
        if MASKED:  # dense key j (token jT + T-1) is seen by query token r iff jT + T-1 <= r
            vis = jtok[:, None] <= qt[None, :]  # (a query past q_hi loads zeros: dP = dS = 0 anyway)
            pt = tl.where(vis, tl.exp2(st - l2[None, :]), 0.0)
        else:
            pt = tl.exp2(st - l2[None, :])
        dv += _dot(pt.to(qdo.dtype), qdo, IEEE, UPCAST)
        dpt = _dot(vd, tl.trans(qdo), IEEE, UPCAST)
        dst = pt * (dpt - dl[None, :])
        dk += _dot(dst.to(qq.dtype), qq, IEEE, UPCAST)
    return dk, dv


@triton.jit
def _item_block_bwd_dense_kv_kernel(
    Q, KD, VD, DO, LSE, DELTA, DK, DV, LENGTHS,
    sqb, sqh, sqs, skdb, skdh, skdn, svdb, svdh, svdn, sdob, sdoh, sdos, slb, slh,
    sdkb, sdkh, sdks, sdvb, sdvh, sdvs,
    H, N_ITEMS, qk_scale, sm_scale,
    T: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_Q: tl.constexpr,
    D: tl.constexpr, SPLIT_TAIL: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, LPT: tl.constexpr,
):
    # dk/dv of dense keys: dense key j is read by the dense queries of items >= j and the SID
    # queries of items > j -- whichever forward part (unmasked gather or in-block) served them.
    # BLOCK_I dense keys (rows of the compact dense K/V) per program, a flash-style loop over
    # every query token from item j0 on; only the first BLOCK_I items' worth needs the mask.
    pid_i, pid_bh = _block_and_head(LPT, False)  # heaviest (earliest) keys first: most later queries
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    n_valid = tl.load(LENGTHS + b)
    j0 = pid_i * BLOCK_I
    offs_i = tl.arange(0, BLOCK_I)
    j = j0 + offs_i  # item index of each dense key  [BI]
    j_ok = j < n_valid
    offs_d = tl.arange(0, D)
    kd = tl.load(KD + b * skdb + h * skdh + j[:, None] * skdn + offs_d[None, :], mask=j_ok[:, None], other=0.0)  # [BI, D]
    vd = tl.load(VD + b * svdb + h * svdh + j[:, None] * svdn + offs_d[None, :], mask=j_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_I, D], tl.float32)
    dv = tl.zeros([BLOCK_I, D], tl.float32)
    jtok = tl.where(j_ok, j * T + (T - 1), 1 << 30)  # dense key's token; padding keys: seen by no query
    q_hi = n_valid * T
    q_ptr = Q + b * sqb + h * sqh
    do_ptr = DO + b * sdob + h * sdoh
    l_ptr = LSE + b * slb + h * slh
    dl_ptr = DELTA + b * slb + h * slh
    if SPLIT_TAIL:  # queries of items >= j0 + BLOCK_I see every key of the tile: no mask there
        DIAG = ((BLOCK_I * T + BLOCK_Q - 1) // BLOCK_Q) * BLOCK_Q  # query tokens that can be masked
        mid = tl.minimum(j0 * T + DIAG, q_hi)
        dk, dv = _kv_query_tiles(dk, dv, kd, vd, jtok, q_ptr, do_ptr, l_ptr, dl_ptr, sqs, sdos, j0 * T, mid, q_hi,
                                 qk_scale, T, BLOCK_Q, D, True, IEEE, UPCAST)
        dk, dv = _kv_query_tiles(dk, dv, kd, vd, jtok, q_ptr, do_ptr, l_ptr, dl_ptr, sqs, sdos, mid, q_hi, q_hi,
                                 qk_scale, T, BLOCK_Q, D, False, IEEE, UPCAST)
    else:
        dk, dv = _kv_query_tiles(dk, dv, kd, vd, jtok, q_ptr, do_ptr, l_ptr, dl_ptr, sqs, sdos, j0 * T, q_hi, q_hi,
                                 qk_scale, T, BLOCK_Q, D, True, IEEE, UPCAST)
    dk = dk * sm_scale
    dtok = j * T + (T - 1)
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
    # no host sync inside a CUDA graph, nor under trusted_inputs (the training step's model)
    capturing = lengths.is_cuda and torch.cuda.is_current_stream_capturing()
    if checks_on() and lengths.numel() and not capturing and (int(lengths.min()) < 0 or int(lengths.max()) > n_items):
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


def _tile(x: int) -> int:
    return max(16, _next_pow2(x))


def _launch_opts(warps: int | None, stages: int | None, D: int, maxnreg: int | None = None) -> dict[str, int]:
    opts = {"num_warps": warps or _default_warps(D)}
    if stages is not None:  # None: Triton's own default
        opts["num_stages"] = stages
    if maxnreg is not None and os.environ.get("TRITON_INTERPRET") != "1":  # the interpreter has no registers
        opts["maxnreg"] = maxnreg
    return opts


def _sm90_tiles(t: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """An ``ItemBlockConfig.sm90_*`` tuple as (tile, tile, warps, stages, register operands)."""
    return (*t[:4], t[4] if len(t) > 4 else 0)  # type: ignore[return-value]


def _dq_lpt(cfg: ItemBlockConfig) -> bool:
    return cfg.lpt if cfg.dq_lpt is None else cfg.dq_lpt


def _kv_lpt(cfg: ItemBlockConfig) -> bool:
    return cfg.lpt if cfg.kv_lpt is None else cfg.kv_lpt


Launch = tuple[int, dict[str, Any], dict[str, int]]  # (items per program, constexprs, launch options)


def _fwd_launch(cfg: ItemBlockConfig, T: int, D: int) -> Launch:
    """The forward kernel's tile constexprs and launch options under ``cfg`` (also read by
    ``benchmarks/inspect_item_block.py``, which compiles the kernels as these launches do)."""
    bm, bi = _blocks(T, cfg.block_m)
    return bi, {"T": T, "BLOCK_ITEMS": bi, "BLOCK_M": bm, "BLOCK_N": _tile(cfg.block_n), "D": D,
                "SPLIT_TAIL": cfg.split_tail, "LPT": cfg.lpt}, _launch_opts(cfg.num_warps, cfg.num_stages, D, cfg.maxnreg)


def _dq_launch(cfg: ItemBlockConfig, T: int, D: int) -> Launch:
    bm, bi = _blocks(T, cfg.dq_block_m or cfg.block_m)
    return bi, {"T": T, "BLOCK_ITEMS": bi, "BLOCK_M": bm, "BLOCK_N": _tile(cfg.dq_block_n or cfg.block_n), "D": D,
                "SPLIT_TAIL": cfg.split_tail, "FUSE_DELTA": cfg.fuse_delta, "FUSE_SID_KV": cfg.fuse_sid_kv and T > 1,
                "LPT": _dq_lpt(cfg)}, _launch_opts(cfg.dq_warps or cfg.num_warps, cfg.dq_stages or cfg.num_stages, D,
                                cfg.dq_maxnreg)


def _dense_kv_launch(cfg: ItemBlockConfig, T: int, D: int) -> Launch:
    bi = _tile(cfg.kv_block_i) if cfg.kv_block_i else _blocks(T, cfg.block_m)[0]
    return bi, {"T": T, "BLOCK_I": bi, "BLOCK_Q": _tile(cfg.kv_block_q or cfg.block_n), "D": D,
                "SPLIT_TAIL": cfg.split_tail, "LPT": _kv_lpt(cfg)}, _launch_opts(cfg.kv_warps or cfg.num_warps, cfg.kv_stages or cfg.num_stages, D,
                                                  cfg.kv_maxnreg)


def _sm90_ok(q: torch.Tensor, T: int) -> bool:
    """Whether the Gluon kernels take this call: a Hopper GPU, bf16/fp16, the head dims and item
    sizes they were built and checked for (others run the Triton kernels)."""
    return q.shape[-1] in (64, 128) and T <= 16 and sm90_available(q)


def _scale(q: torch.Tensor, scale: float | None) -> float:
    """The softmax scale: 1/sqrt(head dim) unless given."""
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def default_config(dtype: torch.dtype, block_m: int = 64, block_n: int = 64,
                   num_warps: int | None = None) -> ItemBlockConfig:
    """What :func:`item_block_attention` runs when the caller passes no ``config``: the original kernel's
    tiles (``block_m`` / ``block_n`` / ``num_warps`` as given), made to fit one program's shared memory
    for 4-byte inputs as :meth:`ItemBlockConfig.tuned` is (:meth:`ItemBlockConfig._fp32`: key steps of at
    most 32, at most 2 stages). Without that, fp32 at head dim 128 wanted 321 KB of shared memory for
    dense dk/dv, against the 227 KB an H200 program may have, and failed to launch (``genrec bench
    kernels``' correctness checks launch it)."""
    return ItemBlockConfig(block_m=block_m, block_n=block_n, num_warps=num_warps)._fp32(dtype)


def _config(block_m: int, block_n: int, num_warps: int | None, config: ItemBlockConfig | None,
            q: torch.Tensor) -> ItemBlockConfig:
    if config is None:
        return default_config(q.dtype, block_m, block_n, num_warps)
    if (block_m, block_n, num_warps) != (64, 64, None):
        raise ValueError("item_block_attention: pass block_m / block_n / num_warps inside `config`, not beside it")
    return config


def _dense_view(x: torch.Tensor, T: int, gather: bool) -> torch.Tensor:
    """The dense tokens ``[B, H, n_items, D]``: a strided view, or a contiguous copy of it."""
    xd = x[:, :, T - 1 :: T]
    return xd.contiguous() if gather else xd


def _strides3(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


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
    *,
    config: ItemBlockConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only: returns ``out [B, H, S, D]`` (q's dtype) and natural-log ``lse [B, H, S]`` fp32."""
    cfg = _config(block_m, block_n, num_warps, config, q)
    lengths = torch.as_tensor(lengths, device=q.device).to(torch.int32).contiguous()
    n_items = _check_inputs(q, k, v, lengths, T)
    B, H, S, D = q.shape
    scale = _scale(q, scale)
    per_program, consts, opts = _fwd_launch(cfg, T, D)
    out = _empty(q.shape, q)
    lse = _empty((B, H, S), q, torch.float32)
    if out.numel() == 0:
        return out, lse.zero_()
    if cfg.sm90_fwd and _sm90_ok(q, T):
        bm, bn, w, st, ar = _sm90_tiles(cfg.sm90_fwd)
        launch_fwd_sm90(q, k, v, lengths, out, lse, T, scale, block_m=_blocks(T, bm)[0], block_n=_tile(bn),
                        num_warps=w, stages=st, a_regs=ar, lpt=cfg.lpt)
        return out, lse
    kd, vd = _dense_view(k, T, cfg.gather_dense), _dense_view(v, T, cfg.gather_dense)
    _item_block_fwd_kernel[launch_grid(triton.cdiv(n_items, per_program), B * H, cfg.lpt)](
        q, k, v, kd, vd, out, lse, lengths,
        *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(kd), *_strides3(vd), *_strides3(out),
        lse.stride(0), lse.stride(1),
        H, S, scale * _LOG2E,
        IEEE=q.dtype == torch.float32, UPCAST=_upcast(q), **consts, **opts,
    )
    return out, lse


class _Backward:
    """The inputs of the three backward kernels, prepared once; each kernel is one method so a
    benchmark can time them one by one. ``dq()`` must run first when ``cfg.fuse_delta``."""

    def __init__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
        do: torch.Tensor, lengths: torch.Tensor, T: int, scale: float, cfg: ItemBlockConfig,
    ) -> None:
        B, H, S, D = q.shape
        self.q, self.k, self.v, self.out, self.lse, self.lengths, self.T, self.scale, self.cfg = q, k, v, out, lse, lengths, T, scale, cfg
        self.H, self.S, self.D, self.n_items = H, S, D, S // T
        self.do = do if do.stride(-1) == 1 else do.contiguous()
        if cfg.fuse_delta:
            self.delta = _empty((B, H, S), q, torch.float32)  # written by the dq kernel
        else:
            self.delta = (self.do.float() * out.float()).sum(-1).contiguous()  # [B, H, S]
        assert self.delta.stride() == lse.stride(), "LSE and DELTA share strides in the kernels"
        self.kd, self.vd = _dense_view(k, T, cfg.gather_dense), _dense_view(v, T, cfg.gather_dense)
        self.dq, self.dk, self.dv = _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)
        self.consts = {"IEEE": q.dtype == torch.float32, "UPCAST": _upcast(q)}
        self.sid_done = False  # set when the sm90 dq kernel wrote the SID keys' dk/dv

    def run_dq(self) -> None:
        q, c = self.q, self.cfg
        if (c.sm90_dq and _sm90_ok(q, self.T) and tma_ready(q, self.k, self.v, self.do)
                and all(x.is_contiguous() for x in (self.out, self.lse, self.delta))):
            bm, bn, w, st, ar = _sm90_tiles(c.sm90_dq)
            launch_dq_sm90(q, self.k, self.v, self.out, self.do, self.lse, self.delta, self.dq, self.dk, self.dv,
                           self.lengths, self.T, self.scale, block_m=_blocks(self.T, bm)[0], block_n=_tile(bn),
                           num_warps=w, stages=st, a_regs=ar, lpt=_dq_lpt(c))
            self.sid_done = True  # the SID keys' dk/dv came with it
            return
        per_program, consts, opts = _dq_launch(self.cfg, self.T, self.D)
        _item_block_bwd_dq_kernel[launch_grid(triton.cdiv(self.n_items, per_program), q.shape[0] * self.H, _dq_lpt(self.cfg))](
            q, self.k, self.v, self.kd, self.vd, self.out, self.do, self.lse, self.delta, self.dq, self.dk, self.dv, self.lengths,
            *_strides3(q), *_strides3(self.k), *_strides3(self.v), *_strides3(self.kd), *_strides3(self.vd),
            *_strides3(self.out), *_strides3(self.do), self.lse.stride(0), self.lse.stride(1), *_strides3(self.dq),
            *_strides3(self.dk), *_strides3(self.dv),
            self.H, self.S, self.scale * _LOG2E, self.scale,
            **consts, **self.consts, **opts,
        )

    def run_sid_kv(self) -> None:
        c, q, T = self.cfg, self.q, self.T
        if T == 1 or c.fuse_sid_kv or self.sid_done:  # no SID keys, or the dq kernel did them
            return
        BLOCK_M, BLOCK_ITEMS = _blocks(T, c.sid_block_m or c.block_m)
        _item_block_bwd_sid_kv_kernel[(triton.cdiv(self.n_items, BLOCK_ITEMS), q.shape[0] * self.H)](
            q, self.k, self.v, self.do, self.lse, self.delta, self.dk, self.dv, self.lengths,
            *_strides3(q), *_strides3(self.k), *_strides3(self.v), *_strides3(self.do),
            self.lse.stride(0), self.lse.stride(1), *_strides3(self.dk), *_strides3(self.dv),
            self.H, self.S, self.scale * _LOG2E, self.scale,
            T=T, BLOCK_ITEMS=BLOCK_ITEMS, BLOCK_M=BLOCK_M, D=self.D, **self.consts,
            **_launch_opts(c.sid_warps or c.num_warps, None, self.D),
        )

    def run_dense_kv(self) -> None:
        q, c = self.q, self.cfg
        if c.sm90_dense_kv and _sm90_ok(q, self.T) and tma_ready(q, self.k, self.v, self.do):
            bi, bq, w, st, ar = _sm90_tiles(c.sm90_dense_kv)
            launch_dense_kv_sm90(q, self.k, self.v, self.do, self.lse, self.delta, self.dk, self.dv, self.lengths,
                                 self.T, self.scale, block_i=_tile(bi), block_q=_tile(bq), num_warps=w, stages=st,
                                 a_regs=ar, lpt=_kv_lpt(c))
            return
        per_program, consts, opts = _dense_kv_launch(self.cfg, self.T, self.D)
        _item_block_bwd_dense_kv_kernel[launch_grid(triton.cdiv(self.n_items, per_program), q.shape[0] * self.H, _kv_lpt(self.cfg))](
            q, self.kd, self.vd, self.do, self.lse, self.delta, self.dk, self.dv, self.lengths,
            *_strides3(q), *_strides3(self.kd), *_strides3(self.vd), *_strides3(self.do),
            self.lse.stride(0), self.lse.stride(1), *_strides3(self.dk), *_strides3(self.dv),
            self.H, self.n_items, self.scale * _LOG2E, self.scale,
            **consts, **self.consts, **opts,
        )

    def run(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.dq.numel():
            self.run_dq()
            self.run_sid_kv()
            self.run_dense_kv()
        return self.dq, self.dk, self.dv


class ItemBlockAttention(torch.autograd.Function):
    """Autograd wrapper: Triton forward (saves out + lse) and Triton backward (dq, dk, dv)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, T: int,
        scale: float | None = None, block_m: int = 64, block_n: int = 64, num_warps: int | None = None,
        config: ItemBlockConfig | None = None,
    ) -> torch.Tensor:
        cfg = _config(block_m, block_n, num_warps, config, q)
        lengths = torch.as_tensor(lengths, device=q.device).to(torch.int32).contiguous()
        scale = _scale(q, scale)
        out, lse = item_block_attention_fwd(q, k, v, lengths, T, scale, config=cfg)
        ctx.save_for_backward(q, k, v, out, lse, lengths)
        ctx.cfg = (T, scale, cfg)
        return out

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse, lengths = ctx.saved_tensors
        T, scale, cfg = ctx.cfg
        dq, dk, dv = _Backward(q, k, v, out, lse, do, lengths, T, scale, cfg).run()
        return dq, dk, dv, None, None, None, None, None, None, None


# ---------------------------------------------------------------- the same kernels as torch custom ops
# torch.compile cannot trace the autograd.Function above (Triton launches with Python-side tile
# choices); as ``genrec::item_block_fwd`` / ``genrec::item_block_bwd`` the kernels are opaque ops of
# the compiled graph, with fake (shape-only) implementations and the autograd formula registered, so
# a compiled training forward stays one graph. They run the tuned configuration of the head dim.


@torch.library.custom_op("genrec::item_block_fwd", mutates_args=())
def _item_block_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, T: int,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return item_block_attention_fwd(q, k, v, lengths, T, scale, config=ItemBlockConfig.tuned(q.shape[-1], q.dtype))


@_item_block_fwd_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, T: int,
      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, S, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, S), dtype=torch.float32)


@torch.library.custom_op("genrec::item_block_bwd", mutates_args=())
def _item_block_bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       do: torch.Tensor, lengths: torch.Tensor, T: int, scale: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = lengths.to(torch.int32).contiguous()
    return _Backward(q, k, v, out, lse, do, lengths, T, scale, ItemBlockConfig.tuned(q.shape[-1], q.dtype)).run()


@_item_block_bwd_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
      do: torch.Tensor, lengths: torch.Tensor, T: int, scale: float
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _op_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, lengths, T, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], lengths)
    ctx.T, ctx.scale = T, scale


def _op_backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    q, k, v, out, lse, lengths = ctx.saved_tensors
    dq, dk, dv = _item_block_bwd_op(q, k, v, out, lse, dout, lengths, ctx.T, ctx.scale)
    return dq, dk, dv, None, None, None


_item_block_fwd_op.register_autograd(_op_backward, setup_context=_op_setup)


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
    *,
    config: ItemBlockConfig | None = None,
) -> torch.Tensor:
    """PinGER item-block attention (Triton). q, k, v ``[B, H, S, D]``, lengths int ``[B]`` -> ``[B, H, S, D]``.

    Same contract as ``reference.item_block_attention_ref``; differentiable in q, k, v.
    ``block_m`` tokens per query block (rounded to a power of two; holds ``block_m // T`` whole
    items), ``block_n`` dense keys per step of the unmasked loop; ``num_warps`` defaults to 4
    (D <= 64) or 8. ``config`` (an :class:`ItemBlockConfig`) sets every tuning knob instead.
    Traced by ``torch.compile`` it becomes the ``genrec::item_block_fwd`` op, which always runs
    ``ItemBlockConfig.tuned(D, dtype)`` (the configuration the model passes).
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: the custom op, which runs the tuned configuration
        return _item_block_fwd_op(q, k, v, lengths, T, _scale(q, scale))[0]
    return ItemBlockAttention.apply(q, k, v, lengths, T, scale, block_m, block_n, num_warps, config)
