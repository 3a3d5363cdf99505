"""Does this Triton warp-specialise a flash-attention loop for the H200 (sm_90)? Compiles, no GPU.

Usage:
    python benchmarks/probe_warp_specialize.py

FlashAttention-3 gets its Hopper speed from warp specialisation: a producer warp group issues the
tensor-memory copies while consumer warp groups run the matmuls and exponentials, their registers
rebalanced with ``setmaxnreg``. Triton exposes this as ``tl.range(..., warp_specialize=True)``. This
probe compiles the smallest flash loop that has the item-block forward's shape (128 queries, 64 keys
per step, head dim 64, online softmax, bf16 -> fp32) ahead of time for ``GPUTarget("cuda", 90, 32)``,
with the keys and values read through pointers (cp.async, what the item-block kernels do) or through
host tensor descriptors (TMA), at 4 and 8 warps, with and without ``warp_specialize``, and prints
whether it compiled, whether the PTX changed at all, the warps per program, and the counts of
``setmaxnreg``, ``wgmma`` and bulk tensor copies. A specialised kernel would show more warps than asked
for (the producer group) and ``setmaxnreg``; an unchanged PTX means the hint was dropped.
"""

from __future__ import annotations

import os
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _flash_loop(Q, K, V, kdesc, vdesc, O, sqn, skn, svn, son, qk_scale,
                BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, WS: tl.constexpr, TMA: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BM + tl.arange(0, BM)
    d = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * sqn + d[None, :])
    m = tl.full([BM], -1.0e30, tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for s0 in tl.range(0, pid * BM, BN, warp_specialize=WS):
        if TMA:
            k = kdesc.load([s0, 0])
            v = vdesc.load([s0, 0])
        else:
            n = s0 + tl.arange(0, BN)
            k = tl.load(K + n[:, None] * skn + d[None, :])
            v = tl.load(V + n[:, None] * svn + d[None, :])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m = m_new
    tl.store(O + rows[:, None] * son + d[None, :], (acc / lsum[:, None]).to(tl.bfloat16))


def _compile(ws: bool, tma: bool, warps: int) -> tuple[str, str | None]:
    bm, bn, d = 128, 64, 64
    desc = f"tensordesc<bf16[{bn}, {d}]>"
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "kdesc": desc, "vdesc": desc, "O": "*bf16",
           "sqn": "i32", "skn": "i32", "svn": "i32", "son": "i32", "qk_scale": "fp32",
           "BM": "constexpr", "BN": "constexpr", "D": "constexpr", "WS": "constexpr", "TMA": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig) if name in ("Q", "K", "V", "O", "sqn", "skn", "svn", "son")}
    src = ASTSource(fn=_flash_loop, signature=sig, constexprs={"BM": bm, "BN": bn, "D": d, "WS": ws, "TMA": tma},
                    attrs=aligned)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 3})
    except Exception as e:  # noqa: BLE001 -- the failure is the finding
        return "", f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"
    return k.asm["ptx"], None


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("probe_warp_specialize: unset TRITON_INTERPRET (this compiles for sm_90)")
        return 2
    print(f"triton {triton.__version__}, sm_90; the compiler's own assertion messages, if any, go to stderr")
    print(f"{'loads':<8} {'warps':>5} {'warp_specialize':>15} {'compiled':>9} {'PTX changed':>11} "
          f"{'warps in PTX':>14} {'setmaxnreg':>10} {'wgmma':>5} {'TMA copies':>10}")
    for tma in (False, True):
        for warps in (4, 8):
            base, _ = _compile(False, tma, warps)
            ptx, err = _compile(True, tma, warps)
            loads = "TMA" if tma else "pointer"
            if err:
                print(f"{loads:<8} {warps:>5} {'on':>15} {'no':>9}   {err}")
                continue
            ntid = next((ln.split()[1].rstrip(",") for ln in ptx.splitlines() if ln.strip().startswith((".reqntid", ".maxntid"))), "?")
            n_warps = int(ntid) // 32 if ntid.isdigit() else ntid
            print(f"{loads:<8} {warps:>5} {'on':>15} {'yes':>9} {('yes' if ptx != base else 'no'):>11} {n_warps:>14} "
                  f"{ptx.count('setmaxnreg'):>10} {ptx.count('wgmma.mma_async'):>5} {ptx.count('cp.async.bulk.tensor'):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
