"""The item-block training kernels for Hopper (sm_90), written in Gluon: the forward, dq (with delta
and the SID keys' dk/dv) and the dense keys' dk/dv. TMA loads into rings of shared buffers guarded
by mbarriers, asynchronous warpgroup MMAs ordered by hand.

Each computes exactly what its Triton twin in ``item_block`` computes (same mask, same outputs),
for bf16/fp16 on an H100/H200 only; ``ItemBlockConfig.sm90_*`` switch them on. Triton's own
pipeliner cannot overlap the softmax of one key tile with the matrix products of the neighbouring
tiles, because each flash step's products depend on each other; here the kernel orders them. The
forward's step over dense key tiles j = 0, 1, ... (FlashAttention-3's intra-warpgroup overlap):

    wait for K_j, issue S_j = Q K_j^T        (async)
    issue O += P_{j-1} V_{j-1}               (async; P_{j-1} from the previous step)
    wait for S_j only                         (the older product; P_{j-1} V_{j-1} still runs)
    K_j's ring slot is free: start loading K_{j+STAGES} into it
    softmax of S_j -> P_j, the rescale alpha_j   <- overlaps the tensor cores' work on O
    wait for O; V_{j-1}'s slot is free: start loading V_{j-1+STAGES} into it
    O *= alpha_j

then one last ``O += P V`` and the in-block part (the block's own keys, masked by the same two
comparisons as ``item_block._inblock_index``), whose K/V were loaded at the start. dq issues
S = Q K^T and dP = dO V^T together and chains dQ += dS K across tiles without draining it; the
dense dk/dv kernel likewise chains dK and dV.

q, k, v and dO are read through 4-D tensor descriptors over ``[B, H, S, D]`` (boxes of
``[1, 1, rows, D]``), so any layout with 16-byte-aligned strides is read in place -- the model's
head-split views of one QKV projection included (:func:`tma_ready`). The dense tokens are the
strided view ``x[:, :, T-1::T]``. A tile that runs past the last item of a head is zero-filled by
TMA; one that runs past the block's first item holds later items, which the item-causal mask hides.
Outputs, lse and delta are contiguous tensors this module's callers allocate; the output tiles are
shuffled out of the MMA layout and stored as 16-byte vectors (stored straight from it, the 4-byte
stores were a fifth of dq's stall samples). Options per launch: ``a_regs`` holds the loops'
A operands in registers instead of shared memory, ``lpt`` lays the grid out heads-first
(:func:`launch_grid`).

No interpreter runs Gluon: CI compiles these kernels for sm_90 and reads their machine code
(``benchmarks/inspect_item_block.py``); their numerics are tested on a GPU (``tests/kernels``,
marked gpu), against the same fp32 reference as the Triton kernels.
"""
from __future__ import annotations

import functools
import math

import torch
import triton

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from triton.runtime.jit import constexpr_function

    # Triton 3.6 (the GPU image's) names the TMA load async_copy_global_to_shared; 3.9 renamed it async_load.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "sm90_available", "tma_ready", "launch_grid", "launch_fwd_sm90", "launch_dense_kv_sm90", "launch_dq_sm90"]

_LOG2E = 1.4426950408889634


@functools.lru_cache(maxsize=None)
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def sm90_available(x: torch.Tensor) -> bool:
    """True when these kernels can run on ``x``: Gluon present, a CUDA tensor on a Hopper GPU, bf16/fp16."""
    return HAVE_GLUON and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and _is_hopper(x.device.index)


if HAVE_GLUON:

    @constexpr_function
    def _mma_layout(n, num_warps):
        # Hopper warpgroup-MMA accumulator layout, [num_warps, 1] warps along M, instruction N = n.
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])

    @constexpr_function
    def _io_layout(d, num_warps):
        # Rows of d elements stored as 16-byte vectors, a row's lanes side by side: coalesced stores
        # (the MMA accumulator layout would store 4 bytes per lane, 16 bytes per row per warp).
        lanes = min(d // 8, 32)
        return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [num_warps, 1], [1, 0])

    @gluon.jit
    def _block_and_head(LPT: gl.constexpr, LAST_FIRST: gl.constexpr):
        # (block, batch*head) of this program, as item_block._block_and_head (grid: launch_grid)
        ax: gl.constexpr = 1 if LPT else 0
        blk = gl.program_id(ax)
        if LAST_FIRST:
            blk = gl.num_programs(ax) - 1 - blk
        return blk, gl.program_id(1 - ax)

    @gluon.jit
    def _a_operand(smem, layout: gl.constexpr, IN_REGS: gl.constexpr):
        # The A operand of a warpgroup MMA: the shared tile itself, or (IN_REGS) loaded into registers
        if IN_REGS:
            return smem.load(layout)
        else:
            return smem

    @gluon.jit
    def _block_out(row0, item0, S, T: gl.constexpr, BLOCK_ITEMS: gl.constexpr, BLOCK_M: gl.constexpr,
                   D: gl.constexpr, io: gl.constexpr):
        # A query block's rows in a contiguous [B, H, S, D] output, in the store layout io: element
        # offsets, which rows to store (the block's own tokens), and the row index within the block.
        ri = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, io))
        ci = gl.arange(0, D, layout=gl.SliceLayout(0, io))
        st = (ri < BLOCK_ITEMS * T) & (item0 * T + ri < S)
        return (row0 + ri)[:, None].to(gl.int64) * D + ci[None, :], st, ri

    @gluon.jit
    def _slot(ring, i, N: gl.constexpr, D: gl.constexpr):
        # Ring slot i ([1, 1, N, D], as TMA fills it) seen as the [N, D] operand of an MMA.
        return ring.index(i).reshape([N, D])

    @gluon.jit
    def _refill_ring(desc, blk_desc, ring, bars, tile, on, STAGES: gl.constexpr, n_tiles, b, h, tok0,
                     BLOCK_N: gl.constexpr, RING_BLOCK: gl.constexpr):
        # Tile `tile` (>= -STAGES) has been consumed from its ring slot: load tile + STAGES into that
        # slot (if any, and if `on`). A predicate, not a branch: ptxas waits for every outstanding
        # register load and MUFU result before a branch it cannot prove uniform, so an `if` around
        # this in a loop would expose the latency of whatever was issued ahead of it.
        # With RING_BLOCK the ring's tile n_tiles is the query block's own K or V (same shape), read
        # from the token descriptor blk_desc at token tok0.
        nxt = tile + STAGES
        slot = (tile + STAGES) % STAGES
        dense = (nxt < n_tiles) & on
        if RING_BLOCK:
            own = (nxt == n_tiles) & on
            mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=dense | own)
            _tma_load(desc, [b, h, nxt * BLOCK_N, 0], bars.index(slot), ring.index(slot), pred=dense)
            _tma_load(blk_desc, [b, h, tok0, 0], bars.index(slot), ring.index(slot), pred=own)
        else:
            mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=dense)
            _tma_load(desc, [b, h, nxt * BLOCK_N, 0], bars.index(slot), ring.index(slot), pred=dense)

    @gluon.jit
    def _inblock_vis(item0, n_valid, T: gl.constexpr, BLOCK_ITEMS: gl.constexpr, BLOCK_M: gl.constexpr,
                     layout: gl.constexpr):
        # [BM, BM] visibility of the block's own keys (columns) to its queries (rows): the PinGER mask
        # as two integer comparisons, as item_block._inblock_index builds it; padding rows see nothing.
        BIG: gl.constexpr = 1 << 30
        rq = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        rk = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, layout))
        q_ok = (rq < BLOCK_ITEMS * T) & (item0 + rq // T < n_valid)
        k_ok = (rk < BLOCK_ITEMS * T) & (item0 + rk // T < n_valid)
        r = gl.where(q_ok, rq, -1)
        floor = gl.where(rq % T < T - 1, rq - rq % T, BIG)
        c = gl.where(k_ok, rk, BIG)
        rank = gl.where(rk % T < T - 1, rk, BIG)
        return (c[None, :] <= r[:, None]) & (rank[None, :] >= floor[:, None])

    @gluon.jit
    def _inblock_softmax(sb, m_i, l_i, item0, n_valid, qk_scale, T: gl.constexpr, BLOCK_ITEMS: gl.constexpr,
                         BLOCK_M: gl.constexpr, sb_layout: gl.constexpr, o_layout: gl.constexpr, dtype: gl.constexpr):
        # The block's own keys under the PinGER mask as two comparisons (see item_block._inblock_index),
        # folded into the running max / sum. Returns P (an MMA operand), the rescale of the output and
        # the final max and sum, the last three in the output's row layout.
        b_rows: gl.constexpr = gl.SliceLayout(1, sb_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        vis = _inblock_vis(item0, n_valid, T, BLOCK_ITEMS, BLOCK_M, sb_layout)
        sb = gl.where(vis, sb, float("-inf"))
        mb = gl.convert_layout(m_i, b_rows)
        m_new = gl.maximum(mb, gl.max(sb, 1) * qk_scale)
        alpha = gl.exp2(mb - m_new)
        pb = gl.exp2(sb * qk_scale - m_new[:, None])
        lb = gl.convert_layout(l_i, b_rows) * alpha + gl.sum(pb, 1)
        pb = gl.convert_layout(pb.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        return pb, gl.convert_layout(alpha, o_rows), gl.convert_layout(m_new, o_rows), gl.convert_layout(lb, o_rows)

    @gluon.jit
    def _fwd_state(BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, s_layout: gl.constexpr,
                   o_layout: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr):
        # The forward's running state before its first tile: row max and sum (scaled log2 domain), the
        # output, a zero S accumulator, an empty P and the key offsets of a tile.
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, s_rows)
        l_i = gl.zeros([BLOCK_M], gl.float32, s_rows)
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        p = gl.zeros([BLOCK_M, BLOCK_N], dtype, p_layout)
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        return m_i, l_i, acc, s_zero, p, offs_n

    @gluon.jit
    def _fwd_store(acc, m_fin, l_fin, O, LSE, item0, n_valid, row0, S, T: gl.constexpr, BLOCK_ITEMS: gl.constexpr,
                   BLOCK_M: gl.constexpr, D: gl.constexpr, o_layout: gl.constexpr, dtype: gl.constexpr,
                   num_warps: gl.constexpr):
        # The forward's outputs for one query block: natural-log lse and O = acc / l (0 on padding rows).
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        l_safe = gl.where(l_fin > 0.0, l_fin, 1.0)
        ro = gl.arange(0, BLOCK_M, layout=o_rows)
        ok_o = (ro < BLOCK_ITEMS * T) & (item0 + ro // T < n_valid)
        st = (ro < BLOCK_ITEMS * T) & (item0 * T + ro < S)
        lse = gl.where(ok_o, (m_fin + gl.log2(l_safe)) / 1.4426950408889634, 0.0)
        gl.store(LSE + (row0 + ro).to(gl.int64), lse, mask=st)
        io: gl.constexpr = _io_layout(D, num_warps)
        out = gl.convert_layout(gl.where(ok_o[:, None], acc / l_safe[:, None], 0.0).to(dtype), io)
        offs, st_i, _ = _block_out(row0, item0, S, T, BLOCK_ITEMS, BLOCK_M, D, io)
        gl.store(O + offs, out, mask=st_i[:, None])

    @gluon.jit
    def _online_softmax(s, m_i, l_i, qk_scale, p_layout: gl.constexpr, dtype: gl.constexpr):
        # One key tile's scores folded into the running row max and sum (scaled log2 domain): P as the
        # operand of the next P V, the rescale alpha of what was accumulated before, the new max and sum.
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        pf = gl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + gl.sum(pf, 1)
        return gl.convert_layout(pf.to(dtype), p_layout), alpha, m_new, l_i

    @gluon.jit
    def _fwd_step(j, MASK: gl.constexpr, q_a, kd_smem, vd_smem, k_bars, v_bars, kd_desc, vd_desc, acc, p, m_i, l_i,
                  s_zero, offs_n, hi, qk_scale, n_tiles, b, h, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
                  D: gl.constexpr, p_layout: gl.constexpr, o_rows: gl.constexpr, dtype: gl.constexpr):
        # One step of the forward's dense loop (see the module docstring): S_j issued, then O += P_{j-1}
        # V_{j-1}; the softmax of S_j while the latter runs. MASK: the keys past hi are masked (the
        # last, partial tile only).
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_a, _slot(kd_smem, slot, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, _slot(vd_smem, prev, BLOCK_N, D), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        # K_j is consumed: its slot takes K_{j+STAGES} now, two steps ahead of its use
        _refill_ring(kd_desc, kd_desc, kd_smem, k_bars, j, True, STAGES, n_tiles, b, h, 0, BLOCK_N, False)
        if MASK:
            s = gl.where((j * BLOCK_N + offs_n < hi)[None, :], s, float("-inf"))
        p_next, alpha, m_new, l_i = _online_softmax(s, m_i, l_i, qk_scale, p_layout, dtype)
        acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        # tile j-1 is consumed (its S long ago, its PV just now): refill its slot(s)
        _refill_ring(vd_desc, vd_desc, vd_smem, v_bars, j - 1, True, STAGES, n_tiles, b, h, 0, BLOCK_N, False)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        return acc, p_next, m_new, l_i

    @gluon.jit
    def _sm90_fwd_kernel(
        q_desc, k_desc, v_desc, kd_desc, vd_desc, O, LSE, LENGTHS,
        H, S, n_items, qk_scale,
        T: gl.constexpr, BLOCK_ITEMS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        D: gl.constexpr, STAGES: gl.constexpr, A_REGS: gl.constexpr, LPT: gl.constexpr, num_warps: gl.constexpr,
    ):
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = _mma_layout(BLOCK_N, num_warps)
        sb_layout: gl.constexpr = _mma_layout(BLOCK_M, num_warps)
        o_layout: gl.constexpr = _mma_layout(D, num_warps)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

        pid_m, pid_bh = _block_and_head(LPT, True)  # heaviest (latest) query blocks first
        b = pid_bh // H
        h = pid_bh % H
        n_valid = gl.load(LENGTHS + b)
        item0 = pid_m * BLOCK_ITEMS
        row0 = pid_bh * S + item0 * T  # first row of the block in the contiguous outputs
        hi = gl.where(item0 < n_valid, item0, 0)  # dense keys [0, hi) are visible to the block
        n_tiles = gl.cdiv(hi, BLOCK_N)

        q_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], q_desc.layout)  # TMA's [1, 1, rows, D] box
        kb_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], k_desc.layout)
        vb_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], v_desc.layout)
        q_smem = q_s4.reshape([BLOCK_M, D])
        kb_smem = kb_s4.reshape([BLOCK_M, D])
        vb_smem = vb_s4.reshape([BLOCK_M, D])
        kd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kd_desc.layout)
        vd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], vd_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        b_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        mbarrier.init(b_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)

        # Q first (the first product needs it), then the first dense tiles, then the block's own K/V on a
        # barrier of their own (waited for only after the dense loop).
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        _tma_load(q_desc, [b, h, item0 * T, 0], q_bar, q_s4)
        for i in gl.static_range(STAGES):
            go = i < n_tiles
            mbarrier.expect(k_bars.index(i), kd_desc.block_type.nbytes, pred=go)
            _tma_load(kd_desc, [b, h, i * BLOCK_N, 0], k_bars.index(i), kd_smem.index(i),
                                            pred=go)
            mbarrier.expect(v_bars.index(i), vd_desc.block_type.nbytes, pred=go)
            _tma_load(vd_desc, [b, h, i * BLOCK_N, 0], v_bars.index(i), vd_smem.index(i),
                                            pred=go)
        mbarrier.expect(b_bar, 2 * k_desc.block_type.nbytes)
        _tma_load(k_desc, [b, h, item0 * T, 0], b_bar, kb_s4)
        _tma_load(v_desc, [b, h, item0 * T, 0], b_bar, vb_s4)

        m_i, l_i, acc, s_zero, p, offs_n = _fwd_state(BLOCK_M, BLOCK_N, D, s_layout, o_layout, p_layout, dtype)
        mbarrier.wait(q_bar, 0)
        # with A_REGS Q is the register operand of S = Q K^T: shared memory then streams K alone
        q_a = _a_operand(q_smem, gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2), A_REGS > 0)

        if n_tiles > 0:
            # first tile: its softmax has nothing to overlap with
            mbarrier.wait(k_bars.index(0), 0)
            s_tok = warpgroup_mma(q_a, _slot(kd_smem, 0, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            _refill_ring(kd_desc, kd_desc, kd_smem, k_bars, 0, True, STAGES, n_tiles, b, h, 0, BLOCK_N, False)
            s = gl.where((offs_n < hi)[None, :], s, float("-inf"))
            m_i = gl.maximum(m_i, gl.max(s, 1) * qk_scale)  # m_i and l_i in the scaled log2 domain
            pf = gl.exp2(s * qk_scale - m_i[:, None])
            l_i = gl.sum(pf, 1)
            p = gl.convert_layout(pf.to(dtype), p_layout)
        # the full tiles, then (a loop of at most one step) the partial last tile with its key mask:
        # masking every tile cost 32 selects a thread per tile in a loop that is short of issue slots,
        # and ptxas turns an `if` around the mask back into the same selects
        n_full = gl.maximum(hi // BLOCK_N, 1)
        bounds = (1, n_full, n_tiles)
        for ph in gl.static_range(2):  # plain, masked
            for j in range(bounds[ph], bounds[ph + 1]):
                acc, p, m_i, l_i = _fwd_step(j, ph == 1, q_a, kd_smem, vd_smem, k_bars, v_bars, kd_desc, vd_desc, acc,
                                             p, m_i, l_i, s_zero, offs_n, hi, qk_scale, n_tiles, b, h, STAGES, BLOCK_N,
                                             D, p_layout, o_rows, dtype)

        # The block's own tokens, whose scores are computed while the last dense P V runs.
        mbarrier.wait(b_bar, 0)
        sb_tok = warpgroup_mma(q_smem, kb_smem.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_M], gl.float32, sb_layout),
                               use_acc=False, is_async=True)
        if n_tiles > 0:
            last = (n_tiles - 1) % STAGES
            mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p, _slot(vd_smem, last, BLOCK_N, D), acc, is_async=True)
            sb = warpgroup_mma_wait(1, deps=(sb_tok,))
            pb, alpha_b, m_fin, l_fin = _inblock_softmax(sb, m_i, l_i, item0, n_valid, qk_scale, T, BLOCK_ITEMS,
                                                         BLOCK_M, sb_layout, o_layout, dtype)
            acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        else:
            sb = warpgroup_mma_wait(0, deps=(sb_tok,))
            pb, alpha_b, m_fin, l_fin = _inblock_softmax(sb, m_i, l_i, item0, n_valid, qk_scale, T, BLOCK_ITEMS,
                                                         BLOCK_M, sb_layout, o_layout, dtype)
        acc = acc * alpha_b[:, None]
        o_tok = warpgroup_mma(pb, vb_smem, acc, is_async=True)
        acc, pb = warpgroup_mma_wait(0, deps=(o_tok, pb))

        mbarrier.invalidate(q_bar)
        mbarrier.invalidate(b_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))

        _fwd_store(acc, m_fin, l_fin, O, LSE, item0, n_valid, row0, S, T, BLOCK_ITEMS, BLOCK_M, D, o_layout, dtype,
                   num_warps)


    @gluon.jit
    def _dkv_step(i, MASK: gl.constexpr, dk, dv, pt_op, dst_op, lse, dl, k_a, v_a, q_ring, do_ring, q_bars, q_desc,
                  do_desc, LSE, DELTA, offs_q, st_zero, q_lo, q_hi, n_q, qrow0, S, qk_scale, b, h,
                  T: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr, BLOCK_Q: gl.constexpr, D: gl.constexpr,
                  op_layout: gl.constexpr, dtype: gl.constexpr):
        # Step i of dense dk/dv's loop over query tiles (see _sm90_dense_kv_kernel); the row statistics
        # of tile i (lse, dl) were loaded a step ahead. MASK: the tile holds queries that do not see
        # every key of the block (near the diagonal) or rows past the batch row's length.
        slot = i % STAGES
        mbarrier.wait(q_bars.index(slot), (i // STAGES) & 1)
        q_s = _slot(q_ring, slot, BLOCK_Q, D)
        do_s = _slot(do_ring, slot, BLOCK_Q, D)
        st_tok = warpgroup_mma(k_a, q_s.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v_a, do_s.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        # the next tile's row statistics, loaded while this tile computes
        # (bounded by the head's rows, not its valid ones -- padding rows hold finite values and are
        # masked below -- and indexed from i, so lanes load their pairs of rows as 8-byte vectors)
        qt_next = q_lo + (i + 1) * BLOCK_Q + offs_q
        lse_next = gl.load(LSE + qrow0 + qt_next, mask=qt_next < S, other=0.0)
        dl_next = gl.load(DELTA + qrow0 + qt_next, mask=qt_next < S, other=0.0)
        # retires the previous tile's dV and dK products (older) and S^T; dP^T may still run
        st, pt_op, dst_op = warpgroup_mma_wait(1, deps=(st_tok, pt_op, dst_op))
        # the previous tile's Q / dO are consumed: its slot takes tile i - 1 + STAGES. No branch in
        # this step (predicates here; MASK is a constant): ptxas waits for outstanding loads ahead of
        # a branch it cannot prove uniform, which made every tile wait for the lse / delta it had just
        # prefetched (28% of the kernel's stall samples with a branch here).
        prev = (i + STAGES - 1) % STAGES
        nxt = i - 1 + STAGES
        go = (i > 0) & (nxt < n_q)
        mbarrier.expect(q_bars.index(prev), 2 * q_desc.block_type.nbytes, pred=go)
        _tma_load(q_desc, [b, h, q_lo + nxt * BLOCK_Q, 0], q_bars.index(prev), q_ring.index(prev), pred=go)
        _tma_load(do_desc, [b, h, q_lo + nxt * BLOCK_Q, 0], q_bars.index(prev), do_ring.index(prev), pred=go)
        pt = gl.exp2(st * qk_scale - (lse * 1.4426950408889634)[None, :])
        if MASK:
            # relative to the block: key r (dense token r*T + T - 1) is seen by query rows from there on,
            # up to the batch row's length (which also hides the padding keys: r*T + T - 1 < q_hi only
            # for valid ones). Recomputed here, not carried across the loops: registers are short.
            qr = i * BLOCK_Q + offs_q
            row_ok = qr < q_hi - q_lo
            kr = gl.arange(0, BLOCK_I, layout=gl.SliceLayout(1, st_zero.type.layout)) * T + (T - 1)
            pt = gl.where((kr[:, None] <= qr[None, :]) & row_ok[None, :], pt, 0.0)
            dl = gl.where(row_ok, dl, 0.0)  # padding rows' delta: whatever dO held there
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_s, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=(dpt_tok,))
        dst = pt * (dpt - dl[None, :])
        dst_op = gl.convert_layout(dst.to(dtype), op_layout)
        dk = warpgroup_mma(dst_op, q_s, dk, is_async=True)
        return dk, dv, pt_op, dst_op, lse_next, dl_next

    @gluon.jit
    def _sm90_dense_kv_kernel(
        q_desc, do_desc, kd_desc, vd_desc, LSE, DELTA, DK, DV, LENGTHS,
        H, S, n_items, qk_scale, sm_scale,
        T: gl.constexpr, BLOCK_I: gl.constexpr, BLOCK_Q: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
        A_REGS: gl.constexpr, LPT: gl.constexpr, num_warps: gl.constexpr,
    ):
        # dk/dv of the dense keys [j0, j0 + BLOCK_I) of one head: dense key j is read by every query
        # token r >= jT + T - 1 (the dense query of item j and all tokens of later items). A loop over
        # query tiles from token j0*T on, the tiles' Q and dO in a TMA ring; per tile, four asynchronous
        # warpgroup MMAs: S^T = K Q^T and dP^T = V dO^T together (P^T is formed while dP^T runs), then
        # dV += P^T dO (dS^T is formed while it runs), then dK += dS^T Q.
        dtype: gl.constexpr = q_desc.dtype
        st_layout: gl.constexpr = _mma_layout(BLOCK_Q, num_warps)
        kv_layout: gl.constexpr = _mma_layout(D, num_warps)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)

        pid_i, pid_bh = _block_and_head(LPT, False)  # heaviest (earliest) keys first: most later queries
        b = pid_bh // H
        h = pid_bh % H
        n_valid = gl.load(LENGTHS + b)
        j0 = pid_i * BLOCK_I
        qrow0 = pid_bh * S  # this head's first row in the contiguous lse / delta / dk / dv
        q_lo = j0 * T
        q_hi = n_valid * T
        n_q = gl.where(q_hi > q_lo, gl.cdiv(q_hi - q_lo, BLOCK_Q), 0)

        k_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_I, D], kd_desc.layout)  # TMA's [1, 1, rows, D] box
        v_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_I, D], vd_desc.layout)
        k_smem = k_s4.reshape([BLOCK_I, D])
        v_smem = v_s4.reshape([BLOCK_I, D])
        q_ring = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_Q, D], q_desc.layout)
        do_ring = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_Q, D], do_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_bars.index(i), count=1)
        mbarrier.expect(kv_bar, 2 * kd_desc.block_type.nbytes)
        _tma_load(kd_desc, [b, h, j0, 0], kv_bar, k_s4)
        _tma_load(vd_desc, [b, h, j0, 0], kv_bar, v_s4)
        for i in gl.static_range(STAGES):
            go = i < n_q
            mbarrier.expect(q_bars.index(i), 2 * q_desc.block_type.nbytes, pred=go)
            _tma_load(q_desc, [b, h, q_lo + i * BLOCK_Q, 0], q_bars.index(i), q_ring.index(i), pred=go)
            _tma_load(do_desc, [b, h, q_lo + i * BLOCK_Q, 0], q_bars.index(i), do_ring.index(i), pred=go)

        offs_q = gl.arange(0, BLOCK_Q, layout=q_cols)
        # dK and dV stay in flight across tiles (chained accumulators): no drain between tiles
        dk = warpgroup_mma_init(gl.zeros([BLOCK_I, D], gl.float32, kv_layout))
        dv = warpgroup_mma_init(gl.zeros([BLOCK_I, D], gl.float32, kv_layout))
        pt_op = gl.zeros([BLOCK_I, BLOCK_Q], dtype, op_layout)
        dst_op = gl.zeros([BLOCK_I, BLOCK_Q], dtype, op_layout)
        st_zero = gl.zeros([BLOCK_I, BLOCK_Q], gl.float32, st_layout)
        qt = q_lo + offs_q
        # natural-log lse as loaded: scaled to log2 where used, so that the next tile's loads (issued a
        # step ahead) are not waited for right after they are issued
        lse = gl.load(LSE + qrow0 + qt, mask=qt < q_hi, other=0.0)
        dl = gl.load(DELTA + qrow0 + qt, mask=qt < q_hi, other=0.0)
        mbarrier.wait(kv_bar, 0)
        # A_REGS of the loop's A operands held in registers (K of S^T = K Q^T, then V of dP^T = V dO^T)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=2)
        k_a = _a_operand(k_smem, a_layout, A_REGS >= 1)
        v_a = _a_operand(v_smem, a_layout, A_REGS >= 2)
        # Only tiles near the diagonal (queries before the block's last dense token) and the last, partial
        # one need the mask: the tiles in between run a step without it (40 selects and 20 compares a
        # thread per tile at head dim 128). Three phases, in that order.
        n_diag = gl.minimum(gl.cdiv(BLOCK_I * T - 1, BLOCK_Q), n_q)
        n_full = gl.maximum((q_hi - q_lo) // BLOCK_Q, n_diag)
        bounds = (0, n_diag, n_full, n_q)
        for ph in gl.static_range(3):  # masked, plain, masked
            for i in range(bounds[ph], bounds[ph + 1]):
                dk, dv, pt_op, dst_op, lse, dl = _dkv_step(
                    i, ph != 1, dk, dv, pt_op, dst_op, lse, dl, k_a, v_a, q_ring, do_ring, q_bars, q_desc, do_desc,
                    LSE, DELTA, offs_q, st_zero, q_lo, q_hi, n_q, qrow0, S, qk_scale, b, h, T, BLOCK_I, STAGES,
                    BLOCK_Q, D, op_layout, dtype)
        dk, dv, pt_op, dst_op = warpgroup_mma_wait(0, deps=(dk, dv, pt_op, dst_op))

        mbarrier.invalidate(kv_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(q_bars.index(i))
        io: gl.constexpr = _io_layout(D, num_warps)
        jo = j0 + gl.arange(0, BLOCK_I, layout=gl.SliceLayout(1, io))
        co = gl.arange(0, D, layout=gl.SliceLayout(0, io))
        offs = (qrow0 + jo * T + (T - 1)).to(gl.int64)[:, None] * D + co[None, :]
        ok = (jo < n_items)[:, None]
        gl.store(DK + offs, gl.convert_layout((dk * sm_scale).to(dtype), io), mask=ok)
        gl.store(DV + offs, gl.convert_layout(dv.to(dtype), io), mask=ok)


    @gluon.jit
    def _dq_step(j, MASK: gl.constexpr, s, dp_tok, dq, q_a, do_a, kd_smem, vd_smem, k_bars, v_bars, kd_desc, vd_desc,
                 k_desc, v_desc, lse2, delta, offs_n, hi, qk_scale, n_tiles, b, h, tok0, STAGES: gl.constexpr,
                 BLOCK_N: gl.constexpr, D: gl.constexpr, op_layout: gl.constexpr, dtype: gl.constexpr):
        # Step j of dq's dense loop: tile j's S is done and its dP in flight (issued by step j - 1, or
        # before the loop). dQ += dS K_j is issued, then tile j + 1's S and dP behind it, so the tensor
        # cores go on from one tile to the next without a drain -- and from the last dense tile straight
        # into the block's own keys. Each wait for fewer than all products sits in the step that issued
        # them (ptxas serializes every warpgroup MMA when it cannot tell which ones such a wait retires).
        # MASK: the keys past hi are masked (the last, partial tile only).
        slot = j % STAGES
        p = gl.exp2(s * qk_scale - lse2[:, None])
        if MASK:  # the last, partial tile
            p = gl.where((j * BLOCK_N + offs_n < hi)[None, :], p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        # V_j is consumed (by dP_j): its slot takes tile j + STAGES
        _refill_ring(vd_desc, v_desc, vd_smem, v_bars, j, True, STAGES, n_tiles, b, h, tok0, BLOCK_N, True)
        ds = p * (dp - delta[:, None])
        ds_op = gl.convert_layout(ds.to(dtype), op_layout)
        dq = warpgroup_mma(ds_op, _slot(kd_smem, slot, BLOCK_N, D), dq, is_async=True)
        # tile j + 1's S and dP into the registers of tile j's (consumed; use_acc=False ignores
        # them): a fresh zero accumulator would be set while dQ runs (C7515 again)
        nslot = (j + 1) % STAGES
        nph = ((j + 1) // STAGES) & 1
        mbarrier.wait(k_bars.index(nslot), nph)
        s_tok = warpgroup_mma(q_a, _slot(kd_smem, nslot, BLOCK_N, D).permute((1, 0)), s, use_acc=False,
                              is_async=True)
        mbarrier.wait(v_bars.index(nslot), nph)
        dp_tok = warpgroup_mma(do_a, _slot(vd_smem, nslot, BLOCK_N, D).permute((1, 0)), dp, use_acc=False,
                               is_async=True)
        # retires dQ_j (older) and S_{j+1}; dP_{j+1} runs on into the next step's exponentials
        s, ds_op = warpgroup_mma_wait(1, deps=(s_tok, ds_op))
        # K_j is consumed (by S_j and dQ_j): its slot takes tile j + STAGES
        _refill_ring(kd_desc, k_desc, kd_smem, k_bars, j, True, STAGES, n_tiles, b, h, tok0, BLOCK_N, True)
        return s, dp_tok, dq

    @gluon.jit
    def _sm90_dq_kernel(
        q_desc, do_desc, k_desc, v_desc, kd_desc, vd_desc, O, LSE, DELTA, DQ, DK, DV, LENGTHS,
        H, S, n_items, qk_scale, sm_scale,
        T: gl.constexpr, BLOCK_ITEMS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        D: gl.constexpr, STAGES: gl.constexpr, A_REGS: gl.constexpr, LPT: gl.constexpr, num_warps: gl.constexpr,
    ):
        # dq of one query block of whole items (as item_block._item_block_bwd_dq_kernel with
        # fuse_delta and fuse_sid_kv): a loop over the dense keys of earlier items -- S = Q K^T and
        # dP = dO V^T issued together, P formed while dP runs, dQ += dS K left running while the next
        # tile's S and dP are issued -- then the block's own keys, masked, which also give the dk/dv of
        # its SID keys. The own keys are the ring's last tile, so their S and dP follow the last dense
        # dQ product without a drain; delta = rowsum(dO * O) (stored for the dk/dv kernel) is computed
        # while the first tile's products run.
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = _mma_layout(BLOCK_N, num_warps)
        o_layout: gl.constexpr = _mma_layout(D, num_warps)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        p_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_M], dtype)

        pid_m, pid_bh = _block_and_head(LPT, True)  # heaviest (latest) query blocks first
        b = pid_bh // H
        h = pid_bh % H
        n_valid = gl.load(LENGTHS + b)
        item0 = pid_m * BLOCK_ITEMS
        row0 = pid_bh * S + item0 * T  # first row of the block in the contiguous outputs
        tok0 = item0 * T
        hi = gl.where(item0 < n_valid, item0, 0)
        n_tiles = gl.cdiv(hi, BLOCK_N)

        gl.static_assert(BLOCK_N == BLOCK_M, "dq: the block's own K/V ride the dense ring as its last tile")
        q_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], q_desc.layout)  # TMA's [1, 1, rows, D] box
        do_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], do_desc.layout)
        q_smem = q_s4.reshape([BLOCK_M, D])
        do_smem = do_s4.reshape([BLOCK_M, D])
        kd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kd_desc.layout)
        vd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], vd_desc.layout)
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_M], p_smem_layout)
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_M], p_smem_layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        _tma_load(q_desc, [b, h, tok0, 0], q_bar, q_s4)
        _tma_load(do_desc, [b, h, tok0, 0], q_bar, do_s4)
        # The ring carries tiles 0 .. n_tiles: the dense tiles, then the block's own K/V as tile n_tiles.
        for i in gl.static_range(STAGES):  # its first STAGES tiles (as refills of tiles -STAGES..-1)
            _refill_ring(kd_desc, k_desc, kd_smem, k_bars, i - STAGES, True, STAGES, n_tiles, b, h, tok0, BLOCK_N, True)
            _refill_ring(vd_desc, v_desc, vd_smem, v_bars, i - STAGES, True, STAGES, n_tiles, b, h, tok0, BLOCK_N, True)

        # delta = rowsum(dO * O) needs O (through pointers) and dO; it is computed while the first
        # tile's S and dP run, and used from that tile's dS on. 0 on padding rows.
        rb = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, blk))
        cb = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
        ok_b = (rb < BLOCK_ITEMS * T) & (item0 + rb // T < n_valid)
        o_t = gl.load(O + (row0 + rb)[:, None].to(gl.int64) * D + cb[None, :], mask=ok_b[:, None], other=0.0)
        rs = gl.arange(0, BLOCK_M, layout=s_rows)
        ok_s = (rs < BLOCK_ITEMS * T) & (item0 + rs // T < n_valid)
        lse = gl.load(LSE + (row0 + rs).to(gl.int64), mask=ok_s, other=0.0)  # issued before the wait for Q/dO
        offs_n = gl.arange(0, BLOCK_N, layout=s_cols)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        # dQ's zero accumulator passes through a (no-op) MMA wait so that its registers are set here,
        # ahead of the first products: set while they run, they would make ptxas serialize every
        # warpgroup MMA of the kernel (its C7515, "non wgmma instructions defining accumulator registers")
        dq = warpgroup_mma_init(warpgroup_mma_wait(0, deps=(gl.zeros([BLOCK_M, D], gl.float32, o_layout),)))
        mbarrier.wait(q_bar, 0)
        # A_REGS operands of S = Q K^T and dP = dO V^T held in registers (Q, then dO)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
        q_a = _a_operand(q_smem, a_layout, A_REGS >= 1)
        do_a = _a_operand(do_smem, a_layout, A_REGS >= 2)
        # tile 0's S and dP (a dense tile, or the block's own keys when there is none)
        mbarrier.wait(k_bars.index(0), 0)
        s_tok = warpgroup_mma(q_a, _slot(kd_smem, 0, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(0), 0)
        dp_tok = warpgroup_mma(do_a, _slot(vd_smem, 0, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        do_t = do_smem.load(blk)
        delta_b = gl.sum(do_t.to(gl.float32) * o_t.to(gl.float32), 1)
        delta_b = gl.where(ok_b, delta_b, 0.0)
        st_b = (rb < BLOCK_ITEMS * T) & (item0 * T + rb < S)
        gl.store(DELTA + (row0 + rb).to(gl.int64), delta_b, mask=st_b)
        lse2 = lse * 1.4426950408889634
        delta = gl.convert_layout(delta_b, s_rows)
        s = warpgroup_mma_wait(1, deps=(s_tok,))

        # The dense tiles (see _dq_step): the full ones, then (a loop of at most one step) the partial last
        # one with its key mask, as in the forward -- the mask cost 32 selects a thread per tile.
        n_full = hi // BLOCK_N
        bounds = (0, n_full, n_tiles)
        for ph in gl.static_range(2):  # plain, masked
            for j in range(bounds[ph], bounds[ph + 1]):
                s, dp_tok, dq = _dq_step(j, ph == 1, s, dp_tok, dq, q_a, do_a, kd_smem, vd_smem, k_bars, v_bars,
                                         kd_desc, vd_desc, k_desc, v_desc, lse2, delta, offs_n, hi, qk_scale, n_tiles,
                                         b, h, tok0, STAGES, BLOCK_N, D, op_layout, dtype)

        # the block's own keys (ring tile n_tiles; S_b done, dP_b in flight): the PinGER mask as two
        # comparisons (see item_block._inblock_index)
        own = n_tiles % STAGES
        kb_smem = _slot(kd_smem, own, BLOCK_M, D)
        vb_smem = _slot(vd_smem, own, BLOCK_M, D)
        vis = _inblock_vis(item0, n_valid, T, BLOCK_ITEMS, BLOCK_M, s_layout)
        pb = gl.where(vis, gl.exp2(s * qk_scale - lse2[:, None]), 0.0)
        dpb = warpgroup_mma_wait(0, deps=(dp_tok,))
        dsb = pb * (dpb - delta[:, None])
        dsb_op = gl.convert_layout(dsb.to(dtype), op_layout)
        # SID keys' dk/dv from the same tile: dV = P^T dO, dK = dS^T Q (A operands transposed in shared
        # memory, allocated at the start: allocated here, they could be placed over a buffer that an
        # asynchronous product still reads).
        p_smem.store(pb.to(dtype))
        ds_smem.store(dsb.to(dtype))
        fence_async_shared()
        dq_tok = warpgroup_mma(dsb_op, kb_smem, dq, is_async=True)
        o_zero = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        dv_tok = warpgroup_mma(p_smem.permute((1, 0)), do_smem, o_zero, use_acc=False, is_async=True)
        dk_tok = warpgroup_mma(ds_smem.permute((1, 0)), q_smem, o_zero, use_acc=False, is_async=True)
        dq, dv_s, dk_s, dsb_op = warpgroup_mma_wait(0, deps=(dq_tok, dv_tok, dk_tok, dsb_op))

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))
        ro = gl.arange(0, BLOCK_M, layout=o_rows)
        ok_o = (ro < BLOCK_ITEMS * T) & (item0 + ro // T < n_valid)
        dq = gl.where(ok_o[:, None], dq * sm_scale, 0.0)
        io: gl.constexpr = _io_layout(D, num_warps)
        offs, st_i, ri = _block_out(row0, item0, S, T, BLOCK_ITEMS, BLOCK_M, D, io)
        gl.store(DQ + offs, gl.convert_layout(dq.to(dtype), io), mask=st_i[:, None])
        sid = (st_i & (ri % T < T - 1))[:, None]
        gl.store(DK + offs, gl.convert_layout((dk_s * sm_scale).to(dtype), io), mask=sid)
        gl.store(DV + offs, gl.convert_layout(dv_s.to(dtype), io), mask=sid)


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, D: int, fp16: bool):
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.float16 if fp16 else gl.bfloat16)


def _desc(x: torch.Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor over a ``[B, H, R, D]`` tensor of any strides (last dim contiguous, the others
    16-byte multiples: see :func:`tma_ready`), boxes of ``[1, 1, rows, D]``."""
    D = x.shape[-1]
    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, rows, D],
                            _smem_layout(rows, D, x.dtype == torch.float16))


def launch_grid(n_blocks: int, n_heads: int, lpt: bool) -> tuple[int, int]:
    """The launch grid of the item-block kernels (these and ``item_block``'s): (blocks, B*H), or
    (B*H, blocks) with ``lpt`` -- the block index then varies slowest, so the heaviest blocks of
    every head are scheduled first and the light ones fill the tail."""
    return (n_heads, n_blocks) if lpt else (n_blocks, n_heads)


def tma_ready(*xs: torch.Tensor) -> bool:
    """Whether TMA can read these ``[B, H, R, D]`` tensors in place: unit last stride, every other
    stride and the start address 16-byte aligned."""
    for x in xs:
        item = x.element_size()
        if x.stride(-1) != 1 or x.data_ptr() % 16 or any((st * item) % 16 for st in x.stride()[:-1]):
            return False
    return True


def _dense(x: torch.Tensor, T: int) -> torch.Tensor:
    return x[:, :, T - 1 :: T]  # the dense tokens, [B, H, n_items, D]: a strided view


def launch_fwd_sm90(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    T: int, scale: float, *, block_m: int = 64, block_n: int = 64, num_warps: int = 4, stages: int = 2,
    a_regs: int = 0, lpt: bool = False,
) -> None:
    """Fill ``out`` (contiguous, q's shape and dtype) and ``lse`` ([B, H, S] fp32, contiguous) with
    the forward. q, k, v ``[B, H, S, D]`` of any strides TMA can read (else copied); ``lengths``
    int32 on q's device."""
    if not sm90_available(q):
        raise RuntimeError("item_block sm90 forward: needs Gluon and bf16/fp16 CUDA tensors on a Hopper GPU")
    B, H, S, D = q.shape
    if block_m & (block_m - 1) or block_m < 16 * num_warps or block_m < T:
        raise ValueError(f"block_m: a power of two >= 16 x num_warps ({16 * num_warps}) and >= T={T}, got {block_m}")
    if block_n & (block_n - 1) or not 16 <= block_n <= 256:
        raise ValueError(f"block_n: a power of two in [16, 256], got {block_n}")
    if stages < 2:
        raise ValueError(f"stages: the dense K/V ring needs at least 2 slots, got {stages}")
    if not out.is_contiguous() or not lse.is_contiguous():
        raise ValueError("item_block sm90 forward: out and lse must be contiguous")
    q, k, v = (x if tma_ready(x) else x.contiguous() for x in (q, k, v))
    n_items = S // T
    _sm90_fwd_kernel[launch_grid(triton.cdiv(n_items, block_m // T), B * H, lpt)](
        _desc(q, block_m), _desc(k, block_m), _desc(v, block_m), _desc(_dense(k, T), block_n),
        _desc(_dense(v, T), block_n), out, lse, lengths, H, S, n_items, scale * _LOG2E,
        T=T, BLOCK_ITEMS=block_m // T, BLOCK_M=block_m, BLOCK_N=block_n, D=D, STAGES=stages, A_REGS=bool(a_regs),
        LPT=lpt, num_warps=num_warps,
    )


def launch_dense_kv_sm90(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    dk: torch.Tensor, dv: torch.Tensor, lengths: torch.Tensor, T: int, scale: float, *,
    block_i: int = 64, block_q: int = 64, num_warps: int = 4, stages: int = 2, a_regs: int = 0,
    lpt: bool = False,
) -> None:
    """Write the dense keys' rows of ``dk`` and ``dv`` (contiguous ``[B, H, S, D]``), as
    ``item_block._item_block_bwd_dense_kv_kernel`` does. q, k, v, dO of any strides TMA can read
    (:func:`tma_ready`); ``lse`` and ``delta`` contiguous ``[B, H, S]`` fp32."""
    if not sm90_available(q):
        raise RuntimeError("item_block sm90 dense dk/dv: needs Gluon and bf16/fp16 CUDA tensors on a Hopper GPU")
    B, H, S, D = q.shape
    if block_i & (block_i - 1) or block_i < 16 * num_warps:
        raise ValueError(f"block_i: a power of two >= 16 x num_warps ({16 * num_warps}), got {block_i}")
    if block_q & (block_q - 1) or not 16 <= block_q <= 256 or stages < 2:
        raise ValueError(f"block_q: a power of two in [16, 256] (got {block_q}); stages >= 2 (got {stages})")
    for name, x in (("lse", lse), ("delta", delta), ("dk", dk), ("dv", dv)):
        if not x.is_contiguous():
            raise ValueError(f"item_block sm90 dense dk/dv: {name} must be contiguous")
    if not tma_ready(q, k, v, do):
        raise ValueError("item_block sm90 dense dk/dv: q, k, v, dO must be TMA-readable (see tma_ready)")
    n_items = S // T
    _sm90_dense_kv_kernel[launch_grid(triton.cdiv(n_items, block_i), B * H, lpt)](
        _desc(q, block_q), _desc(do, block_q), _desc(_dense(k, T), block_i), _desc(_dense(v, T), block_i),
        lse, delta, dk, dv, lengths, H, S, n_items, scale * _LOG2E, scale,
        T=T, BLOCK_I=block_i, BLOCK_Q=block_q, D=D, STAGES=stages, A_REGS=a_regs, LPT=lpt, num_warps=num_warps,
    )


def launch_dq_sm90(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, lengths: torch.Tensor, T: int,
    scale: float, *, block_m: int = 64, num_warps: int = 4, stages: int = 2, block_n: int | None = None,
    a_regs: int = 0, lpt: bool = False,
) -> None:
    """Write ``dq``, ``delta`` and the SID keys' rows of ``dk`` / ``dv``, as the Triton dq kernel does
    with ``fuse_delta`` and ``fuse_sid_kv``. q, k, v, dO of any strides TMA can read; the others
    contiguous. ``block_n`` (dense keys per step) must be ``block_m`` (its default)."""
    if not sm90_available(q):
        raise RuntimeError("item_block sm90 dq: needs Gluon and bf16/fp16 CUDA tensors on a Hopper GPU")
    B, H, S, D = q.shape
    block_n = block_n or block_m
    if block_m & (block_m - 1) or block_m < 16 * num_warps or block_m < T:
        raise ValueError(f"block_m: a power of two >= 16 x num_warps ({16 * num_warps}) and >= T={T}, got {block_m}")
    if block_n != block_m or stages < 2:
        raise ValueError(f"item_block sm90 dq: block_n must equal block_m (the block's own keys ride the dense "
                         f"ring as its last tile; got {block_n} and {block_m}); stages >= 2 (got {stages})")
    for name, x in (("out", out), ("lse", lse), ("delta", delta), ("dq", dq), ("dk", dk), ("dv", dv)):
        if not x.is_contiguous():
            raise ValueError(f"item_block sm90 dq: {name} must be contiguous")
    if not tma_ready(q, k, v, do):
        raise ValueError("item_block sm90 dq: q, k, v, dO must be TMA-readable (see tma_ready)")
    n_items = S // T
    _sm90_dq_kernel[launch_grid(triton.cdiv(n_items, block_m // T), B * H, lpt)](
        _desc(q, block_m), _desc(do, block_m), _desc(k, block_m), _desc(v, block_m),
        _desc(_dense(k, T), block_n), _desc(_dense(v, T), block_n),
        out, lse, delta, dq, dk, dv, lengths, H, S, n_items, scale * _LOG2E, scale,
        T=T, BLOCK_ITEMS=block_m // T, BLOCK_M=block_m, BLOCK_N=block_n, D=D, STAGES=stages, A_REGS=a_regs,
        LPT=lpt, num_warps=num_warps,
    )
