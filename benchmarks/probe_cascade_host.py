"""Where the cascade kernel's eager per-call time goes at W = 10 (8 requests x 1,000-key history,
12 x 64 heads, 3 SID tokens per beam, bf16), against per-beam SDPA over expanded KV.

Three clocks per call: "sync" = CUDA events around one call after a synchronize (what `genrec bench
kernels` reports per call: launch latency + GPU time); "b2b" = events around 200 calls issued back to
back, divided by 200 (an eager loop's cost per call when the host runs ahead); "host" = wall time to
issue one call (no sync). Rows: the per-beam baseline, the cascade with and without its range check,
the bare Triton launch with prepared arguments, and the wrapper's own small CUDA calls.
Run on the GPU machine: python3 benchmarks/probe_cascade_host.py."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from genrec.kernels import cascade as C
from genrec.validation import trusted_inputs


def clocks(fn, reps: int = 200, rounds: int = 7) -> tuple[float, float, float]:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    sync, b2b, host = [], [], []
    for _ in range(rounds):
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); torch.cuda.synchronize()
            sync.append(s.elapsed_time(e))
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter(); s.record()
        for _ in range(reps):
            fn()
        e.record(); t1 = time.perf_counter(); torch.cuda.synchronize()
        b2b.append(s.elapsed_time(e) / reps); host.append((t1 - t0) * 1e3 / reps)
    return statistics.median(sync), statistics.median(b2b), statistics.median(host)


SHAPE = dict(B=8, W=10, H=12, t=3, D=64, n=1000)  # the cascade shape at W = 10


def cascade_inputs(dev: str = "cuda") -> tuple[torch.Tensor, ...]:
    """q, k_suf, v_suf [B, W, H, t, D], k_hist, v_hist [B, H, n, D] (bf16, random), hist_len [B] (int64, full)."""
    B, W, H, t, D, n = SHAPE.values()
    q, ks, vs = (torch.randn(B, W, H, t, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    kh, vh = (torch.randn(B, H, n, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    return q, ks, vs, kh, vh, torch.full((B,), n, device=dev)


def main() -> None:
    B, W, H, t, D, n = SHAPE.values()
    dev = "cuda"
    q, ks, vs, kh, vh, hl = cascade_inputs(dev)
    mask = torch.cat([torch.ones(t, n, dtype=torch.bool, device=dev),
                      torch.ones(t, t, dtype=torch.bool, device=dev).tril()], 1)

    def per_beam():
        kk = torch.cat([kh[:, None].expand(B, W, H, n, D), ks], 3).reshape(B * W, H, n + t, D)
        vv = torch.cat([vh[:, None].expand(B, W, H, n, D), vs], 3).reshape(B * W, H, n + t, D)
        return F.scaled_dot_product_attention(q.reshape(B * W, H, t, D), kk, vv, attn_mask=mask)

    def checked():
        return C.cascade_attention_triton(q, kh, vh, ks, vs, hl, num_splits=1)

    def trusted():
        with trusted_inputs():
            return C.cascade_attention_triton(q, kh, vh, ks, vs, hl, num_splits=1)

    ref = per_beam().reshape(B, W, H, t, D)
    err = float((trusted().float() - ref.float()).norm() / ref.float().norm())
    out = torch.empty_like(q)
    BLOCK_M, BEAMS, BLOCK_N = C._blocks(W, t, 64, 64)
    grid = (triton_cdiv(W, BEAMS), B * H, 1)
    args = (q, kh, vh, ks, vs, out, hl, out, out,
            *q.stride()[:4], *kh.stride()[:3], *vh.stride()[:3], *ks.stride()[:4], *vs.stride()[:4], *out.stride()[:4],
            H, W, 1, D ** -0.5 * C._LOG2E)
    meta = dict(TS=t, BEAMS=BEAMS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=D, IEEE=False, UPCAST=False, SPLIT=False, num_warps=4)

    def raw():
        C._cascade_fwd_kernel[grid](*args, **meta)

    rows = [("per-beam SDPA (baseline)", per_beam), ("cascade, range-checked", checked), ("cascade, trusted", trusted),
            ("bare Triton launch", raw), ("torch.empty_like(q)", lambda: torch.empty_like(q)),
            ("hl.to(int32)", lambda: hl.to(torch.int32))]
    print(f"rel err cascade vs per-beam: {err:.1e}")
    print(f"{'call':28s} {'sync ms':>9s} {'b2b ms':>9s} {'host ms':>9s} {'x per-beam (sync / b2b)':>24s}")
    base = None
    for name, fn in rows:
        s, b, h = clocks(fn)
        base = base or (s, b)
        print(f"{name:28s} {s:9.4f} {b:9.4f} {h:9.4f} {base[0] / s:11.2f} / {base[1] / b:6.2f}")


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    main()
