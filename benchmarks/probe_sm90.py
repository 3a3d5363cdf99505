"""The Gluon item-block kernels for Hopper (``genrec.kernels.item_block_sm90``): checked, then timed
against the tuned Triton kernels in the same call. GPU only (an H100/H200).

Usage:
    python benchmarks/probe_sm90.py [--out results.json] [--iters 20] [--warmup 5] [--skip-checks]
        [--head-dims 64,128] [--add 128:sm90_dense_kv=128,32,8,3,1 ...]

``--add D:KNOB=TILES`` adds a configuration to those checked and timed at head dim D.

1. Checks on fresh random inputs (bf16; D 64 and 128; 1 to 300 items; lengths 0 / part / full),
   every output first filled with NaN (every row must be written): the forward's out and lse
   against the fp32 reference with the mask made explicit (bf16 and fp16), for each forward
   configuration; then fwd+bwd through ``item_block_attention`` with each dq and each dense dk/dv
   configuration switched on, against the fp32 reference.
2. Per kernel, B 8 x 1,024 items x T 5, 12 heads x 64 and 8 x 128, CUDA-graph replay (GPU time):
   the tuned Triton forward, dq and dense dk/dv kernels and each sm90 configuration of each.
3. fwd+bwd, graph-replayed: Triton alone (the tuned knobs, sm90 off), the configuration the model
   uses (``ItemBlockConfig.tuned``), and the best sm90 kernels of (2) together; alternated three
   times, median of three.
Prints a table last; ``--out`` gets every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.kernels import _time_graph, _visible_pairs  # noqa: E402
from genrec.kernels import item_block as ib  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig, item_block_attention  # noqa: E402
from genrec.kernels.item_block_sm90 import launch_fwd_sm90, sm90_available  # noqa: E402
from genrec.kernels.reference import item_block_attention_ref, item_block_mask  # noqa: E402

T = 5
CONFIGS = {  # knob -> head dim -> (tile, tile, warps, stages[, operands held in registers])
    "sm90_fwd": {64: [(64, 64, 4, 2, 1), (64, 128, 4, 2, 1)], 128: [(64, 64, 4, 2), (64, 64, 4, 2, 1)]},
    "sm90_dq": {64: [(64, 64, 4, 2, 1), (64, 64, 4, 3, 1)], 128: [(64, 64, 4, 2), (64, 64, 4, 2, 1)]},
    "sm90_dense_kv": {64: [(64, 32, 4, 3, 2), (64, 64, 4, 2), (64, 64, 4, 3, 1), (64, 128, 4, 2)],
                      128: [(64, 32, 4, 3), (64, 32, 4, 4)]},
}
SHAPES = [(12, 64), (8, 128)]
LPT = (False,)  # the grid orders timed per kernel (ItemBlockConfig.lpt); the tuned rows use their own


def triton_only(D: int) -> ItemBlockConfig:
    return ItemBlockConfig.tuned(D).replace(sm90_fwd=None, sm90_dq=None, sm90_dense_kv=None)


def model_layout(q, k, v, do):
    """The same values laid out as the model hands them over: q, k, v head-split views of one
    [B, S, 3, H, D] projection, dO a transposed view of [B, S, H, D] (not contiguous; TMA-readable)."""
    B, H, S, D = q.shape
    qkv = torch.stack([x.transpose(1, 2) for x in (q, k, v)], 2).contiguous()  # [B, S, 3, H, D]
    q2, k2, v2 = qkv.permute(2, 0, 3, 1, 4)
    return q2, k2, v2, do.transpose(1, 2).contiguous().transpose(1, 2)


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def ref_out_lse(q, k, v, lengths):
    B, H, S, D = q.shape
    mask = item_block_mask(lengths.cpu(), S // T, T).to(q.device)[:, None]
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(D)
    lse = torch.logsumexp(s.masked_fill(~mask, float("-inf")), -1)
    lse = torch.where(mask.any(-1), lse, torch.zeros_like(lse))
    return item_block_attention_ref(q.float(), k.float(), v.float(), lengths, T), lse


def checks(results, head_dims) -> bool:
    g = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    real_empty = ib._empty
    ib._empty = lambda shape, like, dtype=None: torch.full(tuple(shape), float("nan"), device=like.device,
                                                           dtype=dtype or like.dtype)
    try:
        for D in head_dims:
            for n, lens in ((1, [1, 0]), (13, [13, 7]), (150, [150, 101]), (300, [0, 299])):
                for dtype in (torch.bfloat16, torch.float16):
                    q, k, v, do = (torch.randn(2, 2, n * T, D, device="cuda", generator=g).to(dtype) for _ in range(4))
                    lengths = torch.tensor(lens, device="cuda", dtype=torch.int32)
                    ro, rl = ref_out_lse(q, k, v, lengths)
                    fwd_runs = [(cfg, (q, k, v)) for cfg in CONFIGS["sm90_fwd"][D]]
                    fwd_runs.append((CONFIGS["sm90_fwd"][D][0], model_layout(q, k, v, do)[:3]))  # strided views
                    for cfg, (fq, fk, fv) in fwd_runs:
                        out = torch.full_like(q, float("nan"))
                        lse = torch.full(q.shape[:3], float("nan"), device="cuda")
                        launch_fwd_sm90(fq, fk, fv, lengths, out, lse, T, 1 / math.sqrt(D), block_m=cfg[0],
                                        block_n=cfg[1], num_warps=cfg[2], stages=cfg[3], a_regs=cfg[4:5] == (1,))
                        e = {"out": rel(out, ro), "lse": rel(lse, rl)}
                        nan = bool(out.isnan().any() or lse.isnan().any())
                        good = e["out"] < 2e-2 and e["lse"] < 1e-3 and not nan
                        ok &= good
                        results["checks"].append({"kernel": "fwd", "D": D, "n": n, "dtype": str(dtype), "cfg": cfg,
                                                  "contiguous": fq.is_contiguous(), **e, "nan": nan, "ok": good})
                        if not good:
                            print(f"  FAIL fwd D={D} n={n} {lens} {dtype} {cfg}: {e} nan={nan}", flush=True)
                    if dtype != torch.bfloat16:
                        continue
                    rs = [x.float().requires_grad_() for x in (q, k, v)]
                    ref = item_block_attention_ref(*rs, lengths, T)
                    gref = torch.autograd.grad(ref, rs, do.float())
                    runs = [(knob, cfg, "contiguous") for knob in ("sm90_dq", "sm90_dense_kv") for cfg in CONFIGS[knob][D]]
                    runs.append(("tuned", None, "model"))  # every sm90 kernel on, the model's strided views
                    for knob, cfg, layout in runs:
                            c = ItemBlockConfig.tuned(D) if knob == "tuned" else triton_only(D).replace(**{knob: cfg})
                            if layout == "model":
                                mq, mk, mv, mdo = model_layout(q, k, v, do)
                                xs = [x.detach().requires_grad_() for x in (mq, mk, mv)]
                                g_out = mdo
                            else:
                                xs = [x.clone().requires_grad_() for x in (q, k, v)]
                                g_out = do
                            out = item_block_attention(*xs, lengths, T, config=c)
                            grads = torch.autograd.grad(out, xs, g_out)
                            e = {f"d{a}": rel(x, y) for a, x, y in zip("qkv", grads, gref)}
                            nan = any(bool(x.isnan().any()) for x in grads)
                            good = max(e.values()) < 2e-2 and not nan
                            ok &= good
                            results["checks"].append({"kernel": knob, "D": D, "n": n, "cfg": cfg, "layout": layout, **e,
                                                      "nan": nan, "ok": good})
                            if not good:
                                print(f"  FAIL {knob} D={D} n={n} {lens} {cfg} {layout}: {e} nan={nan}", flush=True)
    finally:
        ib._empty = real_empty
    n_ok = sum(1 for c in results["checks"] if c["ok"])
    print(f"checks: {n_ok}/{len(results['checks'])} ok", flush=True)
    return ok


def timing(results, warmup, iters, head_dims) -> None:
    B, n = 8, 1024
    rows = []
    for H, D in [s for s in SHAPES if s[1] in head_dims]:
        S = n * T
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        lengths = torch.full((B,), n, device="cuda", dtype=torch.int32)
        flops = 4 * _visible_pairs(lengths.cpu(), n, T) * D * H  # forward, useful pairs only
        shape = f"{H}x{D}"
        base = triton_only(D)
        out, lse = ib.item_block_attention_fwd(q, k, v, lengths, T, config=base)

        def kernel_fn(cfg, kernel):
            if kernel == "fwd":
                return lambda: ib.item_block_attention_fwd(q, k, v, lengths, T, config=cfg)
            bw = ib._Backward(q, k, v, out, lse, do, lengths, T, 1 / math.sqrt(D), cfg)
            bw.run_dq()  # delta, for the dk/dv kernel
            return bw.run_dq if kernel == "dq" else bw.run_dense_kv

        best = {}
        best_lpt = {}
        for kernel, knob, share in (("fwd", "sm90_fwd", 1.0), ("dq", "sm90_dq", 1.5), ("dense dk/dv", "sm90_dense_kv", 2.0)):
            t0 = _time_graph(kernel_fn(base, kernel), warmup, iters)
            rows.append({"shape": shape, "impl": f"triton {kernel}", "ms": t0, "tflops": share * flops / t0 / 1e9})
            for lpt in LPT:
                for cfg in ([None] if lpt else []) + CONFIGS[knob][D]:
                    name = f"{'triton' if cfg is None else 'sm90'} {kernel} {cfg or ''}{' lpt' if lpt else ''}"
                    try:
                        t = _time_graph(kernel_fn(base.replace(**{knob: cfg, "lpt": lpt}), kernel), warmup, iters)
                    except Exception as e:  # noqa: BLE001
                        print(f"  {shape} {name}: ERROR {e!r}"[:300], flush=True)
                        continue
                    rows.append({"shape": shape, "impl": name, "ms": t, "tflops": share * flops / t / 1e9,
                                 "vs_triton": t0 / t})
                    print(f"  {shape} {name}: {t:.4f} ms (triton {t0:.4f})", flush=True)
                    pick = best_lpt if lpt else best
                    if cfg is not None and t < t0 and (knob not in pick or t < pick[knob][0]):
                        pick[knob] = (t, cfg)
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        both = lambda c: (lambda: torch.autograd.grad(item_block_attention(*xs, lengths, T, config=c), xs, do))  # noqa: E731
        mq, mk, mv, mdo = model_layout(q, k, v, do)
        ms = [x.detach().requires_grad_() for x in (mq, mk, mv)]
        both_m = lambda c: (lambda: torch.autograd.grad(item_block_attention(*ms, lengths, T, config=c), ms, mdo))  # noqa: E731
        cands = {"triton only (tuned knobs)": (base, both), "ItemBlockConfig.tuned (the model's)": (ItemBlockConfig.tuned(D), both),
                 "best sm90 kernels of this run": (base.replace(**{k: v[1] for k, v in best.items()}), both),
                 "triton only, lpt": (base.replace(lpt=True), both),
                 "tuned, lpt": (ItemBlockConfig.tuned(D).replace(lpt=True), both),
                 "best sm90 kernels (lpt) of this run": (base.replace(lpt=True, **{k: v[1] for k, v in best_lpt.items()}), both),
                 "model layout, triton only": (base, both_m), "model layout, tuned": (ItemBlockConfig.tuned(D), both_m)}
        times = {name: [] for name in cands}
        for _ in range(3):
            for name, (c, fn) in cands.items():
                times[name].append(_time_graph(fn(c), warmup, iters, reps=5))
        t_base = sorted(times["triton only (tuned knobs)"])[1]
        for name, ts in times.items():
            t = sorted(ts)[1]
            rows.append({"shape": shape, "impl": f"fwd+bwd: {name}", "ms": t, "tflops": 3.5 * flops / t / 1e9,
                         "vs_triton": t_base / t, "all": ts,
                         "config": {k: getattr(cands[name][0], k) for k in ("sm90_fwd", "sm90_dq", "sm90_dense_kv", "lpt")}})
        del q, k, v, do, xs, out, lse, mq, mk, mv, mdo, ms
        torch.cuda.empty_cache()
    results["timing"] = rows
    print(f"\n{'shape':6s} {'implementation':48s} {'ms':>8s} {'TFLOP/s':>8s} {'vs triton':>9s}")
    for r in rows:
        print(f"{r['shape']:6s} {r['impl']:48s} {r['ms']:8.4f} {r['tflops']:8.1f} {r.get('vs_triton', float('nan')):9.3f}")
        if "config" in r:
            print(f"{'':6s}   {r['config']}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--add", action="append", default=[], metavar="D:KNOB=TILES")
    a = ap.parse_args()
    head_dims = [int(x) for x in a.head_dims.split(",")]
    for spec in a.add:
        d, rest = spec.split(":", 1)
        knob, tiles = rest.split("=", 1)
        CONFIGS[knob][int(d)].append(tuple(int(x) for x in tiles.split(",")))
    if not torch.cuda.is_available() or not sm90_available(torch.empty(1, device="cuda", dtype=torch.bfloat16)):
        print("probe_sm90: needs a Hopper GPU and Gluon; nothing to do")
        return 0
    import triton

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "checks": []}
    print(f"{results['device']}, torch {results['torch']}, triton {results['triton']}", flush=True)
    rc = 0
    try:
        if not a.skip_checks and not checks(results, head_dims):
            rc = 1
        timing(results, a.warmup, a.iters, head_dims)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        rc = 2
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
