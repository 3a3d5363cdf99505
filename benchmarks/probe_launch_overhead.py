"""Host time per launch of the item-block kernels: Triton vs Gluon (sm90), on shapes so small that the
GPU waits on the host. GPU only (Hopper for the Gluon rows).

Usage:
    python benchmarks/probe_launch_overhead.py [--calls 300]

For each way of launching, ``--calls`` launches are enqueued back to back and the wall time per call
is reported (microseconds; the GPU time of one call at this shape is a few microseconds, so the figure
is the host's). Rows: the Triton forward; the Gluon forward through ``item_block_attention_fwd`` and
through ``launch_fwd_sm90``; building its five tensor descriptors alone; and the Gluon kernel launched
through its compiled-kernel handle (no JIT binder), the same arguments.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.kernels import item_block_sm90 as sm  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig, item_block_attention_fwd  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("probe_launch_overhead: needs a GPU")
        return 0
    T, D, n = 5, 128, 16
    q, k, v = (torch.randn(1, 1, n * T, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    lengths = torch.full((1,), n, device="cuda", dtype=torch.int32)
    tri = ItemBlockConfig.tuned(D).replace(sm90_fwd=None)
    gl_cfg = ItemBlockConfig.tuned(D).replace(sm90_fwd=(64, 64, 4, 2))
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    rows = [("triton forward (item_block_attention_fwd)", lambda: item_block_attention_fwd(q, k, v, lengths, T, config=tri))]
    if sm.sm90_available(q):
        rows += [
            ("gluon forward (item_block_attention_fwd)", lambda: item_block_attention_fwd(q, k, v, lengths, T, config=gl_cfg)),
            ("gluon forward (launch_fwd_sm90)", lambda: sm.launch_fwd_sm90(q, k, v, lengths, out, lse, T, 1 / math.sqrt(D))),
        ]
        rows2 = q.numel() // D
        q2, k2, v2 = (x.view(rows2, D) for x in (q, k, v))
        descs = lambda: [sm._desc(q2, 64, D), sm._desc(k2, 64, D), sm._desc(v2, 64, D),  # noqa: E731
                         sm._desc(k2[T - 1 :: T], 64, D), sm._desc(v2[T - 1 :: T], 64, D)]
        rows.append(("five tensor descriptors alone", descs))
        args = [*descs(), out, lse, lengths, 1, n * T, n, 1 / math.sqrt(D) * 1.4426950408889634]
        consts = dict(T=T, BLOCK_ITEMS=64 // T, BLOCK_M=64, BLOCK_N=64, D=D, STAGES=2, num_warps=4)
        grid = (math.ceil(n / (64 // T)), 1, 1)
        try:
            ck = sm._sm90_fwd_kernel.warmup(*args, grid=grid, **consts)
            consts_vals = list(consts.values())  # every parameter in order, constexprs (num_warps too) included

            def direct():
                ck[grid](*descs(), out, lse, lengths, 1, n * T, n, args[-1], *consts_vals)

            direct()
            rows.append(("gluon compiled handle, descriptors built each call", direct))
            fixed = descs()
            rows.append(("gluon compiled handle, descriptors reused",
                         lambda: ck[grid](*fixed, out, lse, lengths, 1, n * T, n, args[-1], *consts_vals)))
        except Exception as e:  # noqa: BLE001
            print(f"compiled handle: {e!r}"[:400])
    print(f"{'launch':55s} {'us per call':>12s}")
    for name, fn in rows:
        try:
            print(f"{name:55s} {per_call_us(fn, a.calls):12.1f}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:55s} ERROR {e!r}"[:300], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
