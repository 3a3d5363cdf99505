"""Probe (not used by genrec): dq's dense loop alone, with 64 and with 128 query rows per program.
H100/H200 (sm_90), Gluon; ``--compile-only`` anywhere.

Usage:
    python benchmarks/probe_dq_rows.py [--iters 20] [--variant NAME] [--compile-only]

Why: in the twenty-first session the backward's dS stash removed two of dq's three products and all of its
exponentials, and dq still took 0.311 ms against 0.329 (8 x 128). So dq is bound by streaming the dense K
and V tiles through its ring, once per 64-row query block, not by its arithmetic. With 128 query rows per
program (8 warps: two warp groups along M) every K/V tile serves twice the queries, and the dense loop loads
half as many tiles. Building that into the production kernel is a larger change (its own keys would leave
the shared ring, and shared memory would have to be reused to fit the in-block part), so this measures
the loop alone first.

What: production's ``item_block_sm90._dq_step`` (S = Q K^T and dP = dO V^T issued together, dQ += dS K
left running into the next tile) in a kernel with ``_sm90_dq_kernel``'s prologue and no in-block part:
each program takes one query block of whole items (12 items at 64 rows, 25 at 128) and loops over the
dense keys of the items before it, its K/V tiles on a TMA ring (the ring's extra last tile, the block's own
keys in production, is loaded and multiplied but not used). B 8 x 1,024 items x 5 tokens, every row full.
Each variant runs in its own subprocess: a check against torch (B 1 x H 2 x 300 items: dQ's dense part,
the masked last tile included), then the CUDA-graph time at the full shape, TFLOP/s over the loop's own
tiles (3 products of 2 x BLOCK_M x 64 x D FLOP each) and the time per query row relative to the 64-row
variant of the same head dim.

Variants: NAME = D-rows-warps-stages-aregs (aregs: Q, then dO, held in registers as the tuned dq does).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from genrec.kernels import item_block_sm90 as sm  # noqa: E402
from probe_common import matmul_peak, probe_args, run_variants  # noqa: E402

T, B, N_ITEMS, BLOCK_N = 5, 8, 1024, 64
VARIANTS = ["128-64-4-2-1", "128-128-8-2-1", "128-128-8-3-1", "128-128-8-2-0",
            "64-64-4-3-1", "64-128-8-3-1", "64-128-8-2-1"]
SHAPES = {128: 8, 64: 12}  # head dim -> heads


@gluon.jit
def _dense_dq_kernel(q_desc, do_desc, kd_desc, vd_desc, LSE, DELTA, DQ, H, S, qk_scale,
                     T: gl.constexpr, BLOCK_ITEMS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     D: gl.constexpr, STAGES: gl.constexpr, A_REGS: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = sm._mma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = sm._mma_layout(D, num_warps)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    pid_m, pid_bh = sm._block_and_head(False, True)
    b = pid_bh // H
    h = pid_bh % H
    item0 = pid_m * BLOCK_ITEMS
    row0 = pid_bh * S + item0 * T
    tok0 = item0 * T
    hi = item0  # every row full: the dense keys [0, item0) are visible to the whole block
    n_tiles = gl.cdiv(hi, BLOCK_N)

    q_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], q_desc.layout)
    do_s4 = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], do_desc.layout)
    kd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kd_desc.layout)
    vd_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], vd_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    sm._tma_load(q_desc, [b, h, tok0, 0], q_bar, q_s4)
    sm._tma_load(do_desc, [b, h, tok0, 0], q_bar, do_s4)
    for i in gl.static_range(STAGES):  # the ring's tile n_tiles reads dense coordinates past the end: zeros
        sm._refill_ring(kd_desc, kd_desc, kd_smem, k_bars, i - STAGES, True, STAGES, n_tiles, b, h, tok0, BLOCK_N,
                        True)
        sm._refill_ring(vd_desc, vd_desc, vd_smem, v_bars, i - STAGES, True, STAGES, n_tiles, b, h, tok0, BLOCK_N,
                        True)
    rs = gl.arange(0, BLOCK_M, layout=s_rows)
    in_head = tok0 + rs < S  # the last block's rows past the head's end
    lse2 = gl.load(LSE + (row0 + rs).to(gl.int64), mask=in_head, other=0.0) * 1.4426950408889634
    delta = gl.load(DELTA + (row0 + rs).to(gl.int64), mask=in_head, other=0.0)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    dq = warpgroup_mma_init(warpgroup_mma_wait(0, deps=(gl.zeros([BLOCK_M, D], gl.float32, o_layout),)))
    mbarrier.wait(q_bar, 0)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    q_a = sm._a_operand(q_s4.reshape([BLOCK_M, D]), a_layout, A_REGS >= 1)
    do_a = sm._a_operand(do_s4.reshape([BLOCK_M, D]), a_layout, A_REGS >= 2)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(q_a, sm._slot(kd_smem, 0, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_bars.index(0), 0)
    dp_tok = warpgroup_mma(do_a, sm._slot(vd_smem, 0, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    n_full = hi // BLOCK_N
    bounds = (0, n_full, n_tiles)
    for ph in gl.static_range(2):  # plain, masked
        for j in range(bounds[ph], bounds[ph + 1]):
            s, dp_tok, dq = sm._dq_step(j, ph == 1, s, dp_tok, dq, q_a, do_a, kd_smem, vd_smem, k_bars, v_bars,
                                        kd_desc, vd_desc, kd_desc, vd_desc, lse2, delta, offs_n, hi, qk_scale,
                                        n_tiles, b, h, tok0, STAGES, BLOCK_N, D, op_layout, dtype)
    dq, dp_tok, s = warpgroup_mma_wait(0, deps=(dq, dp_tok, s))
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    io: gl.constexpr = sm._io_layout(D, num_warps)
    offs, st_i, _ = sm._block_out(row0, item0, S, T, BLOCK_ITEMS, BLOCK_M, D, io)
    gl.store(DQ + offs, gl.convert_layout(dq, io), mask=st_i[:, None])


def _parse(name: str) -> tuple[int, int, int, int, int]:
    D, rows, warps, stages, aregs = (int(x) for x in name.split("-"))
    return D, rows, warps, stages, aregs


def _launch(q, do, k, v, lse, delta, dq, rows: int, warps: int, stages: int, aregs: int) -> None:
    Bq, H, S, D = q.shape
    items = rows // T
    n_items = S // T
    _dense_dq_kernel[(triton.cdiv(n_items, items), Bq * H)](
        sm._desc(q, rows), sm._desc(do, rows), sm._desc(sm._dense(k, T), BLOCK_N), sm._desc(sm._dense(v, T), BLOCK_N),
        lse, delta, dq, H, S, D ** -0.5 * 1.4426950408889634,
        T=T, BLOCK_ITEMS=items, BLOCK_M=rows, BLOCK_N=BLOCK_N, D=D, STAGES=stages, A_REGS=aregs, num_warps=warps)


def _reference(q, do, k, v, lse, delta, rows: int) -> torch.Tensor:
    """dQ's dense part (unscaled, as the kernel leaves it): for a query in the block starting at item i0,
    the dense keys of items [0, i0)."""
    Bq, H, S, D = q.shape
    items = rows // T
    kd, vd = (x[:, :, T - 1 :: T].float() for x in (k, v))
    s = q.float() @ kd.transpose(-1, -2) * D ** -0.5
    p = torch.exp(s - lse[..., None])
    dp = do.float() @ vd.transpose(-1, -2)
    ds = p * (dp - delta[..., None])
    first = (torch.arange(S, device=q.device) // T // items) * items  # the block's first item, per query row
    ds = ds * (torch.arange(S // T, device=q.device)[None, :] < first[:, None])
    return ds @ kd


def run_variant(name: str, iters: int) -> int:
    from genrec.bench.kernels import _time_graph

    D, rows, warps, stages, aregs = _parse(name)
    torch.manual_seed(0)
    ok = True
    # check: small shape against torch; lse = the true row logsumexp scale of the scores is not needed for a
    # check of the arithmetic, so lse and delta are random (moderate) values
    Hs, n = 2, 300
    q, k, v, do = (torch.randn(1, Hs, n * T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    lse = torch.rand(1, Hs, n * T, device="cuda") * 4 + 2
    delta = torch.randn(1, Hs, n * T, device="cuda") * 0.1
    dq = torch.full_like(q, float("nan"))
    _launch(q, do, k, v, lse, delta, dq, rows, warps, stages, aregs)
    torch.cuda.synchronize()
    ref = _reference(q, do, k, v, lse, delta, rows)
    err = float((dq.float() - ref).abs().max() / ref.abs().max())
    nan = bool(torch.isnan(dq).any())
    ok = err < 1e-2 and not nan
    print(f"    check vs torch (1 x {Hs} x {n} items): max err / max |ref| {err:.2e}, NaN left {nan}  "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    H = SHAPES[D]
    S = N_ITEMS * T
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    lse = torch.rand(B, H, S, device="cuda") * 4 + 2
    delta = torch.randn(B, H, S, device="cuda") * 0.1
    dq = torch.empty_like(q)
    ms = _time_graph(lambda: _launch(q, do, k, v, lse, delta, dq, rows, warps, stages, aregs), 3, iters, reps=5)
    items = rows // T
    tiles = sum(triton.cdiv(blk * items, BLOCK_N) for blk in range(triton.cdiv(N_ITEMS, items)))
    flop = 3 * 2 * rows * BLOCK_N * D * tiles * B * H
    print("RESULT " + json.dumps({"ok": ok, "ms": ms, "tflops": flop / ms / 1e9, "tiles": tiles * B * H,
                                  "per_row_us": ms * 1e3 / (B * H * S)}), flush=True)
    return 0 if ok else 1


def compile_only() -> int:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    import inspect_item_block as iib

    bad = 0
    for name in VARIANTS:
        D, rows, warps, stages, aregs = _parse(name)
        sig = {"q_desc": iib._desc_type(rows, D, D), "do_desc": iib._desc_type(rows, D, D),
               "kd_desc": iib._desc_type(BLOCK_N, D, T * D), "vd_desc": iib._desc_type(BLOCK_N, D, T * D),
               "LSE": "*fp32", "DELTA": "*fp32", "DQ": "*bf16", "H": "i32", "S": "i32", "qk_scale": "fp32"}
        consts = {"T": T, "BLOCK_ITEMS": rows // T, "BLOCK_M": rows, "BLOCK_N": BLOCK_N, "D": D, "STAGES": stages,
                  "A_REGS": aregs, "num_warps": warps}
        sig.update({c: "constexpr" for c in consts})
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(_dense_dq_kernel.arg_names)
                 if sig[a].startswith("*") or a == "S"}
        try:
            kern = triton.compile(GluonASTSource(fn=_dense_dq_kernel, signature=sig, constexprs=consts, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        except Exception as e:
            print(f"{name:16s} COMPILE FAILED: {str(e)[-1500:]}")
            bad += 1
            continue
        st = iib._sass_stats(kern.asm["cubin"])
        print(f"{name:16s} regs {st.get('reg')}  LDL/STL {st['LDL']}/{st['STL']} (in loops {st['LOCAL_IN_LOOPS']})  "
              f"smem {kern.metadata.shared / 1024:.1f} KB  HGMMA {st['HGMMA']} (full drains {st['HGMMA_DRAINS']})",
              flush=True)
    return 1 if bad else 0


def main() -> int:
    ap = probe_args(steps=0)
    a = ap.parse_args()
    if a.compile_only:
        return compile_only()
    if a.variant:
        return run_variant(a.variant, a.iters)
    matmul_peak(a.iters)
    results = run_variants(__file__, VARIANTS, a)
    print(f"\nB {B} x {N_ITEMS} items x {T} tokens; dq's dense loop alone; per-row time relative to the 64-row variant "
          f"of the same head dim (the tuned tiles)")
    print(f"{'variant (D-rows-warps-stages-aregs)':36s} {'ms':>8s} {'TFLOP/s':>8s} {'us/row x1e3':>11s} {'vs 64 rows':>10s}  check")
    for name in VARIANTS:
        r = results.get(name)
        if r is None:
            print(f"{name:36s}  (no result)")
            continue
        base = results.get(f"{name.split('-')[0]}-64-4-{3 if name.startswith('64') else 2}-1")
        rel = f"{r['per_row_us'] / base['per_row_us']:10.3f}" if base else f"{'-':>10s}"
        print(f"{name:36s} {r['ms']:8.4f} {r['tflops']:8.1f} {r['per_row_us'] * 1e3:11.3f} {rel}  "
              f"{'ok' if r['ok'] else 'FAIL'}", flush=True)
    return 0 if results and all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
