"""SID fusion on the training layout's shape: the one-row fast path (what the model runs) against the
whole causal layer (``forward_reference``) and an einsum (batched-matmul) variant of the fast path.

    python benchmarks/bench_fusion.py [--items 8192] [--iters 20]

Forward + backward, bf16 autocast on CUDA (float32 on the CPU), median wall time per call with the
device synchronised, at d 256 (4 heads) and d 768 (12 heads). Checks each against the reference first.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

from genrec.model.config import ModelConfig
from genrec.model.fusion import SidFusion


def einsum_fast(f: SidFusion, sid_emb: torch.Tensor, dense_in: torch.Tensor) -> torch.Tensor:
    seq = f._seq(sid_emb, dense_in)
    blk, att = f.block, f.block.attn
    n, t, d = seq.shape
    h = blk.n1(seq)
    w, bias = att.qkv.weight, att.qkv.bias
    q = F.linear(h[:, -1], w[:d], bias[:d]).view(n, att.h, att.dh)
    k, v = F.linear(h, w[d:], bias[d:]).view(n, t, 2, att.h, att.dh).unbind(2)
    p = (torch.einsum("nhd,nthd->nht", q, k).float() / math.sqrt(att.dh)).softmax(-1)
    o = torch.einsum("nht,nthd->nhd", p.to(v.dtype), v)
    x = seq[:, -1] + att.out(o.reshape(n, d))
    return x + blk.mlp(blk.n2(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for d, h in ((256, 4), (768, 12)):
        torch.manual_seed(0)
        f = SidFusion(ModelConfig.from_name("tiny", d_model=d, n_heads=h, d_ff=4 * d, dropout=0.0)).to(dev)
        sid = torch.randn(a.items, f.levels, d, device=dev, requires_grad=True)
        dense = torch.randn(a.items, d, device=dev, requires_grad=True)
        fns = {"fast (model)": f.forward, "einsum fast": lambda s, x: einsum_fast(f, s, x),
               "whole layer (reference)": f.forward_reference}
        with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            ref = f.forward_reference(sid, dense).float()
            errs = {k: float((fn(sid, dense).float() - ref).abs().max() / ref.abs().max()) for k, fn in fns.items()}
        for name, fn in fns.items():
            ts = []
            for i in range(a.iters + 3):
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                    out = fn(sid, dense)
                out.float().sum().backward()
                if dev == "cuda":
                    torch.cuda.synchronize()
                if i >= 3:
                    ts.append(time.perf_counter() - t0)
            rows.append((d, name, 1000 * statistics.median(ts), errs[name]))
    print(f"{'d':>4s} {'path':24s} {'fwd+bwd ms':>10s} {'rel err':>8s}")
    for d, name, ms, err in rows:
        print(f"{d:4d} {name:24s} {ms:10.3f} {err:8.1e}")


if __name__ == "__main__":
    main()
