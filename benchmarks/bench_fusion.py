"""SID fusion on the training layout's shape: the model's path (``forward_codes``: the SID tokens' keys
and values projected once per codebook row, then gathered; on CUDA its attention is the Triton kernel of
``genrec.kernels.sid_fusion``), the same path with the attention in PyTorch, the one-row fast path over
embedded codes (``forward``), an einsum (batched-matmul) variant of it, and the whole causal layer
(``forward_reference``). Then the attention alone, kernel against its PyTorch twin.

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
from typing import Callable

import torch
import torch.nn.functional as F

from genrec.model.config import ModelConfig
from genrec.model.encoders import SidEmbedding
from genrec.kernels.sid_fusion import fusion_attention, fusion_attention_torch
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


def _time(call: Callable[[], None], iters: int, dev: str) -> tuple[float, float]:
    """Median wall ms per call (device synchronised) and, on CUDA, GPU ms per call: the sum of its
    kernels' durations from torch.profiler (an eager call is host-bound at these sizes)."""
    ts = []
    for i in range(iters + 3):
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
            for _ in range(iters):
                call()
            torch.cuda.synchronize()
        gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / iters
    return 1000 * statistics.median(ts), gpu


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

        def codes_torch(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            f._use_kernel = lambda x: False  # type: ignore[method-assign]
            try:
                return f.forward_codes(c, emb, x)
            finally:
                del f._use_kernel

        fns = {"codes (model)": lambda c, x: f.forward_codes(c, emb, x),
               "codes, torch attention": codes_torch,
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

            rows.append((d, name, *_time(call, a.iters, dev), errs[name]))
    for d, h in ((256, 4), (768, 12)):  # the attention alone: N items, 4 levels of 256 codes
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(a.items, d, device=dev, generator=g, dtype=torch.bfloat16, requires_grad=True)
        kv_rows = torch.randn(1024, 2 * d, device=dev, generator=g, dtype=torch.bfloat16, requires_grad=True)
        kv_dense = torch.randn(a.items, 2 * d, device=dev, generator=g, dtype=torch.bfloat16, requires_grad=True)
        rws = torch.randint(0, 1024, (a.items, 4), device=dev, generator=g)
        with torch.no_grad():
            ref = fusion_attention_torch(q, kv_rows, rws, kv_dense, h).float()
        for name, att in (("attention: kernel", fusion_attention), ("attention: torch twin", fusion_attention_torch)):
            if dev != "cuda" and att is fusion_attention:
                continue  # the kernel runs on CUDA (or in Triton's interpreter, not timed here)
            with torch.no_grad():
                err = float((att(q, kv_rows, rws, kv_dense, h).float() - ref).abs().max() / ref.abs().max())

            def call_att(att=att) -> None:
                att(q, kv_rows, rws, kv_dense, h).float().sum().backward()

            rows.append((d, name, *_time(call_att, a.iters, dev), err))
    print(f"{'d':>4s} {'path':26s} {'fwd+bwd ms':>10s} {'GPU ms':>8s} {'rel err':>8s}")
    for d, name, ms, gpu, err in rows:
        print(f"{d:4d} {name:26s} {ms:10.3f} {gpu:8.3f} {err:8.1e}")


if __name__ == "__main__":
    main()
