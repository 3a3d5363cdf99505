"""Probe (not used by genrec): the rate of the Gluon forward's inner step with nothing but its matmuls
(and optionally its softmax) -- no TMA, no mbarriers, no masks, no prologue or epilogue. GPU only.

Usage:
    python benchmarks/probe_mma_rate.py [--iters 20]

Each program keeps Q (64 x D) and one K and V tile (BLOCK_N x D) in shared memory, filled once from
random data, and runs the forward's step on them ``steps`` times: S = Q K^T issued, O += P V issued,
wait for S, (optionally) the online softmax of S into P and the rescale of O, wait for O. The grid is
1, 2 or 3 programs per SM (the production forward runs 2 at head dim 128). The table
gives the useful matmul rate (4 x 64 x BLOCK_N x D FLOP per step) against a large bf16 matmul timed
in the same run, for 64- and 128-key tiles at head dim 128 and 64-key tiles at 64: the ceiling of
the step itself, to compare with the whole forward's ~296 TFLOP/s at 8 x 128.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from genrec.kernels import item_block_sm90 as sm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_common import matmul_peak  # noqa: E402

_tma_load = sm._tma_load


@gluon.jit
def _step_kernel(X, OUT, steps, qk_scale, BLOCK_N: gl.constexpr, D: gl.constexpr, SOFTMAX: gl.constexpr,
                 num_warps: gl.constexpr):
    dtype: gl.constexpr = X.dtype.element_ty
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = sm._mma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = sm._mma_layout(D, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype))
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype))
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype))
    base = gl.program_id(0) * (BLOCK_M + 2 * BLOCK_N) * D
    rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, blk))
    rn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, blk))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    q_smem.store(gl.load(X + base + rm[:, None] * D + cd[None, :]))
    k_smem.store(gl.load(X + base + BLOCK_M * D + rn[:, None] * D + cd[None, :]))
    v_smem.store(gl.load(X + base + (BLOCK_M + BLOCK_N) * D + rn[:, None] * D + cd[None, :]))
    fence_async_shared()

    m_i, l_i, acc, s_zero, p, offs_n = sm._fwd_state(BLOCK_M, BLOCK_N, D, s_layout, o_layout, p_layout, dtype)
    for _ in range(steps):
        s_tok = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        o_tok = warpgroup_mma(p, v_smem, acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        if SOFTMAX:
            p_next, alpha, m_i, l_i = sm._online_softmax(s, m_i, l_i, qk_scale, p_layout, dtype)
            acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        else:
            p_next = gl.convert_layout(s.to(dtype), p_layout)
            acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        p = p_next
    # something depends on every result, so nothing is dropped
    tot = gl.sum(gl.sum(acc, 1), 0) + gl.sum(l_i, 0)
    gl.store(OUT + gl.program_id(0), tot)


@gluon.jit
def _ring_refill(desc, ring, bars, t, b, h, N_TILES: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    # ring tile t (>= 0) into slot t % STAGES: the head's dense tile t % N_TILES (the keys cycle)
    mbarrier.expect(bars.index(t % STAGES), desc.block_type.nbytes)
    _tma_load(desc, [b, h, (t % N_TILES) * BLOCK_N, 0], bars.index(t % STAGES), ring.index(t % STAGES))


@gluon.jit
def _ring_kernel(kd_desc, vd_desc, X, OUT, steps, qk_scale, H, BLOCK_N: gl.constexpr, D: gl.constexpr,
                 N_TILES: gl.constexpr, STAGES: gl.constexpr, A_REGS: gl.constexpr, num_warps: gl.constexpr):
    # the same step with the production forward's K/V ring: program i reads head i % H's dense K/V tiles
    # (N_TILES of them, cycling) through TMA into a ring of STAGES slots guarded by mbarriers; A_REGS: Q
    # is the register operand of S = Q K^T (shared memory then serves K and V alone)
    dtype: gl.constexpr = X.dtype.element_ty
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = sm._mma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = sm._mma_layout(D, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    h = gl.program_id(0) % H
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype))
    kd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kd_desc.layout)
    vd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], vd_desc.layout)
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        _ring_refill(kd_desc, kd_smem, k_bars, i, 0, h, N_TILES, BLOCK_N, STAGES)
        _ring_refill(vd_desc, vd_smem, v_bars, i, 0, h, N_TILES, BLOCK_N, STAGES)
    rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, blk))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    q_smem.store(gl.load(X + gl.program_id(0) * BLOCK_M * D + rm[:, None] * D + cd[None, :]))
    fence_async_shared()
    q_a = sm._a_operand(q_smem, gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2), A_REGS)

    m_i, l_i, acc, s_zero, p, offs_n = sm._fwd_state(BLOCK_M, BLOCK_N, D, s_layout, o_layout, p_layout, dtype)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(q_a, sm._slot(kd_smem, 0, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    _ring_refill(kd_desc, kd_smem, k_bars, STAGES, 0, h, N_TILES, BLOCK_N, STAGES)
    m_i = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    pf = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(pf, 1)
    p = gl.convert_layout(pf.to(dtype), p_layout)
    for j in range(1, steps):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_a, sm._slot(kd_smem, slot, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, sm._slot(vd_smem, prev, BLOCK_N, D), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        _ring_refill(kd_desc, kd_smem, k_bars, j + STAGES, 0, h, N_TILES, BLOCK_N, STAGES)
        p_next, alpha, m_i, l_i = sm._online_softmax(s, m_i, l_i, qk_scale, p_layout, dtype)
        acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        _ring_refill(vd_desc, vd_smem, v_bars, j - 1 + STAGES, 0, h, N_TILES, BLOCK_N, STAGES)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p = p_next
    last = steps - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p, sm._slot(vd_smem, last % STAGES, BLOCK_N, D), acc, is_async=True)
    acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
    # the ring's last refills are still in flight: wait for them before the program ends
    for i in gl.static_range(STAGES):
        t = steps + i
        mbarrier.wait(k_bars.index(t % STAGES), (t // STAGES) & 1)
        mbarrier.wait(v_bars.index((t - 1) % STAGES), ((t - 1) // STAGES) & 1)
    tot = gl.sum(gl.sum(acc, 1), 0) + gl.sum(l_i, 0)
    gl.store(OUT + gl.program_id(0), tot)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--ring-stages", default="2", help="comma-separated ring depths for the ring rows")
    ap.add_argument("--ring-q-regs", default="0", help="comma-separated: 0 (Q in shared memory), 1 (in registers)")
    ap.add_argument("--ring-only", action="store_true", help="of the ring-free rows keep only the production "
                    "forward's (head dim 128, 64 keys, 2 programs per SM, with softmax)")
    ap.add_argument("--launch-only", action="store_true", help="for a profiler: launch the ring-free step and the "
                    "2-slot ring step (head dim 128, 64 keys, softmax, 2 programs per SM) twice each, time nothing")
    a = ap.parse_args()
    from genrec.bench.kernels import _time_graph

    if a.launch_only:
        return launch_only(a.steps)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    peak = matmul_peak(a.iters)
    rows = []
    for D, BN in ((128, 64), (128, 128), (64, 64)):
        for progs_per_sm in (1, 2, 3):
            if a.ring_only and (D, BN, progs_per_sm) != (128, 64, 2):
                continue
            grid = progs_per_sm * sms
            xs = torch.randn(grid * (64 + 2 * BN) * D, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(grid, device="cuda")
            for soft in ((True,) if a.ring_only else (False, True)):
                def run():
                    _step_kernel[(grid,)](xs, out, a.steps, 0.125, BLOCK_N=BN, D=D, SOFTMAX=soft, num_warps=4)
                ms = _time_graph(run, 2, a.iters, reps=3)
                tf = 4 * 64 * BN * D * a.steps * grid / ms / 1e9
                rows.append((D, BN, soft, ms, tf))
                print(f"D {D:3d}  keys/step {BN:3d}  programs/SM {progs_per_sm}  softmax {str(soft):5s}  {ms:.3f} ms  {tf:6.1f} TFLOP/s "
                      f"({tf / peak:.0%} of the matmul)", flush=True)
    # the step with the K/V ring: head dim 128, 64-key tiles, 2-slot rings, 2 programs per SM; dense K/V
    # of 8 x 8 heads x 1,024 items read through the strided views the production forward reads
    T, n = 5, 1024
    for D, H in ((128, 64), (64, 96)):
        kd, vd = _dense_kv_descs(H, n, T, D)
        for progs_per_sm in ((2,) if D == 128 else (2, 3)):  # (its 82 KB fit two programs per SM at 128)
            grid = progs_per_sm * sms
            xs = torch.randn(grid * 64 * D, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(grid, device="cuda")

            for stages, q_regs in ((int(x), int(r)) for x in a.ring_stages.split(",") for r in a.ring_q_regs.split(",")):
                def run_ring():
                    _ring_kernel[(grid,)](kd, vd, xs, out, a.steps, 0.125, H, BLOCK_N=64, D=D, N_TILES=n // 64,
                                          STAGES=stages, A_REGS=bool(q_regs), num_warps=4)
                ms = _time_graph(run_ring, 2, a.iters, reps=3)
                tf = 4 * 64 * 64 * D * a.steps * grid / ms / 1e9
                gbs = 2 * 64 * D * 2 * a.steps * grid / ms / 1e6
                print(f"D {D:3d}  keys/step  64  programs/SM {progs_per_sm}  softmax True   + K/V ring of {stages} "
                      f"(TMA from L2{', Q in registers' if q_regs else ''})  {ms:.3f} ms  {tf:6.1f} TFLOP/s ({tf / peak:.0%} of the matmul), ring "
                      f"{gbs:,.0f} GB/s", flush=True)
    return 0


def _dense_kv_descs(H: int, n: int, T: int, D: int) -> tuple:
    """TMA descriptors (64-key tiles) over the dense tokens of random K and V, 1 x H heads x n items x T
    tokens, through the strided views the production forward reads."""
    k = torch.randn(1, H, n * T, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    return sm._desc(sm._dense(k, T), 64), sm._desc(sm._dense(v, T), 64)


def launch_only(steps: int) -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    T, n, D, H, grid = 5, 1024, 128, 64, 2 * sms
    xs = torch.randn(grid * (64 + 2 * 64) * D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(grid, device="cuda")
    kd, vd = _dense_kv_descs(H, n, T, D)
    for _ in range(2):
        _step_kernel[(grid,)](xs, out, steps, 0.125, BLOCK_N=64, D=D, SOFTMAX=True, num_warps=4)
    for _ in range(2):
        _ring_kernel[(grid,)](kd, vd, xs, out, steps, 0.125, H, BLOCK_N=64, D=D, N_TILES=n // 64, STAGES=2,
                              A_REGS=False, num_warps=4)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
