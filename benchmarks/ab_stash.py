"""The backward's stash path against the tuned one, on a Hopper GPU (issue 5, twenty-first session).

Usage:
    python benchmarks/ab_stash.py [--iters 20] [--rounds 5] [--shapes 8x128,12x64]

The stash path (``ItemBlockConfig.sm90_dq_stash``): delta by its own launch, then the dense dk/dv
kernel, which also writes dS^T of every dense pair to a transient bf16 stash, then a dq kernel whose
dense loop is one product per tile (dQ += dS K) read from the stash -- instead of recomputing S, P
and dP as the tuned dq kernel does. Per shape (B 8 x 1,024 items x 5 tokens, every row full), per
configuration:

1. the outputs against the tuned configuration's (max |a - b| / max |b| of out, dq, dk, dv);
2. each launch alone (CUDA-graph GPU time, after one run of the whole order for its inputs):
   forward, then the backward's launches in the order ``_Backward.order`` gives;
3. fwd+bwd through autograd (CUDA graph), the configurations alternated for ``--rounds`` rounds,
   median per configuration, and its ratio to the tuned one.

Prints a table last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.kernels import _time_graph  # noqa: E402
from genrec.kernels.item_block import (  # noqa: E402
    ItemBlockConfig,
    _Backward,
    item_block_attention,
    item_block_attention_fwd,
)
from genrec.kernels.item_block_sm90 import stash_bytes  # noqa: E402

T, B, N = 5, 8, 1024


def variants(D: int) -> dict[str, ItemBlockConfig]:
    base = ItemBlockConfig.tuned(D)
    kv = (64, 16, 4, 3, 1) if D == 128 else (64, 32, 4, 3, 1)  # no spill with the stash's store (Triton 3.6)
    name = "kv " + ",".join(map(str, kv))
    out = {"tuned": base, f"tuned, {name} (no stash)": base.replace(sm90_dense_kv=kv)}
    for st in (2, 3):
        out[f"stash dq st{st}, {name}"] = base.replace(sm90_dense_kv=kv, sm90_dq_stash=(64, 64, 4, st))
    if D == 128:  # the tuned tiles with K in shared memory (spills a little with the store)
        out["stash dq st2, kv 64,32,4,3,0"] = base.replace(sm90_dense_kv=(64, 32, 4, 3, 0), sm90_dq_stash=(64, 64, 4, 2))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="8x128,12x64")
    a = ap.parse_args()
    import triton

    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}", flush=True)
    table = []
    for shape in a.shapes.split(","):
        H, D = (int(x) for x in shape.split("x"))
        S = N * T
        g = torch.Generator(device="cuda").manual_seed(H * D)
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
        lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
        scale = D ** -0.5
        print(f"\n== {H} x {D}: stash {stash_bytes(q, T) / 2**20:.0f} MiB", flush=True)
        cfgs = variants(D)
        ref = None
        graphs = {}
        for name, cfg in cfgs.items():
            out, lse = item_block_attention_fwd(q, k, v, lengths, T, scale, config=cfg)
            bw = _Backward(q, k, v, out, lse, do, lengths, T, scale, cfg)
            steps = bw.order()
            for st in steps:
                st()
            res = (out, bw.dq, bw.dk, bw.dv)
            if ref is None:
                ref = [x.clone() for x in res]
            errs = [float((x.float() - r.float()).abs().max() / r.float().abs().max()) for x, r in zip(res, ref)]
            t_fwd = _time_graph(lambda: item_block_attention_fwd(q, k, v, lengths, T, scale, config=cfg), a.warmup,
                                a.iters, reps=5)
            t_steps = {st.__name__: _time_graph(st, a.warmup, a.iters, reps=5) for st in steps}
            xs = [x.clone().requires_grad_() for x in (q, k, v)]
            graphs[name] = (lambda xs=xs, cfg=cfg: torch.autograd.grad(
                item_block_attention(*xs, lengths, T, config=cfg), xs, do))
            print(f"  {name:34s} stash={bw.stash!s:5s} err out/dq/dk/dv " + " ".join(f"{e:.1e}" for e in errs)
                  + f"  fwd {t_fwd:.4f}  " + "  ".join(f"{n[4:]} {t:.4f}" for n, t in t_steps.items()), flush=True)
            table.append({"shape": shape, "name": name, "stash": bw.stash, "errs": errs, "fwd": t_fwd, **t_steps})
            del bw, out, lse, res
        times: dict[str, list[float]] = {n: [] for n in graphs}
        for _ in range(a.rounds):
            for n, f in graphs.items():
                times[n].append(_time_graph(f, a.warmup, a.iters, reps=5))
        base = statistics.median(times["tuned"])
        for row in table:
            if row["shape"] == shape:
                row["fwd_bwd"] = statistics.median(times[row["name"]])
                row["ratio"] = row["fwd_bwd"] / base
        del graphs, q, k, v, do
        torch.cuda.empty_cache()
    print(f"\n{'shape':7s} {'configuration':34s} {'stash':5s} {'max err':>8s} {'fwd':>7s} {'delta':>7s} {'dq':>7s} "
          f"{'dense kv':>8s} {'sum':>7s} {'fwd+bwd':>8s} {'ratio':>6s}")
    for r in table:
        parts = [r["fwd"], r.get("run_delta", 0.0), r.get("run_dq", 0.0), r.get("run_dense_kv", 0.0),
                 r.get("run_sid_kv", 0.0)]
        print(f"{r['shape']:7s} {r['name']:34s} {r['stash']!s:5s} {max(r['errs']):8.1e} {r['fwd']:7.4f} "
              f"{r.get('run_delta', 0.0):7.4f} {r.get('run_dq', 0.0):7.4f} {r.get('run_dense_kv', 0.0):8.4f} "
              f"{sum(parts):7.4f} {r['fwd_bwd']:8.4f} {r['ratio']:6.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
