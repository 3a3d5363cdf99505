"""SID fusion on the training layout's shape: the model's path (``forward_codes``: the SID tokens' keys
and values projected once per codebook row, then gathered) against the one-row fast path over embedded
codes (``forward``), an einsum (batched-matmul) variant of it, and the whole causal layer
(``forward_reference``).

    python benchmarks/bench_fusion.py [--items 8192] [--iters 20]

Forward + backward, bf16 autocast on CUDA (float32 on the CPU), median wall time per call with the
device synchronised, at d 256 (4 heads) and d 768 (12 heads). Checks each against the reference first.
On CUDA also the GPU time per call (the sum of its kernels' durations, from torch.profiler): an eager call
is host-bound at these sizes, so wall time mostly counts launches.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

from genrec.model.config import ModelConfig
from genrec.model.encoders import SidEmbedding
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
        cfg = ModelConfig.from_name("tiny", d_model=d, n_heads=h, d_ff=4 * d, dropout=0.0, sid_levels=4,
                                    sid_codebook_sizes=[256] * 4)
        f, emb = SidFusion(cfg).to(dev), SidEmbedding(cfg).to(dev)
        codes = torch.randint(0, 256, (a.items, f.levels), device=dev)
        dense = torch.randn(a.items, d, device=dev, requires_grad=True)
        fns = {"codes (model)": lambda c, x: f.forward_codes(c, emb, x),
               "fast, embedded codes": lambda c, x: f(emb(c), x),
               "einsum fast": lambda c, x: einsum_fast(f, emb(c), x),
               "whole layer (reference)": lambda c, x: f.forward_reference(emb(c), x)}
        with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            ref = f.forward_reference(emb(codes), dense).float()
            errs = {k: float((fn(codes, dense).float() - ref).abs().max() / ref.abs().max()) for k, fn in fns.items()}
        for name, fn in fns.items():
            def call() -> None:
                with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                    out = fn(codes, dense)
                out.float().sum().backward()

            ts = []
            for i in range(a.iters + 3):
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                call()
                if dev == "cuda":
                    torch.cuda.synchronize()
                if i >= 3:
                    ts.append(time.perf_counter() - t0)
            gpu = float("nan")
            if dev == "cuda":
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(a.iters):
                        call()
                    torch.cuda.synchronize()
                gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / a.iters
            rows.append((d, name, 1000 * statistics.median(ts), gpu, errs[name]))
    print(f"{'d':>4s} {'path':24s} {'fwd+bwd ms':>10s} {'GPU ms':>8s} {'rel err':>8s}")
    for d, name, ms, gpu, err in rows:
        print(f"{d:4d} {name:24s} {ms:10.3f} {gpu:8.3f} {err:8.1e}")


if __name__ == "__main__":
    main()
