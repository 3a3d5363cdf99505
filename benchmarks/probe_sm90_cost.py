"""Where the item-block kernels' time goes: a fixed cost per program against a cost per tile. GPU only.

Usage:
    python benchmarks/probe_sm90_cost.py [--head-dim 128] [--set KNOB=a,b,c,d ...] [--iters 20]

Each kernel (forward, dq, dense dk/dv; the tuned Gluon one and the tuned Triton one) is timed from a
CUDA graph at the same number of tokens, B x n = 8,192 items, as B 32 x 256, 16 x 512, 8 x 1,024 and
4 x 2,048 items. Programs grow with B x n (constant here) and tiles with n: a least-squares fit of
time = a x programs + b x tiles gives the fixed cost per program (prologue, first tile, epilogue,
its share of the launch) and the cost of one inner-loop tile, both in microseconds of one of the
GPU's concurrent program slots (programs resident per SM x SMs). A kernel whose fixed cost is a
large share of its time gains from longer programs (two blocks per program, a persistent grid);
one whose tiles dominate gains only from a faster inner loop.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch

# GENREC_SRC: another checkout's src (an A/B of two versions of the kernels in one device call)
sys.path.insert(0, os.environ.get("GENREC_SRC") or str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.kernels import _time_graph  # noqa: E402
from genrec.kernels import item_block as ib  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig  # noqa: E402

T = 5
SHAPES = [(32, 256), (16, 512), (8, 1024), (4, 2048)]


def counts(kernel: str, n: int, tiles: tuple[int, int]) -> tuple[int, int]:
    """(programs, inner-loop tiles) per head for a kernel with the given (tile, tile) at n items."""
    a, b = tiles
    if kernel == "dense dk/dv":  # key blocks of a items, each looping over query tiles of b tokens
        blocks = math.ceil(n / a)
        return blocks, sum(math.ceil((n - j * a) * T / b) for j in range(blocks))
    items = a // T  # query blocks of whole items, each looping over the dense keys before it
    blocks = math.ceil(n / items)
    return blocks, sum(math.ceil(m * items / b) for m in range(blocks))


def fit(rows):
    """Least squares t = a x programs + b x tiles (no intercept)."""
    A = torch.tensor([[p, t] for p, t, _ in rows], dtype=torch.float64)
    y = torch.tensor([ms for _, _, ms in rows], dtype=torch.float64)
    sol = torch.linalg.lstsq(A, y[:, None]).solution[:, 0]
    return float(sol[0]), float(sol[1]), float((A @ sol - y).abs().max())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=a,b,c,d[,e]")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--gluon-only", action="store_true", help="skip the Triton kernels")
    a = ap.parse_args()
    D = a.head_dim
    H = 8 if D == 128 else 12
    tuned = ItemBlockConfig.tuned(D).replace(**{kv.split("=")[0]: tuple(int(x) for x in kv.split("=")[1].split(","))
                                                for kv in a.set})
    triton_cfg = tuned.replace(sm90_fwd=None, sm90_dq=None, sm90_dense_kv=None)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table = []
    impls = [("gluon", tuned)] + ([] if a.gluon_only else [("triton", triton_cfg)])
    for impl, cfg in impls:
        tiles = {
            "fwd": (cfg.sm90_fwd or (cfg.block_m, cfg.block_n))[:2],
            "dq": cfg.sm90_dq[:2] if cfg.sm90_dq else (cfg.dq_block_m, cfg.dq_block_n),
            "dense dk/dv": (cfg.sm90_dense_kv or (cfg.kv_block_i, cfg.kv_block_q))[:2],
        }
        per = {k: [] for k in tiles}
        for B, n in SHAPES:
            S = n * T
            q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            lengths = torch.full((B,), n, device="cuda", dtype=torch.int32)
            out, lse = ib.item_block_attention_fwd(q, k, v, lengths, T, config=cfg)
            bw = ib._Backward(q, k, v, out, lse, do, lengths, T, 1 / math.sqrt(D), cfg)
            bw.run_dq()
            fns = {"fwd": lambda: ib.item_block_attention_fwd(q, k, v, lengths, T, config=cfg),
                   "dq": bw.run_dq, "dense dk/dv": bw.run_dense_kv}
            for kernel, fn in fns.items():
                ms = _time_graph(fn, a.warmup, a.iters)
                p, t = counts(kernel, n, tiles[kernel])
                per[kernel].append((p * B * H, t * B * H, ms))
                print(f"{impl:6s} {kernel:12s} B {B:2d} n {n:4d}: {ms:.4f} ms  programs {p * B * H:6d} "
                      f"tiles {t * B * H:7d}", flush=True)
            del q, k, v, do, out, lse, bw
            torch.cuda.empty_cache()
        for kernel, rows in per.items():
            ca, cb, err = fit(rows)
            p8, _, ms8 = rows[SHAPES.index((8, 1024))]
            table.append((impl, kernel, tiles[kernel], ca, cb, err, ca * p8 / ms8, ms8))
    print(f"\nfit time = a x programs + b x tiles over B x n = 8,192 items ({H} x {D}, {sms} SMs); "
          "a, b in ns of the whole GPU; 'fixed share' = a x programs / time at 8 x 1,024")
    print(f"{'impl':6s} {'kernel':12s} {'tiles':>10s} {'a (ns/prog)':>11s} {'b (ns/tile)':>11s} {'max resid ms':>12s} "
          f"{'fixed share':>11s} {'ms at 8 x 1,024':>15s}")
    for impl, kernel, tl, ca, cb, err, share, ms8 in table:
        print(f"{impl:6s} {kernel:12s} {str(tl):>10s} {ca * 1e6:11.2f} {cb * 1e6:11.2f} {err:12.4f} {share:11.1%} "
              f"{ms8:15.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
