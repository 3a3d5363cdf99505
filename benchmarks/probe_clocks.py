"""Probe (GPU only): the SM clock and power each training-attention kernel runs at, sustained.

Usage:
    python benchmarks/probe_clocks.py [--seconds 4]

For each workload, replays its CUDA graph back to back for ``--seconds`` while ``nvidia-smi -lms 100``
samples the SM clock, the power draw and the active clock-event (throttle) reasons; prints per workload
the GPU time per call and the median clock and power over the samples taken while it ran. Workloads:
the item-block fwd+bwd (tuned, 8 x 128 and 12 x 64, B 8 x 1,024 items x 5 tokens), causal SDPA fwd+bwd
over the TIGER layout's 5,120 tokens at 8 x 128, and an 8,192^3 bf16 matmul. Clocks are left alone (as
every timing in BENCHMARKS.md); this says at which clock each figure was taken.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.gpu_monitor import FIELDS, describe  # noqa: E402
from genrec.bench.kernels import _capture, sustained_ms  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig, item_block_attention  # noqa: E402


def sustained(name: str, fn, seconds: float, reps: int) -> None:
    g = _capture(fn, reps)
    ms, smp = sustained_ms(g.replay, seconds, reps)
    print(f"{name:34s} {ms:8.4f} ms/call  {describe(smp)}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    B, n, T = 8, 1024, 5
    S = n * T
    print(subprocess.run(["nvidia-smi", f"--query-gpu=name,{','.join(FIELDS)},clocks.max.sm", "--format=csv"],
                         capture_output=True, text=True).stdout, flush=True)
    for H, D in ((8, 128), (12, 64)):
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        lengths = torch.full((B,), n, device="cuda", dtype=torch.int32)
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        cfg = ItemBlockConfig.tuned(D)

        def item_block():
            return torch.autograd.grad(item_block_attention(*xs, lengths, T, config=cfg), xs, do)

        def causal():
            return torch.autograd.grad(F.scaled_dot_product_attention(*xs, is_causal=True), xs, do)
        sustained(f"item-block fwd+bwd {H} x {D}", item_block, a.seconds, 5)
        if D == 128:
            sustained(f"causal SDPA fwd+bwd {H} x {D}", causal, a.seconds, 5)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    sustained("bf16 matmul 8192^3", lambda: x @ x, a.seconds, 5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
