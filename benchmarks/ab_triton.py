"""A/B of the Gluon item-block kernels compiled by two Triton versions (GPU only, an H100/H200).

Usage:
    python benchmarks/ab_triton.py --side NAME=[TRITON_DIR][;KNOB=a,b,c,d[,e]...] --side ... \\
        [--head-dim 128] [--rounds 4] [--iters 20] [--full]

One process cannot load two Tritons, so each side runs as a child process of this script, in
alternation, ``--rounds`` times: a side's TRITON_DIR (a folder holding a ``triton`` package, e.g. an
unpacked Triton 3.9) goes first on PYTHONPATH (with ``TRITON_BACKENDS_IN_TREE=1``, so that the
machine's own Triton's entry points are not used); an empty one keeps the machine's Triton. ``KNOB=``
settings give that side other Gluon tiles than ``ItemBlockConfig.tuned`` picks under its Triton.

Each child builds the same inputs as ``ab_sm90.py`` (same seed), runs the three kernels (forward, dq,
dense dk/dv), then times each from CUDA graphs (median of 3 timings of ``--iters`` replays) and the whole
``item_block_attention`` fwd+bwd with the tuned configuration (the same-run table's GPU-time column).
The first round's outputs are saved, and each side's are compared with the first side's. Printed last:
the median over rounds per side and kernel, and the ratio to the first side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("forward", "dq", "dense dk/dv", "fwd+bwd (autograd)")


def child(a: argparse.Namespace) -> int:
    import torch
    import triton

    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "src"))
    from ab_sm90 import T, bufs, kernels, make_inputs, with_tiles

    from genrec.bench.kernels import _time_graph
    from genrec.kernels import item_block_sm90 as sm
    from genrec.kernels.item_block import ItemBlockConfig, item_block_attention

    cfg = with_tiles(ItemBlockConfig.tuned(a.head_dim), a.set)
    x = make_inputs(a.head_dim, a.full)
    o = bufs(x)
    ks = kernels(sm, x, o, cfg)
    for f in ks.values():
        f()
    xs = [x[c].clone().requires_grad_() for c in "qkv"]

    def both():
        return torch.autograd.grad(item_block_attention(*xs, x["lengths"], T, config=cfg), xs, x["do"])

    ks["fwd+bwd (autograd)"] = both
    torch.cuda.synchronize()
    # (5 calls per graph for the whole fwd+bwd, as the same-run table captures it; 20 for a kernel)
    times = {name: statistics.median(_time_graph(f, a.warmup, a.iters, reps=5 if name in KERNELS[3:] else 20)
                                     for _ in range(3)) for name, f in ks.items()}
    if a.save:
        torch.save({key: t.cpu() for key, t in o.items()}, a.save)
    Path(a.out).write_text(json.dumps({"triton": triton.__version__, "tiles": [cfg.sm90_fwd, cfg.sm90_dq,
                                       cfg.sm90_dense_kv], "times": times}))
    return 0


def run_side(a: argparse.Namespace, spec: str, out: str, save: str | None) -> dict:
    name, _, rest = spec.partition("=")
    path, *sets = rest.split(";")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in (path, str(ROOT / "src"), env.get("PYTHONPATH", "")) if p])
    if path:
        env["TRITON_BACKENDS_IN_TREE"] = "1"
    cmd = [sys.executable, __file__, "--child", "--head-dim", str(a.head_dim), "--iters", str(a.iters),
           "--warmup", str(a.warmup), "--out", out, *(["--full"] if a.full else []), *(["--save", save] if save else [])]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"side {name!r} failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(Path(out).read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", action="append", default=[], metavar="NAME=[TRITON_DIR][;KNOB=a,b,c,d[,e]...]")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--full", action="store_true", help="every row 1,024 items long (the table's shape)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if len(a.side) < 2:
        ap.error("give at least two --side")
    names = [s.partition("=")[0] for s in a.side]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for i, spec in enumerate(a.side):
                save = f"{tmp}/out{i}.pt" if r == 0 else None
                runs[names[i]].append(run_side(a, spec, f"{tmp}/t.json", save))
                print(f"round {r + 1} {names[i]:>14s}: " + " ".join(f"{v:.4f}" for v in runs[names[i]][-1]["times"].values()),
                      flush=True)
        import torch

        base = torch.load(f"{tmp}/out0.pt")
        ok = True
        for i, n in enumerate(names[1:], 1):
            other = torch.load(f"{tmp}/out{i}.pt")
            diffs = {k: float((base[k].float() - other[k].float()).abs().max()) for k in base}
            scale = {k: max(float(base[k].float().abs().max()), 1.0) for k in base}
            good = all(diffs[k] < 1e-2 * scale[k] for k in base)
            ok &= good
            print(f"outputs {n} vs {names[0]}: " + " ".join(f"{k} {d:.3g}" for k, d in diffs.items())
                  + ("  agree" if good else "  DIFFER"))
    print(f"\nGluon kernels, head dim {a.head_dim}, B 8 x 1,024 items (lengths {'1,024' if a.full else '512..1,024'}), "
          f"median over {a.rounds} alternated child processes (each: median of 3 graph timings), ms")
    print(f"{'side':14s} {'triton':7s} " + " ".join(f"{k:>18s}" for k in KERNELS) + f" {'sum of 3':>9s} {'sum ratio':>9s}")
    sums = {}
    for n in names:
        med = {k: statistics.median(run["times"][k] for run in runs[n]) for k in KERNELS}
        sums[n] = sum(med[k] for k in KERNELS[:3])
        tiles = runs[n][0]["tiles"]
        print(f"{n:14s} {runs[n][0]['triton']:7s} " + " ".join(f"{med[k]:18.4f}" for k in KERNELS)
              + f" {sums[n]:9.4f} {sums[n] / sums[names[0]]:9.3f}   tiles {tiles}")
    print("outputs agree" if ok else "OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
