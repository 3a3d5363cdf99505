"""Probe (not used by genrec): what does the dense dk/dv step cost when it also computes dQ's share
and reduces it into a global fp32 accumulator (FlashAttention-3's backward layout)? H200 (sm_90a),
Triton >= 3.9 Gluon (``tma.async_atomic_add``). GPU only, except ``--compile-only``.

Usage:
    python benchmarks/probe_dq_reduce.py [--steps 1000] [--iters 20] [--variant NAME] [--compile-only]

Why: genrec's backward computes S and dP twice -- in the dq kernel (S = Q K^T, dP = dO V^T, dQ += dS K)
and in the dense dk/dv kernel (``item_block_sm90._dkv_step``: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
dK += dS^T Q). If the dk/dv step also produced dQ's share (dQ += dS K for its key block, summed over key
blocks in global memory by TMA reduce-add) the dq kernel would go. That pays if the 5-matmul step costs
less than ~1.35x the 4-matmul one.

What: like ``probe_mma_rate.py``, each program holds its operands in shared memory, filled once from
random data -- K and V (BLOCK_I = 64 dense keys x D = 128), one Q and dO tile (BLOCK_Q = 32 rows), lse
and delta in registers -- and runs the dk/dv step ``steps`` times with no loads: the production order
(S^T and dP^T issued together, K and V the A operands from shared memory as tuned(128) runs it; P^T
while dP^T runs; dV += P^T dO; dS^T; dK += dS^T Q; dK and dV chained across steps, never drained).
wgmma needs M = 64 per warp group, so dQ = dS K (M = BLOCK_Q = 32) is computed transposed:
dQ^T = K^T dS^T (M = D = 128, N = BLOCK_Q, K = BLOCK_I; A = the K buffer permuted, MN-major; B = dS^T
written as bf16 to a [BLOCK_I, BLOCK_Q] shared buffer). The fp32 dQ^T tile goes to a shared staging
buffer, then ``tma.async_atomic_add`` (cp.reduce.async.bulk.tensor.2d...add.f32) adds it into a global
fp32 dQ^T accumulator [D, 64 x BLOCK_Q]: program p adds at column tile p % 64, so several programs (key
blocks) reduce into the same query rows as they would in training. Variants:

  no-dq            the production step (4 matmuls)
  dq-mma           + dS^T to shared memory, dQ^T = K^T dS^T, its tile stored to the staging buffer;
                   no reduce (the matmul's and the staging store's cost alone)
  dq-reduce        + TMA reduce-add of the staging buffer; order dV, dQ^T, dK; a wait for dQ^T (and dV)
                   leaves dK running while the tile is staged; tma.store_wait(0) before the staging store
  dq-reduce-2buf   as dq-reduce, staging double-buffered (store_wait(1))
  dq-defer         a step's dK and dQ^T issued at the top of the next step (ahead of its S^T and dP^T),
                   retired with S^T by its first wait, then staged and reduced while dP^T runs (step 0
                   multiplies and reduces zeros; the last step's dK and dQ^T follow the loop). Rotated so:
                   a wgmma issued in one loop body and read in the next made ptxas serialize them all
                   (C7514). ptxas gives it 255 registers and ~8 spill loads/stores in the loop.
  dq-defer-2buf    as dq-defer, staging double-buffered

Each variant runs in its own subprocess (a fault costs its row only): a correctness check against torch
(1 program x 3 steps, and 2 programs/SM x 2 steps: dK, dV and the dQ^T accumulator, bf16 tolerance), then
CUDA-graph timings at 1 and 2 programs per SM. The table gives ms, TFLOP/s (4 or 5 matmuls of
2 x 64 x 32 x 128 FLOP a step), the time per step relative to no-dq at the same occupancy, and the
reduce traffic (32 x 128 x 4 bytes a step a program), against a large bf16 matmul.

``--compile-only`` compiles every variant ahead of time for sm_90a (no GPU) and prints registers, spills
(LDL/STL in the SASS), shared memory, wgmma and cp.reduce.async.bulk.tensor counts in the PTX.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from genrec.kernels import item_block_sm90 as sm  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from probe_common import matmul_peak, probe_args, run_variants  # noqa: E402

LOG2E = 1.4426950408889634
D, BLOCK_I, BLOCK_Q, N_QT = 128, 64, 32, 64  # N_QT: column tiles of the dQ^T accumulator
VARIANTS = {  # name: (DQ mode, staging buffers); DQ 0 none, 1 matmul + staging only, 2 reduce, 3 deferred reduce
    "no-dq": (0, 1),
    "dq-mma": (1, 1),
    "dq-reduce": (2, 1),
    "dq-reduce-2buf": (2, 2),
    "dq-defer": (3, 1),
    "dq-defer-2buf": (3, 2),
}


@gluon.jit
def _stage_and_reduce(dqt, stage, dq_desc, k, col, BUFS: gl.constexpr, REDUCE: gl.constexpr):
    # the fp32 dQ^T tile into staging buffer k % BUFS (once the reduce that last read it is done), then
    # its TMA reduce-add into the global accumulator at column col
    buf = stage.index(k % BUFS)
    if REDUCE:
        tma.store_wait(BUFS - 1)
    buf.store(dqt)
    fence_async_shared()
    if REDUCE:
        tma.async_atomic_add(dq_desc, [0, col], buf)


@gluon.jit
def _dkv_step_kernel(X, LD, dq_desc, OUT, steps, qk_scale, n_qt, D: gl.constexpr, BLOCK_I: gl.constexpr,
                     BLOCK_Q: gl.constexpr, DQ: gl.constexpr, BUFS: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = X.dtype.element_ty
    st_layout: gl.constexpr = sm._mma_layout(BLOCK_Q, num_warps)  # S^T, dP^T [BLOCK_I, BLOCK_Q]; dQ^T [D, BLOCK_Q]
    kv_layout: gl.constexpr = sm._mma_layout(D, num_warps)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=2)
    q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    pid = gl.program_id(0)

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_I, D], gl.NVMMASharedLayout.get_default_for([BLOCK_I, D], dtype))
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_I, D], gl.NVMMASharedLayout.get_default_for([BLOCK_I, D], dtype))
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_Q, D], gl.NVMMASharedLayout.get_default_for([BLOCK_Q, D], dtype))
    do_smem = gl.allocate_shared_memory(dtype, [BLOCK_Q, D], gl.NVMMASharedLayout.get_default_for([BLOCK_Q, D], dtype))
    if DQ > 0:
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_I, BLOCK_Q],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_I, BLOCK_Q], dtype))
        stage = gl.allocate_shared_memory(gl.float32, [BUFS, D, BLOCK_Q], dq_desc.layout)
        ds_smem.store(gl.zeros([BLOCK_I, BLOCK_Q], dtype, st_layout))  # (dq-defer's first dQ^T reads it)
    base = pid * (2 * BLOCK_I + 2 * BLOCK_Q) * D
    ri = gl.arange(0, BLOCK_I, layout=gl.SliceLayout(1, blk))
    rq = gl.arange(0, BLOCK_Q, layout=gl.SliceLayout(1, blk))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    k_smem.store(gl.load(X + base + ri[:, None] * D + cd[None, :]))
    v_smem.store(gl.load(X + base + BLOCK_I * D + ri[:, None] * D + cd[None, :]))
    q_smem.store(gl.load(X + base + 2 * BLOCK_I * D + rq[:, None] * D + cd[None, :]))
    do_smem.store(gl.load(X + base + (2 * BLOCK_I + BLOCK_Q) * D + rq[:, None] * D + cd[None, :]))
    offs_q = gl.arange(0, BLOCK_Q, layout=q_cols)
    lse2 = gl.load(LD + pid * 2 * BLOCK_Q + offs_q) * 1.4426950408889634
    dl = gl.load(LD + pid * 2 * BLOCK_Q + BLOCK_Q + offs_q)
    col = (pid % n_qt) * BLOCK_Q
    fence_async_shared()

    k_a = sm._a_operand(k_smem, a_layout, False)
    v_a = sm._a_operand(v_smem, a_layout, False)
    dk = warpgroup_mma_init(gl.zeros([BLOCK_I, D], gl.float32, kv_layout))
    dv = warpgroup_mma_init(gl.zeros([BLOCK_I, D], gl.float32, kv_layout))
    pt_op = gl.zeros([BLOCK_I, BLOCK_Q], dtype, op_layout)
    dst_op = gl.zeros([BLOCK_I, BLOCK_Q], dtype, op_layout)
    st_zero = gl.zeros([BLOCK_I, BLOCK_Q], gl.float32, st_layout)
    # dQ^T's accumulator set ahead of every product (see _sm90_dq_kernel: ptxas's C7515), then reused
    # with use_acc=False
    dqt = warpgroup_mma_init(warpgroup_mma_wait(0, deps=(gl.zeros([D, BLOCK_Q], gl.float32, st_layout),)))
    # at least one step, and LLVM knows it: with a zero-trip path, dq-defer's loop exit got its own block of
    # register moves, which made ptxas serialize every wgmma (C7515)
    for i in range(gl.maximum(steps, 1)):
        if DQ == 3:
            # the previous step's dK and dQ^T, issued here rather than at the end of that step, so that
            # dQ^T's issue and the read of its result sit in one loop body (issued across the back
            # edge and read in the next body, ptxas serializes every wgmma: its C7514). At i = 0 they
            # multiply zeros (dst_op, and ds_smem zeroed above): dK += 0, a zero tile reduced.
            dk = warpgroup_mma(dst_op, q_smem, dk, is_async=True)
            dqt_tok = warpgroup_mma(k_smem.permute((1, 0)), ds_smem, dqt, use_acc=False, is_async=True)
        st_tok = warpgroup_mma(k_a, q_smem.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v_a, do_smem.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if DQ == 3:
            # retires the previous step's dV, dK and dQ^T (older) and S^T; dP^T may still run: the tile is
            # staged and reduced while dP^T runs
            st, pt_op, dst_op, dqt_r = warpgroup_mma_wait(1, deps=(st_tok, pt_op, dst_op, dqt_tok))
            _stage_and_reduce(dqt_r, stage, dq_desc, i, col, BUFS, True)
            dqt = warpgroup_mma_init(dqt_r)
        else:
            st, pt_op, dst_op = warpgroup_mma_wait(1, deps=(st_tok, pt_op, dst_op))
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_smem, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=(dpt_tok,))
        dst = pt * (dpt - dl[None, :])
        dst_b = dst.to(dtype)
        dst_op = gl.convert_layout(dst_b, op_layout)
        if DQ == 1 or DQ == 2:
            ds_smem.store(dst_b)
            fence_async_shared()
            dqt_tok = warpgroup_mma(k_smem.permute((1, 0)), ds_smem, dqt, use_acc=False, is_async=True)
            dk = warpgroup_mma(dst_op, q_smem, dk, is_async=True)
            # retires dV and dQ^T (older); dK runs on while the tile is staged
            dqt_r = warpgroup_mma_wait(1, deps=(dqt_tok,))
            _stage_and_reduce(dqt_r, stage, dq_desc, i, col, BUFS, DQ == 2)
            dqt = warpgroup_mma_init(dqt_r)
        elif DQ == 3:
            # ds_smem's last reader (the previous dQ^T) was retired by the wait above; dK and dQ^T of
            # this step are issued at the top of the next
            ds_smem.store(dst_b)
            fence_async_shared()
        else:
            dk = warpgroup_mma(dst_op, q_smem, dk, is_async=True)
    if DQ == 3:  # the last step's dK and dQ^T, after a drain (issued behind the in-flight dV, ptxas
        # serializes every wgmma: C7515)
        dk, dv, pt_op, dst_op = warpgroup_mma_wait(0, deps=(dk, dv, pt_op, dst_op))
        dk_tok = warpgroup_mma(dst_op, q_smem, dk, is_async=True)
        dqt_tok = warpgroup_mma(k_smem.permute((1, 0)), ds_smem, dqt, use_acc=False, is_async=True)
        dk, dqt_f = warpgroup_mma_wait(0, deps=(dk_tok, dqt_tok))
        _stage_and_reduce(dqt_f, stage, dq_desc, steps, col, BUFS, True)
    else:  # (dQ^T, retired in the loop, is no dependency here: listing it serializes every wgmma, ptxas C7515)
        dk, dv, pt_op, dst_op = warpgroup_mma_wait(0, deps=(dk, dv, pt_op, dst_op))
    if DQ >= 2:
        tma.store_wait(0)  # the staging buffers must outlive the reduces that read them
    # dK and dV out (fp32, [grid, 2, BLOCK_I, D]), so nothing is dropped and the check can read them
    ro = gl.arange(0, BLOCK_I, layout=gl.SliceLayout(1, kv_layout))
    co = gl.arange(0, D, layout=gl.SliceLayout(0, kv_layout))
    offs = pid * 2 * BLOCK_I * D + ro[:, None] * D + co[None, :]
    gl.store(OUT + offs, dk)
    gl.store(OUT + BLOCK_I * D + offs, dv)


def _stage_layout():
    return gl.NVMMASharedLayout.get_default_for([D, BLOCK_Q], gl.float32)


def _dq_desc(acc: torch.Tensor) -> TensorDescriptor:
    # over the fp32 dQ^T accumulator [D, N_QT * BLOCK_Q], boxes of one [D, BLOCK_Q] tile
    return TensorDescriptor(acc, list(acc.shape), list(acc.stride()), [D, BLOCK_Q], _stage_layout())


def launch(variant, xs, ld, acc, out, steps, grid, qk_scale):
    dq, bufs = VARIANTS[variant]
    return _dkv_step_kernel[(grid,)](xs, ld, _dq_desc(acc), out, steps, qk_scale, N_QT, D=D, BLOCK_I=BLOCK_I,
                                     BLOCK_Q=BLOCK_Q, DQ=dq, BUFS=bufs, num_warps=4)


def _inputs(grid, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs = torch.randn(grid * (2 * BLOCK_I + 2 * BLOCK_Q) * D, device="cuda", generator=g).to(torch.bfloat16)
    lse = 2.0 + 0.5 * torch.rand(grid, BLOCK_Q, device="cuda", generator=g)
    delta = 0.5 * torch.randn(grid, BLOCK_Q, device="cuda", generator=g)
    ld = torch.cat([lse, delta], 1).contiguous()
    return xs, ld


def reference(xs, ld, grid, steps, qk_scale):
    """dK, dV [grid, 2, BLOCK_I, D] and the dQ^T accumulator [D, N_QT * BLOCK_Q] after `steps` steps, fp32,
    with P^T and dS^T rounded to bf16 where the kernel rounds them (the matmul operands)."""
    x = xs.float().view(grid, 2 * BLOCK_I + 2 * BLOCK_Q, D)
    k, v = x[:, :BLOCK_I], x[:, BLOCK_I:2 * BLOCK_I]
    q, do = x[:, 2 * BLOCK_I:2 * BLOCK_I + BLOCK_Q], x[:, 2 * BLOCK_I + BLOCK_Q:]
    lse2, dl = ld[:, :BLOCK_Q] * LOG2E, ld[:, BLOCK_Q:]
    st = k @ q.transpose(1, 2)
    pt = torch.exp2(st * qk_scale - lse2[:, None, :])
    dpt = v @ do.transpose(1, 2)
    dst = pt * (dpt - dl[:, None, :])
    pt_b, dst_b = pt.bfloat16().float(), dst.bfloat16().float()
    kv = torch.stack([dst_b @ q, pt_b @ do], 1) * steps
    dqt = (k.transpose(1, 2) @ dst_b) * steps  # [grid, D, BLOCK_Q]
    acc = torch.zeros(D, N_QT * BLOCK_Q, device=xs.device)
    for t in range(N_QT):
        sel = dqt[t::N_QT]
        if len(sel):
            acc[:, t * BLOCK_Q:(t + 1) * BLOCK_Q] = sel.sum(0)
    return kv, acc


def _check(name, got, ref, tol=2e-2):
    err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
    ok = err < tol and bool(torch.isfinite(got).all())
    print(f"    {name}: max err / max |ref| {err:.2e}  {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def run_variant(variant, a) -> int:
    """Check and time one variant (in its own process); prints a RESULT line for the parent."""
    from genrec.bench.kernels import _time_graph

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    qk = LOG2E / D ** 0.5
    dq_mode = VARIANTS[variant][0]
    ok = True
    for grid, steps in ((1, 3), (2 * sms, 2)):
        xs, ld = _inputs(grid, seed=grid)
        acc = torch.zeros(D, N_QT * BLOCK_Q, device="cuda")
        out = torch.full((grid, 2, BLOCK_I, D), float("nan"), device="cuda")
        launch(variant, xs, ld, acc, out, steps, grid, qk)
        torch.cuda.synchronize()
        kv_ref, acc_ref = reference(xs, ld, grid, steps, qk)
        ok &= _check(f"{grid} program(s) x {steps} steps: dK", out[:, 0], kv_ref[:, 0])
        ok &= _check(f"{grid} program(s) x {steps} steps: dV", out[:, 1], kv_ref[:, 1])
        if dq_mode >= 2:
            ok &= _check(f"{grid} program(s) x {steps} steps: dQ^T accumulator", acc, acc_ref)
    res = {"variant": variant, "ok": ok, "ms": {}}
    for per_sm in (1, 2):
        grid = per_sm * sms
        xs, ld = _inputs(grid, seed=7)
        acc = torch.zeros(D, N_QT * BLOCK_Q, device="cuda")
        out = torch.empty(grid, 2, BLOCK_I, D, device="cuda")
        kern = launch(variant, xs, ld, acc, out, a.steps, grid, qk)
        torch.cuda.synchronize()
        ms = _time_graph(lambda: launch(variant, xs, ld, acc, out, a.steps, grid, qk), 2, a.iters, reps=3)
        res["ms"][per_sm] = ms
        res["regs"], res["spills"], res["smem"] = kern.n_regs, kern.n_spills, kern.metadata.shared
    print("RESULT " + json.dumps(res), flush=True)
    return 0 if ok else 1


def compile_only() -> int:
    """Compile every variant for sm_90a ahead of time (no GPU) and read the PTX and SASS."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    acc = torch.zeros(D, N_QT * BLOCK_Q)
    try:  # registers and spills from the SASS (benchmarks/inspect_item_block.py's reader)
        import inspect_item_block as iib
    except Exception as e:  # informational only
        iib = None
        print(f"(no SASS reader: {e!r:.80})")
    bad = 0
    for variant, (dq, bufs) in VARIANTS.items():
        sig = {"X": "*bf16", "LD": "*fp32", "dq_desc": mangle_type(_dq_desc(acc)), "OUT": "*fp32", "steps": "i32",
               "qk_scale": "fp32", "n_qt": "i32"}
        consts = {"D": D, "BLOCK_I": BLOCK_I, "BLOCK_Q": BLOCK_Q, "DQ": dq, "BUFS": bufs, "num_warps": 4}
        sig.update({c: "constexpr" for c in consts})
        attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]}
        try:
            kern = triton.compile(GluonASTSource(fn=_dkv_step_kernel, signature=sig, constexprs=consts, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        except Exception as e:
            print(f"{variant:15s} COMPILE FAILED: {str(e)[-1500:]}")
            bad += 1
            continue
        ptx = kern.asm["ptx"]
        lines = ptx.splitlines()
        wgmma = sum("wgmma.mma_async" in ln for ln in lines)
        reduce = sorted({re.sub(r"^@%p\d+\s+|\s*\[.*", "", ln.strip()) for ln in lines
                         if "cp.reduce.async.bulk.tensor" in ln})
        n_reduce = sum("cp.reduce.async.bulk.tensor" in ln for ln in lines)
        waits = sorted({ln.strip().rstrip(";") for ln in lines if "cp.async.bulk.wait_group" in ln})
        sass = "(no SASS)"
        if iib is not None:
            try:
                st = iib._sass_stats(kern.asm["cubin"])
                sass = (f"regs {st.get('reg')}  LDL/STL {st['LDL']}/{st['STL']} (in loops {st['LOCAL_IN_LOOPS']})  "
                        f"HGMMA {st['HGMMA']} (full drains {st['HGMMA_DRAINS']})  BAR {st['BAR']}")
            except Exception as e:  # informational only
                sass = f"(no SASS stats: {e!r:.60})"
        print(f"{variant:15s} DQ {dq} bufs {bufs}  smem {kern.metadata.shared / 1024:.1f} KB  {sass}\n"
              f"    PTX: {wgmma} wgmma.mma_async, {n_reduce} cp.reduce.async.bulk.tensor {reduce}\n"
              f"    bulk waits {waits}")
        if (dq >= 2) != (n_reduce > 0) or kern.metadata.shared > 113 * 1024:
            print(f"    UNEXPECTED for {variant}")
            bad += 1
    return 1 if bad else 0


def main() -> int:
    a = probe_args(steps=1000).parse_args()
    if a.compile_only:
        return compile_only()
    if a.variant:
        return run_variant(a.variant, a)
    peak = matmul_peak(a.iters)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = run_variants(__file__, VARIANTS, a)
    flop_step = 2 * BLOCK_I * BLOCK_Q * D
    print(f"\nsteps {a.steps}, D {D}, BLOCK_I {BLOCK_I}, BLOCK_Q {BLOCK_Q}, {sms} SMs; ratio = time per step / no-dq's "
          f"at the same programs/SM (restructuring pays below ~1.35)")
    print(f"{'variant':15s} {'prog/SM':>7s} {'regs':>4s} {'spill':>5s} {'smem KB':>7s} {'ms':>8s} {'TFLOP/s':>8s} "
          f"{'of mm':>6s} {'ratio':>6s} {'reduce GB/s':>11s}  check")
    for variant, (dq, _) in VARIANTS.items():
        res = results.get(variant)
        if res is None:
            print(f"{variant:15s}  (no result)")
            continue
        for per_sm in ("1", "2"):
            ms = res["ms"].get(per_sm)
            base = results.get("no-dq", {}).get("ms", {}).get(per_sm)
            if ms is None:
                continue
            grid = int(per_sm) * sms
            nmm = 5 if dq else 4
            tf = nmm * flop_step * a.steps * grid / ms / 1e9
            ratio = f"{ms / base:6.3f}" if base else "     -"
            gbs = f"{BLOCK_Q * D * 4 * a.steps * grid / ms / 1e6:11,.0f}" if dq >= 2 else f"{'-':>11s}"
            print(f"{variant:15s} {per_sm:>7s} {res['regs']:4d} {res['spills']:5d} {res['smem'] / 1024:7.1f} {ms:8.3f} "
                  f"{tf:8.1f} {tf / peak:6.0%} {ratio} {gbs}  {'ok' if res['ok'] else 'FAIL'}", flush=True)
    return 0 if results and all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
