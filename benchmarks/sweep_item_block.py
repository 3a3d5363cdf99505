"""Tuning sweep of the PinGER item-block attention kernel (``genrec.kernels.item_block``) on a GPU.

Usage (GPU only; on a CPU machine it prints a message and exits 0):

    python benchmarks/sweep_item_block.py --out sweep_item_block.json [--iters 20] [--warmup 5] [--jobs 12] [--quick]
    TRITON_INTERPRET=1 python benchmarks/sweep_item_block.py --tiny --out /tmp/s.json   # CPU smoke test

Shapes: bf16, B=8, 1,024 items x T=5 tokens (S=5,120), 12 heads x 64 and 8 heads x 128.

1. Every configuration is first checked against the fp32 reference on a small shape (fwd + bwd,
   relative error < 2e-2) in parallel worker processes (``--jobs``); the small shape has the same
   Triton specialisation as the benchmark shape, so these checks also compile the kernels into a
   fresh Triton cache (``TRITON_CACHE_DIR``, a new temporary folder unless set). A configuration
   that fails to compile (shared memory, registers) or fails the check is reported and skipped;
   the first three wrong results are checked again in the main process.
2. "coupled" grid: every kernel shares the tile sizes / warps / stages (the original kernel's
   layout of knobs): the original default, each new option alone, split_tail + fuse_delta +
   fuse_sid_kv (with and without gather_dense), then block_m x block_n x warps x stages with and
   without those three options. fwd and fwd+bwd timed.
3. "per-kernel" grid: the backward kernels' own knobs, each kernel timed alone: dq (with the SID
   dk/dv fused), dense dk/dv, and the unfused SID dk/dv kernel.
4. "composite": the fastest forward of (2) plus the fastest dq and dense dk/dv of (3), checked and
   timed end to end, with a per-kernel breakdown next to the original default's.

Timing: torch.cuda.Event, warmup, median of ``--iters``, twice: "eager" (the calls as a training
step makes them today, host work and the lengths check's sync included) and CUDA-graph replay
(GPU time alone; the table is sorted by it). Useful FLOPs are counted as in ``bench_kernels.py``'s
bench_train: forward ``4 * visible_pairs * D * H``, fwd+bwd 3.5x that, over the GPU time.
Prints a table per shape; ``--out`` gets the full results as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # also in the spawned workers
if "TRITON_CACHE_DIR" not in os.environ and os.environ.get("TRITON_INTERPRET") != "1":
    # A fresh kernel cache per sweep (inherited by the workers): every binary is compiled by this run.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-sweep-")

try:
    from genrec.kernels.item_block import ItemBlockConfig
except ImportError:  # no triton: main() says so
    ItemBlockConfig = None  # type: ignore[assignment,misc]

SHAPE = {"B": 8, "n_items": 1024, "T": 5, "heads": [(12, 64), (8, 128)]}
CHECK = {"B": 2, "n_items": 48, "lengths": [48, 31], "tol": 2e-2}  # n_items * T divisible by 16: same specialisation
FLAGS = {"gather_dense": "+gather", "split_tail": "+split", "fuse_delta": "+delta", "fuse_sid_kv": "+sidkv"}
NEW = {"split_tail": True, "fuse_delta": True, "fuse_sid_kv": True}  # gather_dense measured no gain: ablation only


# ---------------------------------------------------------------- configurations


def describe(cfg: ItemBlockConfig) -> str:
    """Short name: the fields that differ from the original default."""
    short = {"block_m": "bm", "block_n": "bn", "num_warps": "w", "num_stages": "s", "dq_block_m": "dq_bm",
             "dq_block_n": "dq_bn", "dq_warps": "dq_w", "dq_stages": "dq_s", "kv_block_i": "kv_bi",
             "kv_block_q": "kv_bq", "kv_warps": "kv_w", "kv_stages": "kv_s", "sid_block_m": "sid_bm", "sid_warps": "sid_w"}
    base = ItemBlockConfig()
    parts = []
    for f in dataclasses.fields(cfg):
        x = getattr(cfg, f.name)
        if f.name in FLAGS:
            if x:
                parts.append(FLAGS[f.name])
        elif x != getattr(base, f.name) or f.name in ("block_m", "block_n"):
            parts.append(f"{short[f.name]}{x}")
    return " ".join(parts)


def coupled_grid(quick: bool, tiny: bool) -> list[ItemBlockConfig]:
    legacy = ItemBlockConfig()
    if tiny:
        return [legacy]
    grid = [legacy, *(legacy.replace(**{f: True}) for f in FLAGS), legacy.replace(**NEW), legacy.replace(**NEW, gather_dense=True)]
    for new in (False, True):
        for bm in (64, 128):
            for bn in (64, 128):
                for w in ((4, 8) if not quick else (4,)):
                    for s in ((2, 3, 4) if not quick else (3,)):
                        cfg = ItemBlockConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s, **(NEW if new else {}))
                        if cfg not in grid:
                            grid.append(cfg)
    return grid


def per_kernel_grid(quick: bool, tiny: bool) -> dict[str, list[ItemBlockConfig]]:
    """Configurations that vary one backward kernel's own knobs on a fixed base (the new options
    on; the dq kernel then also does the SID keys' dk/dv, and the SID kernel is timed unfused)."""
    base = ItemBlockConfig(**NEW)
    unfused = base.replace(fuse_sid_kv=False)
    if tiny:
        return {"dq": [base.replace(dq_block_m=32)], "dense_kv": [base.replace(kv_block_i=32)], "sid_kv": [unfused.replace(sid_block_m=32)]}
    warps = (4, 8)
    stages = (3,) if quick else (2, 3, 4)
    tiles = (64, 128) if quick else (32, 64, 128)
    dq = [base.replace(dq_block_m=bm, dq_block_n=bn, dq_warps=w, dq_stages=s)
          for bm in (64, 128) for bn in tiles for w in warps for s in stages]
    kv = [base.replace(kv_block_i=bi, kv_block_q=bq, kv_warps=w, kv_stages=s)
          for bi in tiles for bq in tiles for w in warps for s in stages]
    sid = [unfused.replace(sid_block_m=bm, sid_warps=w) for bm in (16, 32, 64, 128) for w in (2, 4, 8)]
    return {"dq": dq, "dense_kv": kv, "sid_kv": sid}


# ---------------------------------------------------------------- checks (run in worker processes)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_config(task: tuple[str, int, int, dict[str, Any], int, dict[str, Any]]) -> dict[str, Any]:
    """fwd + bwd of one configuration vs the fp32 reference on the small check shape (bf16)."""
    device, H, D, cfg_dict, T, check = task
    from genrec.kernels.item_block import item_block_attention
    from genrec.kernels.reference import item_block_attention_ref

    cfg = ItemBlockConfig(**cfg_dict)
    t0 = time.perf_counter()
    try:
        g = torch.Generator(device=device).manual_seed(0)
        n, B = check["n_items"], check["B"]
        q, k, v, do = (torch.randn(B, H, n * T, D, device=device, generator=g).to(torch.bfloat16) for _ in range(4))
        lengths = torch.tensor(check["lengths"], device=device, dtype=torch.int32)
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = item_block_attention(*xs, lengths, T, config=cfg)
        grads = torch.autograd.grad(out, xs, do)
        rs = [x.float().requires_grad_() for x in (q, k, v)]
        ref = item_block_attention_ref(*rs, lengths, T)
        grads_ref = torch.autograd.grad(ref, rs, do.float())
        errs = {"out": _rel(out, ref), **{f"d{c}": _rel(a, b) for c, a, b in zip("qkv", grads, grads_ref)}}
        ok = all(math.isfinite(e) and e < check["tol"] for e in errs.values())
        return {"config": cfg_dict, "status": "ok" if ok else "FAIL", "errs": errs, "seconds": time.perf_counter() - t0}
    except Exception as exc:  # noqa: BLE001 - a sweep records failures (compile errors, OOM) and goes on
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return {"config": cfg_dict, "status": "error", "error": msg, "trace": traceback.format_exc()[-1500:],
                "seconds": time.perf_counter() - t0}


def check_all(device: str, H: int, D: int, T: int, cfgs: list[ItemBlockConfig], jobs: int) -> dict[ItemBlockConfig, dict[str, Any]]:
    tasks = [(device, H, D, dataclasses.asdict(c), T, dict(CHECK)) for c in cfgs]
    if jobs <= 1:
        results = [check_config(t) for t in tasks]
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(check_config, tasks))
    return {c: r for c, r in zip(cfgs, results)}


# ---------------------------------------------------------------- timing


class Timer:
    """Median milliseconds (CUDA events; perf_counter on CPU) over ``iters`` runs after ``warmup``.

    ``eager``: the calls as a training step makes them today (host work and syncs included).
    ``graph``: the same calls captured in a CUDA graph and replayed -- GPU time alone, no host gaps.
    """

    def __init__(self, device: str, warmup: int, iters: int) -> None:
        self.device, self.warmup, self.iters = device, warmup, iters

    def eager(self, fn: Callable[[], Any]) -> float:
        from genrec.bench.kernels import median_ms

        return median_ms(fn, self.warmup, self.iters, self.device)

    def graph(self, fn: Callable[[], Any]) -> float | None:
        if self.device == "cpu":
            return None
        side = torch.cuda.Stream()  # the kernel skips its host-side lengths check while capturing
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        ms = self.eager(g.replay)
        del g
        return ms


def visible_pairs(lengths: list[int], T: int) -> int:
    """(query, key) pairs the rules allow, summed over the batch -- the count of bench_kernels.py."""
    total = 0.0
    for n in lengths:
        i = torch.arange(n, dtype=torch.float64)  # dense query of item i: i+1 keys; SID level l: i + l keys
        total += float((i + 1).sum() + sum((i + lvl).sum() for lvl in range(1, T)))
    return int(total)


class Bench:
    """Benchmark tensors of one shape, and the timed calls."""

    def __init__(self, device: str, B: int, n_items: int, T: int, H: int, D: int, timer: Timer) -> None:
        self.device, self.T, self.H, self.D, self.timer = device, T, H, D, timer
        S = n_items * T
        g = torch.Generator(device=device).manual_seed(1)
        self.q, self.k, self.v, self.do = (torch.randn(B, H, S, D, device=device, generator=g).to(torch.bfloat16) for _ in range(4))
        self.lengths = torch.full((B,), n_items, device=device, dtype=torch.int32)
        self.xs = [x.clone().requires_grad_() for x in (self.q, self.k, self.v)]
        self.fwd_flops = 4 * visible_pairs(self.lengths.tolist(), T) * D * H
        self.shape = f"B={B} S={S} H={H} D={D}"

    def fwd_bwd(self, cfg: ItemBlockConfig) -> dict[str, Any]:
        from genrec.kernels.item_block import item_block_attention

        f = lambda: item_block_attention(*self.xs, self.lengths, self.T, config=cfg)  # noqa: E731
        fb = lambda: torch.autograd.grad(f(), self.xs, self.do)  # noqa: E731
        row: dict[str, Any] = {"fwd_ms": self.timer.eager(f), "fwd_bwd_ms": self.timer.eager(fb),
                               "graph_fwd_ms": self.timer.graph(f), "graph_fwd_bwd_ms": self.timer.graph(fb)}
        row["tflops_fwd"] = self.fwd_flops / (row["graph_fwd_ms"] or row["fwd_ms"]) / 1e9
        row["tflops_fwd_bwd"] = 3.5 * self.fwd_flops / (row["graph_fwd_bwd_ms"] or row["fwd_bwd_ms"]) / 1e9
        row["sort_ms"] = row["graph_fwd_bwd_ms"] or row["fwd_bwd_ms"]
        return row

    def per_kernel(self, cfg: ItemBlockConfig, only: str | None = None) -> dict[str, float | None]:
        """Each kernel timed alone, GPU time (plus the PyTorch delta and the dense-K/V gather); ``only``: one of them."""
        from genrec.kernels.item_block import _Backward, item_block_attention_fwd

        scale = 1.0 / math.sqrt(self.D)
        q, k, v, lengths, T = self.q, self.k, self.v, self.lengths, self.T
        out, lse = item_block_attention_fwd(q, k, v, lengths, T, scale, config=cfg)
        bw = _Backward(q, k, v, out, lse, self.do, lengths, T, scale, cfg)
        bw.run_dq()  # writes delta when fused: the dk/dv kernels read it
        fns: dict[str, Callable[[], Any]] = {
            "fwd": lambda: item_block_attention_fwd(q, k, v, lengths, T, scale, config=cfg),
            "dq": bw.run_dq, "sid_kv": bw.run_sid_kv, "dense_kv": bw.run_dense_kv,
        }
        if cfg.fuse_sid_kv:  # done inside the dq kernel
            del fns["sid_kv"]
        if not cfg.fuse_delta:
            fns["delta_torch"] = lambda: (self.do.float() * out.float()).sum(-1)
        if cfg.gather_dense:
            fns["gather_kv"] = lambda: (k[:, :, T - 1 :: T].contiguous(), v[:, :, T - 1 :: T].contiguous())
        timed = self.timer.eager if self.device == "cpu" else self.timer.graph
        return {name: timed(fn) for name, fn in fns.items() if only in (None, name)}


def guard(errors: list[dict[str, Any]], name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a sweep records failures and goes on
        msg = f"{name}: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        errors.append({"name": name, "error": msg, "trace": traceback.format_exc()[-1500:]})
        print(f"  ! {msg}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


# ---------------------------------------------------------------- one shape


def sweep_shape(H: int, D: int, args: argparse.Namespace, device: str, res: dict[str, Any]) -> None:
    T = SHAPE["T"]
    errors: list[dict[str, Any]] = res["errors"]
    coupled = coupled_grid(args.quick, args.tiny)
    kernels = per_kernel_grid(args.quick, args.tiny)
    if args.match:  # a subset; the original default stays as the baseline
        keep = lambda c: c == ItemBlockConfig() or re.search(args.match, describe(c)) is not None  # noqa: E731
        coupled = [c for c in coupled if keep(c)]
        kernels = {k: [c for c in cs if keep(c)] for k, cs in kernels.items()}
    every = list(dict.fromkeys(coupled + [c for cs in kernels.values() for c in cs]))
    t0 = time.time()
    checks = check_all(device, H, D, T, every, args.jobs)
    n_ok = sum(r["status"] == "ok" for r in checks.values())
    print(f"[H={H} D={D}] checked {len(every)} configs in {time.time() - t0:.0f} s: {n_ok} ok", flush=True)
    failed = [c for c, r in checks.items() if r["status"] == "FAIL"]
    for c in failed[:3]:  # a wrong result from a worker: does it reproduce in this process?
        again = check_all(device, H, D, T, [c], 1)[c]
        print(f"  recheck in the main process of {describe(c)}: {again['status']} {again.get('errs')}", flush=True)
        checks[c]["recheck"] = again
    for c, r in checks.items():
        res["checks"].append({"H": H, "D": D, "name": describe(c), **r})
        if r["status"] != "ok":
            print(f"  skip {describe(c)}: {r['status']} {r.get('error', r.get('errs'))}", flush=True)
    bench = Bench(device, SHAPE["B"], SHAPE["n_items"], T, H, D, Timer(device, args.warmup, args.iters))

    rows = []
    for c in coupled:
        if checks[c]["status"] == "ok":
            t = guard(errors, f"{bench.shape} {describe(c)}", lambda: bench.fwd_bwd(c))
            if t:
                rows.append({"shape": bench.shape, "grid": "coupled", "name": describe(c), "config": dataclasses.asdict(c), **t})
    per_kernel = []
    for kernel, cs in kernels.items():
        for c in cs:
            if checks[c]["status"] == "ok":
                t = guard(errors, f"{bench.shape} {kernel} {describe(c)}", lambda: bench.per_kernel(c, kernel)[kernel])
                if t:
                    per_kernel.append({"shape": bench.shape, "kernel": kernel, "name": describe(c), "config": dataclasses.asdict(c), "ms": t})

    # Composite: fastest forward (coupled grid) + fastest dq (SID dk/dv fused) and dense dk/dv, new options on.
    best_fwd = min(rows, key=lambda r: r["graph_fwd_ms"] or r["fwd_ms"], default=None)
    knobs: dict[str, Any] = dict(NEW)
    if best_fwd:
        knobs.update({f: best_fwd["config"][f] for f in ("block_m", "block_n", "num_warps", "num_stages")})
    for kernel, fields in (("dq", ("dq_block_m", "dq_block_n", "dq_warps", "dq_stages")),
                           ("dense_kv", ("kv_block_i", "kv_block_q", "kv_warps", "kv_stages"))):
        best = min((r for r in per_kernel if r["kernel"] == kernel), key=lambda r: r["ms"], default=None)
        if best:
            knobs.update({f: best["config"][f] for f in fields})
    composite = ItemBlockConfig(**knobs)
    chk = check_all(device, H, D, T, [composite], 1)[composite]
    res["checks"].append({"H": H, "D": D, "name": "composite " + describe(composite), **chk})
    if chk["status"] == "ok":
        t = guard(errors, f"{bench.shape} composite", lambda: bench.fwd_bwd(composite))
        if t:
            rows.append({"shape": bench.shape, "grid": "composite", "name": "composite " + describe(composite),
                         "config": dataclasses.asdict(composite), **t})
    else:
        print(f"  composite {describe(composite)} failed its check: {chk.get('error', chk.get('errs'))}", flush=True)
    breakdown: dict[str, Any] = {}
    for label, c in (("original default", ItemBlockConfig()), ("composite", composite)):
        if chk["status"] == "ok" or label != "composite":
            t = guard(errors, f"{bench.shape} breakdown {label}", lambda: bench.per_kernel(c))
            breakdown[label] = {"config": describe(c), "ms": t}
    res["coupled"].extend(r for r in rows if r["grid"] == "coupled")
    res["composite"].extend(r for r in rows if r["grid"] == "composite")
    res["per_kernel"].extend(per_kernel)
    res["breakdown"][bench.shape] = breakdown
    print(table(bench.shape, rows, per_kernel, breakdown), flush=True)
    del bench
    if device == "cuda":
        torch.cuda.empty_cache()


def table(shape: str, rows: list[dict[str, Any]], per_kernel: list[dict[str, Any]], breakdown: dict[str, Any]) -> str:
    legacy = next((r["sort_ms"] for r in rows if r["config"] == dataclasses.asdict(ItemBlockConfig())), None)
    f = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    out = ["", f"== item-block attention, bf16, {shape}: sorted by fwd+bwd GPU time (CUDA-graph replay; eager = "
           "as called today, host work and syncs included); ms, useful TFLOP/s (count of bench_kernels) of the GPU time =="]
    out.append(f"{'config':72s} {'eager fwd':>9s} {'eager f+b':>9s} {'fwd':>7s} {'TF/s':>6s} {'fwd+bwd':>8s} {'TF/s':>6s} {'vs dflt':>7s}")
    for r in sorted(rows, key=lambda r: r["sort_ms"]):
        sp = f"{legacy / r['sort_ms']:.2f}x" if legacy else "n/a"
        out.append(f"{r['name'][:72]:72s} {f(r['fwd_ms']):>9s} {f(r['fwd_bwd_ms']):>9s} {f(r['graph_fwd_ms']):>7s} "
                   f"{r['tflops_fwd']:6.1f} {f(r['graph_fwd_bwd_ms']):>8s} {r['tflops_fwd_bwd']:6.1f} {sp:>7s}")
    for kernel in ("dq", "dense_kv", "sid_kv"):
        rs = sorted((r for r in per_kernel if r["kernel"] == kernel), key=lambda r: r["ms"])
        out.append(f"-- {kernel} kernel alone (GPU ms), fastest 5 of {len(rs)}: " + "; ".join(f"{r['name'].split('+sidkv')[-1].strip()} {r['ms']:.3f}" for r in rs[:5]))
    for label, b in breakdown.items():
        if b["ms"]:
            out.append(f"-- breakdown {label} [{b['config']}] (GPU ms): " + " ".join(f"{k}={f(v)}" for k, v in b["ms"].items()))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the full results as JSON here")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)), help="parallel check/compile workers")
    ap.add_argument("--quick", action="store_true", help="a smaller grid (fewer warps / stages / tiles)")
    ap.add_argument("--match", default=None, help="only configs whose name matches this regex (plus the original default)")
    ap.add_argument("--shapes", default=None, help="comma-separated HxD, e.g. 12x64 (default: 12x64,8x128)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, one config per grid; with TRITON_INTERPRET=1 also on CPU (smoke test)")
    args = ap.parse_args(argv)
    if args.tiny:
        SHAPE.update(B=2, n_items=16, heads=[(2, 16)])
        CHECK.update(n_items=16, lengths=[16, 9])
    if args.shapes:
        SHAPE["heads"] = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    device = "cuda"
    if not torch.cuda.is_available():
        if not (args.tiny and os.environ.get("TRITON_INTERPRET") == "1"):
            print("sweep_item_block: no CUDA GPU found; this sweep runs on a GPU only (nothing to do).")
            return 0
        device, args.jobs = "cpu", 1
    if ItemBlockConfig is None:
        print("sweep_item_block: triton is not importable; install it to run the sweep.")
        return 1
    import triton

    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)",
                           "versions": {"torch": torch.__version__, "triton": triton.__version__},
                           "shape": dict(SHAPE), "flops": "fwd = 4 * visible_pairs * D * H; fwd+bwd = 3.5 * fwd",
                           "checks": [], "coupled": [], "per_kernel": [], "composite": [], "breakdown": {}, "errors": []}
    print(f"device: {res['device']}  torch {torch.__version__}  triton {triton.__version__}  jobs {args.jobs}", flush=True)
    t0 = time.time()
    for H, D in SHAPE["heads"]:
        guard(res["errors"], f"shape H={H} D={D}", lambda: sweep_shape(H, D, args, device, res))
    res["wall_s"] = time.time() - t0
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    bad = [c["name"] for c in res["checks"] if c["status"] != "ok"]
    print(f"\nchecks: {len(res['checks']) - len(bad)} ok, {len(bad)} not ok; errors: {len(res['errors'])}; wall {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
