"""Probe (not used by genrec): does TMA multicast over a 2-CTA cluster relieve the L2 -> SM traffic of
the forward's inner step? H200 (sm_90a), Triton >= 3.9 Gluon (multi-CTA layouts). GPU only.

Usage:
    python benchmarks/probe_multicast.py [--iters 20] [--steps 2000] [--variant NAME] [--compile-only]

``probe_mma_rate.py``'s ring variant (S = Q K^T, online softmax, O += P V, with 64-key K/V tiles streamed
through a 2-slot TMA ring from a strided dense K/V of 64 heads x 1,024 keys, all in L2, 2 programs per SM)
ran at ~497 TFLOP/s with 7.76 TB/s from L2: every program streams its own copy of every tile. Here
one kernel, written for a CGA of ``num_ctas`` CTAs, runs the same step with each CTA holding its own
64 query rows (the Q tile is [64 * num_ctas, D], split over the CTAs by its ``cga_layout``) and the
K/V ring slots laid out with a broadcast ``cga_layout`` (every CTA holds the whole tile):

  ring        num_ctas 1: the ring variant (2-D descriptors; also the original 4-D kernel, ring-orig)
  cluster     num_ctas 2, no multicast: each CTA loads its own copy (cluster launch cost alone)
  mcast       num_ctas 2, multicast: CTA 0 loads each tile once into BOTH CTAs' slots
              (cp.async.bulk.tensor ... .multicast::cluster, mask 0b11). Each CTA's "ready" barrier
              expects the whole tile's bytes (the multicast signals both). A slot is refilled only
              after both CTAs have read it: both arrive on a 2-CTA "empty" barrier (count 2, living
              in CTA 0), CTA 0 waits on it, then issues the refill.
  mcast-sync  as mcast, but the release is a full cluster barrier before each refill (the simplest
              correct version; two per step; no remote mbarrier arrive)
  mcast-defer as mcast, but K_j's slot is refilled after the softmax of S_j rather than before it (the
              lead's wait for its peer's release moves off the S -> softmax path)

Every variant stores its normalized output O (fp32), compared on the GPU (a small case, and the timed
case) against a torch reference, the multicast ones also against the cluster variant without
multicast (same rows, same heads: equal to the bit): ok / FAIL. Each variant runs in its own
subprocess with a timeout, so a hang (a wrong barrier protocol) costs that row, not the run. The table
gives TFLOP/s (4 x 64 x 64 x D per CTA-step) and the implied L2 -> SM bytes (the K/V tiles: each CTA's
copy without multicast, one copy per cluster with it), and a large bf16 matmul as the ceiling.

Triton lowers the remote arrive on the pair's barrier as ``mbarrier.arrive.shared::cluster`` at the local
address with bit 24 cleared (CTA 0's copy; no ``mapa``); mcast-sync does without it, so if that
arrive misroutes on sm_90 (a hang: mcast TIMEOUT) the multicast number still comes from mcast-sync.

``--compile-only`` compiles the kernels ahead of time for sm_90a (no GPU) and checks the PTX for
``multicast::cluster`` and ``.reqnctapercluster 2``.
"""
from __future__ import annotations

import os
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
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from probe_common import matmul_peak, probe_args, run_isolated  # noqa: E402

LOG2E = 1.4426950408889634
VARIANTS = {  # name: (num_ctas, multicast, cluster-barrier release, K refill after the softmax)
    "ring": (1, False, False, False),
    "cluster": (2, False, False, False),
    "mcast": (2, True, False, False),
    "mcast-sync": (2, True, True, False),
    "mcast-defer": (2, True, False, True),
}


@gluon.constexpr_function
def _rows_cga(nc):
    # a [64 * nc, N] tensor split by rows over the nc CTAs (nc in 1, 2)
    return [[1, 0]] if nc == 2 else []


@gluon.constexpr_function
def _bcast_cga(nc):
    # a 2-D tile every CTA holds whole (the K/V ring slots)
    return [[0, 0]] if nc == 2 else []


@gluon.constexpr_function
def _mma(n, num_warps, cga):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16],
                                     cga_layout=cga)


@gluon.constexpr_function
def _pair_bar_layout():
    # one mbarrier shared by the 2 CTAs (it lives in CTA 0, the lead): init's count and every arrive
    # count for both, only the lead waits
    return mbarrier.MBarrierLayout(cga_layout=[[0]])


@gluon.jit
def _release(empty, t, STAGES: gl.constexpr, MULTICAST: gl.constexpr, SYNC: gl.constexpr):
    # this CTA has read tile t from its slot: tell the lead (multicast with the mbarrier protocol only)
    if MULTICAST and not SYNC:
        mbarrier.arrive(empty.index(t % STAGES))


@gluon.jit
def _issue(desc, ring, ready, empty, t, row0, N_TILES: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
           MULTICAST: gl.constexpr, SYNC: gl.constexpr):
    # tile t (>= STAGES) into slot t % STAGES once both CTAs have read tile t - STAGES there (released).
    # The head's dense tile t % N_TILES (the keys cycle). Each CTA expects the whole tile on its own
    # "ready" barrier; with multicast only CTA 0 issues the copy, which lands in (and signals) both.
    slot = t % STAGES
    if MULTICAST:
        if SYNC:
            gl.barrier(cluster=True)
        else:
            mbarrier.wait(empty.index(slot), ((t - STAGES) // STAGES) & 1)  # the lead only
    mbarrier.expect(ready.index(slot), desc.nbytes_per_cta)
    tma.async_load(desc, [row0 + (t % N_TILES) * BLOCK_N, 0], ready.index(slot), ring.index(slot),
                   multicast=MULTICAST)


@gluon.jit
def _refill(desc, ring, ready, empty, t, row0, N_TILES: gl.constexpr, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, MULTICAST: gl.constexpr, SYNC: gl.constexpr):
    _release(empty, t - STAGES, STAGES, MULTICAST, SYNC)
    _issue(desc, ring, ready, empty, t, row0, N_TILES, BLOCK_N, STAGES, MULTICAST, SYNC)


@gluon.jit
def _cluster_ring_kernel(kd_desc, vd_desc, X, OUT, steps, qk_scale, H, n_keys, N_TILES: gl.constexpr,
                         STAGES: gl.constexpr, MULTICAST: gl.constexpr, SYNC: gl.constexpr,
                         DEFER: gl.constexpr, num_warps: gl.constexpr):
    # One CGA of NC CTAs = NC query blocks of 64 rows of one head (h = program % H), streaming the
    # head's dense K/V tiles (N_TILES of them, cycling, `steps` in all) through a ring of STAGES slots.
    NC: gl.constexpr = gl.num_ctas()
    dtype: gl.constexpr = kd_desc.dtype
    BLOCK_N: gl.constexpr = kd_desc.block_shape[0]
    D: gl.constexpr = kd_desc.block_shape[1]
    BLOCK_M: gl.constexpr = 64 * NC
    rows: gl.constexpr = _rows_cga(NC)
    s_layout: gl.constexpr = _mma(BLOCK_N, num_warps, rows)
    o_layout: gl.constexpr = _mma(D, num_warps, rows)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0], cga_layout=rows)
    gl.static_assert(BLOCK_N == 64)

    pid = gl.program_id(0)
    row0 = (pid % H) * n_keys  # the head's first dense row
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype, cga_layout=rows))
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kd_desc.layout)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], vd_desc.layout)
    # "ready": one barrier per CTA and slot (each CTA's own copy of the slot); "empty" (multicast):
    # one per slot for the pair
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, NC], mbarrier.MBarrierLayout.multicta(NC))
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, NC], mbarrier.MBarrierLayout.multicta(NC))
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
    if MULTICAST and not SYNC:
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], _pair_bar_layout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], _pair_bar_layout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_empty.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=1)
    else:
        k_empty = k_ready  # unused
        v_empty = v_ready
    # (Gluon puts a cluster barrier after the inits: no multicast lands on an uninitialized barrier)
    for i in gl.static_range(STAGES):
        mbarrier.expect(k_ready.index(i), kd_desc.nbytes_per_cta)
        tma.async_load(kd_desc, [row0 + i * BLOCK_N, 0], k_ready.index(i), k_ring.index(i), multicast=MULTICAST)
        mbarrier.expect(v_ready.index(i), vd_desc.nbytes_per_cta)
        tma.async_load(vd_desc, [row0 + i * BLOCK_N, 0], v_ready.index(i), v_ring.index(i), multicast=MULTICAST)
    rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, blk))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    q_smem.store(gl.load(X + (pid * BLOCK_M + rm)[:, None].to(gl.int64) * D + cd[None, :]))
    fence_async_shared()

    acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    _refill(kd_desc, k_ring, k_ready, k_empty, STAGES, row0, N_TILES, BLOCK_N, STAGES, MULTICAST, SYNC)
    m_i = gl.max(s, 1) * qk_scale
    pf = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(pf, 1)
    p = gl.convert_layout(pf.to(dtype), p_layout)
    for j in range(1, steps):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_ring.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_ring.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        if DEFER:  # release K_j's slot now, refill it after the softmax (the lead waits for its peer later)
            _release(k_empty, j, STAGES, MULTICAST, SYNC)
        else:
            _refill(kd_desc, k_ring, k_ready, k_empty, j + STAGES, row0, N_TILES, BLOCK_N, STAGES, MULTICAST, SYNC)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        pf = gl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + gl.sum(pf, 1)
        m_i = m_new
        p_next = gl.convert_layout(pf.to(dtype), p_layout)
        if DEFER:
            _issue(kd_desc, k_ring, k_ready, k_empty, j + STAGES, row0, N_TILES, BLOCK_N, STAGES, MULTICAST, SYNC)
        acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        _refill(vd_desc, v_ring, v_ready, v_empty, j - 1 + STAGES, row0, N_TILES, BLOCK_N, STAGES, MULTICAST,
                SYNC)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p = p_next
    last = steps - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_ring.index(last % STAGES), acc, is_async=True)
    acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
    # the ring's last refills (K tiles steps .. steps+STAGES-1, V tiles steps .. steps+STAGES-2) may still
    # be landing in this CTA's slots: wait for them before the CTA ends
    for i in gl.static_range(STAGES):
        t = steps + i
        mbarrier.wait(k_ready.index(t % STAGES), (t // STAGES) & 1)
        if i < STAGES - 1:
            mbarrier.wait(v_ready.index(t % STAGES), (t // STAGES) & 1)
    o = acc / gl.convert_layout(l_i, o_rows)[:, None]
    ro = gl.arange(0, BLOCK_M, layout=o_rows)
    co = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(OUT + (pid * BLOCK_M + ro)[:, None].to(gl.int64) * D + co[None, :], o)


# ----------------------------------------------------------------------------------------------------------
# host side


def _desc(x2: torch.Tensor, nc: int) -> TensorDescriptor:
    """A TMA descriptor over a 2-D [rows, D] view (any 16-byte-aligned row stride), boxes of [64, D], in
    the ring slots' layout: broadcast over the CTAs of a cluster when nc == 2."""
    D = x2.shape[1]
    cga = [[0, 0]] if nc == 2 else None
    layout = gl.NVMMASharedLayout.get_default_for([64, D], gl.bfloat16, cga_layout=cga)
    return TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [64, D], layout)


def _dense2d(x: torch.Tensor, T: int) -> torch.Tensor:
    """[1, H, n*T, D] contiguous -> its dense tokens (every T-th, the last of each item) as a strided
    [H * n, D] view: the same bytes item_block_sm90's 4-D strided view reads."""
    _, H, S, D = x.shape
    return x.view(H * S, D)[T - 1 :: T]


def launch(variant: str, kd2, vd2, xs, out, steps, qk_scale, H, n, grid_ctas):
    nc, mc, sync, defer = VARIANTS[variant]
    kd, vd = _desc(kd2, nc), _desc(vd2, nc)
    return _cluster_ring_kernel[(grid_ctas // nc,)](kd, vd, xs, out, steps, qk_scale, H, n, N_TILES=n // 64,
                                                    STAGES=2, MULTICAST=mc, SYNC=sync, DEFER=defer, num_warps=4,
                                                    num_ctas=nc)


def reference(k, v, xs, qk_scale, T, grid_ctas, block_m_per_prog):
    """fp32 attention of every 64-row query block against its head's dense keys (the kernel's step
    count is a multiple of the key tiles, so the cycled keys weigh each key equally)."""
    _, H, S, D = k.shape
    kd = k[0, :, T - 1 :: T].float()  # [H, n, D]
    vd = v[0, :, T - 1 :: T].float()
    q = xs.view(-1, block_m_per_prog, D).float()  # [programs, BM, D]
    h = torch.arange(q.shape[0], device=q.device) % H
    s = torch.einsum("pmd,pnd->pmn", q, kd[h]) * (qk_scale / LOG2E)
    return torch.einsum("pmn,pnd->pmd", torch.softmax(s, -1), vd[h]).reshape(-1, D)


def _time(fn, warmup: int, iters: int, reps: int = 3) -> float:
    """Median ms per call of fn replayed from a CUDA graph of `reps` calls."""
    from genrec.bench.kernels import _time_graph

    return _time_graph(fn, warmup, iters, reps=reps)


def _inputs(H, n, T, D, grid_ctas, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(1, H, n * T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, H, n * T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    xs = torch.randn(grid_ctas * 64, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return k, v, xs


def _check(name, out, ref, tol=5e-3) -> bool:
    err = (out - ref).abs().max().item()
    ok = bool(torch.isfinite(out).all().item()) and err < tol
    print(f"    check {name}: max |diff| {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def run_variant(variant: str, a) -> int:
    """Check and time one variant (in its own process)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if variant == "ring-orig":
        return run_orig(a, sms)
    T, D, qk = 5, 128, 0.125
    ok = True
    nc = VARIANTS[variant][0]
    # small case: 4 heads x 256 keys, 8 CTAs, steps = 2 passes over the keys
    H, n = 4, 256
    k, v, xs = _inputs(H, n, T, D, 8, seed=1)
    out = torch.full((8 * 64, D), float("nan"), device="cuda")
    launch(variant, _dense2d(k, T), _dense2d(v, T), xs, out, 2 * n // 64, qk, H, n, 8)
    torch.cuda.synchronize()
    ok &= _check("small vs torch", out, reference(k, v, xs, qk, T, 8, 64 * nc))
    # timed case: 64 heads x 1,024 keys, 2 CTAs per SM
    H, n = 64, 1024
    grid = 2 * sms
    k, v, xs = _inputs(H, n, T, D, grid, seed=2)
    kd2, vd2 = _dense2d(k, T), _dense2d(v, T)
    out = torch.full((grid * 64, D), float("nan"), device="cuda")
    ck_steps = 2 * n // 64
    launch(variant, kd2, vd2, xs, out, ck_steps, qk, H, n, grid)
    torch.cuda.synchronize()
    ref = reference(k, v, xs, qk, T, grid, 64 * nc)
    ok &= _check(f"{grid} CTAs, {ck_steps} steps vs torch", out, ref)
    # vs the cluster variant without multicast on the same inputs (same heads per row, same arithmetic:
    # should agree to the bit)
    if nc == 2 and variant != "cluster":
        out1 = torch.full_like(out, float("nan"))
        launch("cluster", kd2, vd2, xs, out1, ck_steps, qk, H, n, grid)
        torch.cuda.synchronize()
        ok &= _check("vs cluster (no multicast)", out, out1, tol=1e-3)
    kern = launch(variant, kd2, vd2, xs, out, a.steps, qk, H, n, grid)
    torch.cuda.synchronize()
    ms = _time(lambda: launch(variant, kd2, vd2, xs, out, a.steps, qk, H, n, grid), 2, a.iters)
    _report(variant, ms, grid, D, a.steps, VARIANTS[variant][1], ok, kern)
    return 0 if ok else 1


def _report(variant, ms, grid, D, steps, multicast, ok, kern=None):
    tf = 4 * 64 * 64 * D * steps * grid / ms / 1e9
    copies = grid // 2 if multicast else grid  # K/V tile copies read from L2 per step
    tbs = 2 * 64 * D * 2 * steps * copies / ms / 1e9
    extra = ""
    if kern is not None:
        try:
            import triton

            nc = kern.metadata.num_ctas
            if nc > 1:
                mac = triton.runtime.driver.active.utils.cuOccupancyMaxActiveClusters(kern.function,
                                                                                      kern.metadata.shared, nc)
                extra = f"  (max co-resident {nc}-CTA clusters {mac}, i.e. {mac * nc} CTAs)"
            extra = f"  smem {kern.metadata.shared / 1024:.0f} KB/CTA" + extra
        except Exception as e:  # informational only
            extra = f"  (occupancy query failed: {e!r:.80})"
    print(f"RESULT {variant:11s} {ms:8.3f} ms  {tf:6.1f} TFLOP/s  L2->SM {tbs:5.2f} TB/s  "
          f"{'ok' if ok else 'FAIL'}{extra}", flush=True)


def run_orig(a, sms) -> int:
    """probe_mma_rate's ring kernel (4-D descriptors) at its own shape: the 497 TFLOP/s baseline."""
    import probe_mma_rate as pmr

    T, n, D, H = 5, 1024, 128, 64
    kd, vd = pmr._dense_kv_descs(H, n, T, D)
    grid = 2 * sms
    xs = torch.randn(grid * 64 * D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(grid, device="cuda")

    def run():
        pmr._ring_kernel[(grid,)](kd, vd, xs, out, a.steps, 0.125, H, BLOCK_N=64, D=D, N_TILES=n // 64, STAGES=2, A_REGS=False,
                                  num_warps=4)
    ms = _time(run, 2, a.iters)
    _report("ring-orig", ms, grid, D, a.steps, False, True)
    return 0


def compile_only() -> int:
    """Compile every variant for sm_90a ahead of time (no GPU) and check the PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    T, n, H, D = 5, 1024, 64, 128
    k = torch.zeros(1, H, n * T, D, dtype=torch.bfloat16)
    bad = 0
    for variant, (nc, mc, sync, defer) in VARIANTS.items():
        d = _desc(_dense2d(k, T), nc)
        sig = {"kd_desc": mangle_type(d), "vd_desc": mangle_type(d), "X": "*bf16", "OUT": "*fp32", "steps": "i32",
               "qk_scale": "fp32", "H": "i32", "n_keys": "i32"}
        consts = {"N_TILES": n // 64, "STAGES": 2, "MULTICAST": mc, "SYNC": sync, "DEFER": defer, "num_warps": 4}
        sig.update({c: "constexpr" for c in consts})
        attrs = {(2,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]}
        kern = triton.compile(GluonASTSource(fn=_cluster_ring_kernel, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_ctas": nc})
        ptx = kern.asm["ptx"]
        tma_lines = sorted({re.sub(r"^@%p\d+\s+|\s*\[.*", "", ln.strip()) for ln in ptx.splitlines()
                            if "cp.async.bulk.tensor" in ln})
        mcast = sum("multicast::cluster" in ln for ln in ptx.splitlines() if "cp.async.bulk.tensor" in ln)
        cluster = re.findall(r"\.reqnctapercluster\s+\d+|\.explicitcluster", ptx)
        remote = sorted({re.sub(r"^@%p\d+\s+|\s+\[.*|,.*", "", ln.strip()) for ln in ptx.splitlines()
                         if re.search(r"mbarrier\.arrive|mapa|barrier\.cluster", ln)})
        try:  # registers and spills from the SASS (benchmarks/inspect_item_block.py's reader)
            import inspect_item_block as iib
            st = iib._sass_stats(kern.asm["cubin"])
            sass = f"regs {st.get('reg')}  LDL/STL {st['LDL']}/{st['STL']}  HGMMA {st['HGMMA']}  UTMALDG {st['UTMALDG']}"
        except Exception as e:  # informational only
            sass = f"(no SASS stats: {e!r:.60})"
        print(f"{variant:11s} num_ctas {kern.metadata.num_ctas}  smem {kern.metadata.shared / 1024:.1f} KB/CTA  {sass}\n"
              f"    cluster {cluster}\n    TMA loads {tma_lines} ({mcast} multicast)\n    arrive/cluster ops {remote}")
        want_mc = mc
        if want_mc != (mcast > 0) or (nc == 2) != (".reqnctapercluster 2" in cluster):
            print(f"  UNEXPECTED for {variant}")
            bad += 1
        if os.environ.get("PROBE_DUMP"):
            Path(os.environ["PROBE_DUMP"]).mkdir(parents=True, exist_ok=True)
            Path(os.environ["PROBE_DUMP"], f"{variant}.ptx").write_text(ptx)
    return 1 if bad else 0


def main() -> int:
    a = probe_args(steps=2000).parse_args()
    if a.compile_only:
        return compile_only()
    if a.variant:
        return run_variant(a.variant, a)
    peak = matmul_peak(a.iters)
    rows, hung = [], set()
    for variant in ("ring-orig", "ring", "cluster", "mcast-sync", "mcast", "mcast-defer"):
        print(f"--- {variant}", flush=True)
        if variant == "mcast-defer" and "mcast" in hung:  # the same release protocol: would hang too
            print("    skipped (mcast hung)", flush=True)
            continue
        text, timed_out = run_isolated(__file__, variant, a)
        if timed_out:
            hung.add(variant)
        print("\n".join(ln for ln in text.splitlines() if "warn" not in ln.lower()), flush=True)
        rows += [ln for ln in text.splitlines() if ln.startswith("RESULT")]
    print(f"\nsummary (head dim 128, 64-key tiles, 2-slot ring, {a.steps} steps, 2 CTAs per SM; "
          f"matmul ceiling {peak:.0f} TFLOP/s):")
    for ln in rows:
        tf = float(ln.split("TFLOP/s")[0].split()[-1])
        print(f"  {ln[7:]}  [{tf / peak:.0%} of the matmul]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
