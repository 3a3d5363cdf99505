"""Runs each Gluon item-block kernel of ``ItemBlockConfig.tuned`` (and the variants named on the
command line) a few times at the benchmark shape, for Nsight Compute to read (GPU only):

    ncu --clock-control none -k regex:sm90 --section SpeedOfLight ... python benchmarks/ncu_sm90.py \\
        [--head-dim 128] [--set sm90_fwd=64,64,4,2,1 ...]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.kernels import item_block as ib  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig  # noqa: E402

T = 5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=a,b,c,d[,e]")
    ap.add_argument("--lpt", action="store_true", help="the heads-first grid (ItemBlockConfig.lpt)")
    a = ap.parse_args()
    D = a.head_dim
    H = 8 if D == 128 else 12
    B, n = 8, 1024
    cfg = ItemBlockConfig.tuned(D).replace(**{kv.split("=")[0]: tuple(int(x) for x in kv.split("=")[1].split(","))
                                              for kv in a.set}, lpt=a.lpt)
    q, k, v, do = (torch.randn(B, H, n * T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    lengths = torch.full((B,), n, device="cuda", dtype=torch.int32)
    for _ in range(2):
        out, lse = ib.item_block_attention_fwd(q, k, v, lengths, T, config=cfg)
        bw = ib._Backward(q, k, v, out, lse, do, lengths, T, 1 / math.sqrt(D), cfg)
        bw.run_dq()
        bw.run_dense_kv()
    torch.cuda.synchronize()
    print("ran", cfg.sm90_fwd, cfg.sm90_dq, cfg.sm90_dense_kv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
