"""Probe (GPU): can a vendor flash kernel carry the dense part of PinGER's training attention?

PinGER's mask splits exactly: every token of item i sees the dense tokens of items < i (the
"dense part": strictly causal over items, the same for all T slots of an item), plus a few keys
inside its own item (the "local part"). Packing each item's T query tokens as T query heads per
KV head (GQA) at position i-1 turns the dense part into ONE plain causal attention of n-1
positions, which FlashAttention / cuDNN run natively. This script times that piece alone, at the
issue-5 shape (bf16, B 8, 1,024 items x T 5, 12x64 and 8x128), beside the item-block Triton
kernel (whole attention, same call), and checks the backward trick the composition needs:
attention over disjoint key sets, merged by log-sum-exp, differentiated by running each part's
vendor backward with the MERGED output and logsumexp.

    python benchmarks/probe_dense_flash.py [--iters 20] [--warmup 5]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def timed(fn, iters: int, warmup: int) -> float:
    from genrec.bench.kernels import median_ms

    return median_ms(fn, warmup, iters, "cuda")


def flash_fwd(q, k, v, causal, scale):
    r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return r


def flash_bwd(do, q, k, v, o, lse, r, causal, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, o, lse, r[2], r[3], r[4], r[5], 0.0, causal, r[6], r[7], scale=scale)


def cudnn_fwd(q, k, v, causal, scale):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)


def cudnn_bwd(do, q, k, v, o, lse, r, causal, scale):
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse, r[6], r[7], torch.empty(0, device=q.device), r[2], r[3], r[4], r[5], 0.0, causal,
        scale=scale)


BACKENDS = {"flash": (flash_fwd, flash_bwd), "cudnn": (cudnn_fwd, cudnn_bwd)}


def check_trick(name: str) -> str:
    """Two disjoint key halves through the vendor op, merged by LSE, backward with merged O/LSE."""
    fwd, bwd = BACKENDS[name]
    torch.manual_seed(0)
    B, H, S, D = 2, 4, 256, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    scale = 1 / math.sqrt(D)
    qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, scale=scale)
    ref.backward(do.float())
    h = S // 2
    parts = [fwd(q, k[:, :, :h].contiguous(), v[:, :, :h].contiguous(), False, scale),
             fwd(q, k[:, :, h:].contiguous(), v[:, :, h:].contiguous(), False, scale)]
    lses = [p[1].float().reshape(B, H, S) for p in parts]
    lse = torch.logaddexp(lses[0], lses[1])
    o = sum(torch.exp(l - lse)[..., None] * p[0].float() for l, p in zip(lses, parts)).to(q.dtype)
    grads = []
    for i, (sl, p) in enumerate(zip((slice(0, h), slice(h, S)), parts)):
        kk, vv = k[:, :, sl].contiguous(), v[:, :, sl].contiguous()
        grads.append(bwd(do, q, kk, vv, o, lse.reshape(p[1].shape).contiguous(), p, False, scale))
    dq = grads[0][0].float() + grads[1][0].float()
    dk = torch.cat([grads[0][1], grads[1][1]], 2).float()
    dv = torch.cat([grads[0][2], grads[1][2]], 2).float()

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max())

    return (f"{name}: out {rel(o.float(), ref):.1e} dq {rel(dq, qr.grad):.1e} dk {rel(dk, kr.grad):.1e} "
            f"dv {rel(dv, vr.grad):.1e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("probe_dense_flash: no CUDA device; nothing to measure")
        return
    print(torch.__version__, torch.cuda.get_device_name())
    for name in BACKENDS:
        try:
            print("trick", check_trick(name))
        except Exception as e:  # noqa: BLE001 - a probe reports every failure and goes on
            print("trick", name, "FAILED", type(e).__name__, str(e)[:300])
    from genrec.kernels.item_block import ItemBlockConfig, item_block_attention

    B, n, T = 8, 1024, 5
    rows = []
    for H, D in ((12, 64), (8, 128)):
        scale = 1 / math.sqrt(D)
        m = n - 1
        pairs = B * H * T * m * (m + 1) / 2
        flop = 4 * pairs * D * 3.5
        qg = torch.randn(B, m, H * T, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        kd = torch.randn(B, m, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        vd = torch.randn_like(kd)
        ke, ve = (x.repeat_interleave(T, dim=1) for x in (kd, vd))
        ke = ke.transpose(1, 2).contiguous().transpose(1, 2)
        ve = ve.transpose(1, 2).contiguous().transpose(1, 2)
        do = torch.randn_like(qg)
        for name, (fwd, bwd) in BACKENDS.items():
            for kv_name, kk, vv in (("gqa", kd, vd), ("expanded", ke, ve)):
                label = f"{H}x{D} {name} {kv_name}"
                try:
                    r = fwd(qg, kk, vv, True, scale)
                    tf = timed(lambda: fwd(qg, kk, vv, True, scale), a.iters, a.warmup)

                    def both():
                        rr = fwd(qg, kk, vv, True, scale)
                        bwd(do, qg, kk, vv, rr[0], rr[1], rr, True, scale)
                    tb = timed(both, a.iters, a.warmup)
                    rows.append((label, tf, tb, flop / tb / 1e9))
                    print(f"{label}: fwd {tf:.3f} ms  fwd+bwd {tb:.3f} ms  {flop / tb / 1e9:.0f} TFLOP/s", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{label}: FAILED {type(e).__name__} {str(e)[:200]}", flush=True)
        # public SDPA (default backend choice), expanded KV, autograd
        qx = qg.detach().requires_grad_()
        kx, vx = ke.detach().requires_grad_(), ve.detach().requires_grad_()

        def sdpa_both():
            F.scaled_dot_product_attention(qx, kx, vx, is_causal=True, scale=scale).backward(do)
        tb = timed(sdpa_both, a.iters, a.warmup)
        rows.append((f"{H}x{D} sdpa expanded", float("nan"), tb, flop / tb / 1e9))
        print(f"{H}x{D} sdpa expanded fwd+bwd {tb:.3f} ms", flush=True)
        # packing copies the composition would pay (one q-sized tensor)
        q = torch.randn(B, H, n * T, D, device="cuda", dtype=torch.bfloat16)
        tc = timed(lambda: q.view(B, H, n, T, D)[:, :, 1:].permute(0, 2, 1, 3, 4).contiguous(), a.iters, a.warmup)
        print(f"{H}x{D} pack one q-sized tensor {tc:.3f} ms", flush=True)
        # the item-block Triton kernel, whole attention, same call
        qq, kq, vq = (torch.randn(B, n * T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                      for _ in range(3))
        lengths = torch.full((B,), n, device="cuda", dtype=torch.int32)
        cfg = ItemBlockConfig.tuned(D)
        dd = torch.randn_like(qq)

        def ib_both():
            item_block_attention(qq, kq, vq, lengths, T, config=cfg).backward(dd)
        tb = timed(ib_both, a.iters, a.warmup)
        print(f"{H}x{D} item-block Triton (whole attention) fwd+bwd eager {tb:.3f} ms", flush=True)
    print("\nshape / backend / kv | fwd ms | fwd+bwd ms | dense-part TFLOP/s")
    for r in rows:
        print(f"{r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.0f}")


if __name__ == "__main__":
    main()
