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
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.kernels import _capture  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig, item_block_attention  # noqa: E402

FIELDS = "clocks.sm,power.draw,power.limit,clocks_event_reasons.active"


def sustained(name: str, fn, seconds: float, reps: int) -> None:
    g = _capture(fn, reps)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    calls = 0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            g.replay()
        calls += 10 * reps
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    rows = [r.split(", ") for r in out.strip().splitlines() if r.count(",") == 3]
    rows = rows[2:] or rows  # the first samples may predate the load
    try:
        [(float(r[0]), float(r[1])) for r in rows]
    except ValueError:
        rows = []
    if not rows:
        print(f"{name}: no usable nvidia-smi samples: {out[:300]!r}", flush=True)
        return
    clock = statistics.median(float(r[0]) for r in rows)
    power = statistics.median(float(r[1]) for r in rows)
    limit = rows[0][2] if rows else "?"
    reasons = sorted({r[3] for r in rows})
    print(f"{name:34s} {start.elapsed_time(end) / calls:8.4f} ms/call  SM clock {clock:6.0f} MHz  power {power:5.0f} W "
          f"(limit {limit})  clock-event reasons {reasons}  [{len(rows)} samples]", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    B, n, T = 8, 1024, 5
    S = n * T
    print(subprocess.run(["nvidia-smi", f"--query-gpu=name,{FIELDS},clocks.max.sm", "--format=csv"],
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
