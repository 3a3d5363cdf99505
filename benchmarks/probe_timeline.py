"""Where the GPU time of one item-block fwd+bwd goes between its kernels (GPU only).

Usage:
    python benchmarks/probe_timeline.py [--head-dim 128] [--set KNOB=a,b,c,d[,e] ...] [--reps 5]

Captures ``reps`` fwd+bwd calls (``ItemBlockConfig.tuned``, or with ``--set`` changes) at the benchmark
shape (B 8 x 1,024 items x 5 tokens, bf16) in one CUDA graph, replays it under the torch profiler and
reads each kernel's start and end from the trace: per kernel its mean duration, and the mean idle gap
between a kernel's end and the next kernel's start. The same kernels timed alone (each replayed from a
graph of its own, as ``probe_sm90.py`` does) are printed beside them, so that the gap between "sum of
the kernels" and "fwd+bwd" is split into launch gaps and the kernels' own change of speed.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.kernels import _capture, _time_graph  # noqa: E402
from genrec.kernels import item_block as ib  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig, item_block_attention  # noqa: E402

T = 5


def _short(name: str) -> str:
    for key in ("fwd", "dense_kv", "dq", "sid_kv"):
        if key in name:
            return ("sm90 " if "sm90" in name else "triton ") + key
    return name[:40]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=a,b,c,d[,e]")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    D = a.head_dim
    H = 8 if D == 128 else 12
    B, n = 8, 1024
    cfg = ItemBlockConfig.tuned(D).replace(**{kv.split("=")[0]: tuple(int(x) for x in kv.split("=")[1].split(","))
                                              for kv in a.set})
    q, k, v, do = (torch.randn(B, H, n * T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    lengths = torch.full((B,), n, device="cuda", dtype=torch.int32)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]

    def step():
        return torch.autograd.grad(item_block_attention(*xs, lengths, T, config=cfg), xs, do)

    step()
    graph = _capture(step, a.reps)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    ev = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"),
                key=lambda e: e["ts"])
    durs: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    prev_end = None
    for e in ev:
        name = _short(e["name"])
        durs.setdefault(name, []).append(e["dur"])
        if prev_end is not None:
            gaps.setdefault(name, []).append(e["ts"] - prev_end)
        prev_end = e["ts"] + e["dur"]
    span = (ev[-1]["ts"] + ev[-1]["dur"] - ev[0]["ts"]) / (10 * a.reps)
    t_graph = _time_graph(step, 5, 20, reps=a.reps)
    print(f"{torch.cuda.get_device_name()}, D {D}, H {H}, config {cfg}")
    print(f"fwd+bwd from the graph: {t_graph * 1e3:.1f} us per call; profiled span {span:.1f} us per call; "
          f"{len(ev)} kernels in {10 * a.reps} calls")
    out, lse = ib.item_block_attention_fwd(q, k, v, lengths, T, config=cfg)

    def alone(kernel):
        if kernel == "fwd":
            return lambda: ib.item_block_attention_fwd(q, k, v, lengths, T, config=cfg)
        bw = ib._Backward(q, k, v, out, lse, do, lengths, T, 1 / math.sqrt(D), cfg)
        bw.run_dq()
        return bw.run_dq if kernel == "dq" else bw.run_dense_kv

    solo = {kname: _time_graph(alone(kname), 5, 20) * 1e3 for kname in ("fwd", "dq", "dense_kv")}
    print(f"{'kernel':16s} {'in fwd+bwd, us':>15s} {'gap before, us':>15s} {'alone, us':>10s}")
    for name, ds in durs.items():
        key = next((kk for kk in solo if kk in name), None)
        g = statistics.mean(gaps[name]) if name in gaps else float("nan")
        print(f"{name:16s} {statistics.mean(ds):15.1f} {g:15.1f} {solo.get(key, float('nan')) if key else float('nan'):10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
