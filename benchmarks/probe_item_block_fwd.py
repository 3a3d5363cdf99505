"""Probe: this commit's item-block kernel against earlier commits' kernels, and its tuned neighbours.

Usage (GPU only):
    python benchmarks/probe_item_block_fwd.py --old NAME=OLD.py [--old ...] --out probe.json [--iters 30]

``--old``: a copy of ``src/genrec/kernels/item_block.py`` from an earlier commit (e.g.
``git show REV:src/genrec/kernels/item_block.py > old.py``); its tuned configuration is timed in the
same run; the first one is the baseline of the ratio column. Same shapes as ``sweep_item_block.py``
(bf16, B 8 x 1,024 items x 5 tokens, 12 x 64 and 8 x 128). Every configuration of this commit
(the tuned one and single-knob neighbours of it) is first checked against the fp32 reference
(``sweep_item_block.check_all``); then each is timed as a CUDA-graph replay (GPU time), forward
and forward + backward, in two rounds (A B C ... A B C ...) so that drift shows; then the per-kernel
breakdown of the tuned configuration and of the fastest. Prints a table; ``--out`` gets JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_item_block as sw  # noqa: E402

from genrec.kernels.item_block import ItemBlockConfig, item_block_attention  # noqa: E402


def load_old(path: str) -> Any:
    """The old kernel module, minus its torch custom ops (the current module registered those names)."""
    text = Path(path).read_text()
    a, b = text.find("@torch.library.custom_op"), text.find("def item_block_attention(")
    if a >= 0 and b > a:
        text = text[:a] + text[b:]
    src = Path(path).with_suffix(".no_ops.py")  # Triton reads the kernels' source from the file
    src.write_text(text)
    spec = importlib.util.spec_from_file_location("item_block_old", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["item_block_old"] = mod
    spec.loader.exec_module(mod)
    return mod


def maxnreg_configs(D: int) -> dict[str, ItemBlockConfig]:
    """The tuned configuration, and it with register caps that let more programs share an SM: at head dim
    64 the forward (139 registers, 3 programs per SM) and dq (164) capped at 128 (4 per SM; the forward
    without spills, dq with a small one, by benchmarks/inspect_item_block.py)."""
    t = ItemBlockConfig.tuned(D)
    out = {"tuned": t}
    if D <= 64:
        out |= {"fwd 128 regs": t.replace(maxnreg=128), "dq 128 regs": t.replace(dq_maxnreg=128),
                "fwd + dq 128 regs": t.replace(maxnreg=128, dq_maxnreg=128),
                "fwd 128 regs, 2 stages": t.replace(maxnreg=128, num_stages=2)}
    else:
        out |= {"fwd 168 regs, 2 stages": t.replace(maxnreg=168, num_stages=2)}
    return out


def configs(D: int) -> dict[str, ItemBlockConfig]:
    """The tuned configuration of this commit, and single-knob neighbours of it."""
    t = ItemBlockConfig.tuned(D)
    out = {"tuned": t}
    for knob, values in {"block_n": (32, 128), "num_stages": (2, 4), "dq_block_n": (32, 64), "dq_stages": (2, 4),
                         "kv_block_q": (64, 128), "kv_stages": (2, 3)}.items():
        for x in values:
            if getattr(t, knob) != x:
                out[f"tuned {knob}={x}"] = t.replace(**{knob: x})
    # multi-knob neighbours timed and dropped so far (BENCHMARKS.md, eleventh to thirteenth sessions): the
    # spill-free dense dk/dv tiles, the forward's lazy rescaling, 8 warps per kernel, stored dS, prefetched
    # scores, the split in-block part
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", action="append", default=[], metavar="NAME=PATH",
                    help="an earlier commit's item_block.py, timed (its tuned configuration) as NAME; repeatable")
    ap.add_argument("--out", default="")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--no-neighbours", action="store_true", help="time the tuned configuration only")
    ap.add_argument("--maxnreg", action="store_true", help="time the tuned configuration against maxnreg_configs")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("probe_item_block_fwd: no CUDA GPU; nothing to do.")
        return 0
    olds = {name: load_old(path) for name, path in (o.split("=", 1) for o in args.old)}
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}, "errors": []}
    timer = sw.Timer("cuda", args.warmup, args.iters)
    for H, D in sw.SHAPE["heads"]:
        T = sw.SHAPE["T"]
        cfgs = maxnreg_configs(D) if args.maxnreg else configs(D)
        if args.no_neighbours:
            cfgs = {"tuned": cfgs["tuned"]}
        checks = sw.check_all("cuda", H, D, T, list(cfgs.values()), args.jobs)
        bench = sw.Bench("cuda", sw.SHAPE["B"], sw.SHAPE["n_items"], T, H, D, timer)
        calls: dict[str, Callable[[], Any]] = {
            name: (lambda m=m: m.item_block_attention(*bench.xs, bench.lengths, T, config=m.ItemBlockConfig.tuned(D)))
            for name, m in olds.items()}
        for name, c in cfgs.items():
            if checks[c]["status"] != "ok":
                print(f"[{H}x{D}] skip {name}: {checks[c]['status']} {checks[c].get('error', checks[c].get('errs'))}")
                res["errors"].append({"shape": f"{H}x{D}", "name": name, **{k: str(v) for k, v in checks[c].items()}})
                continue
            calls[name] = (lambda c=c: item_block_attention(*bench.xs, bench.lengths, T, config=c))
        rows: dict[str, dict[str, list[float]]] = {n: {"fwd": [], "fwd_bwd": []} for n in calls}
        for _ in range(2):
            for name, f in calls.items():
                fb = (lambda f=f: torch.autograd.grad(f(), bench.xs, bench.do))
                r = sw.guard(res["errors"], name, lambda: (timer.graph(f), timer.graph(fb)))
                if r:
                    rows[name]["fwd"].append(r[0])
                    rows[name]["fwd_bwd"].append(r[1])
        best = min((n for n in rows if n in cfgs and rows[n]["fwd_bwd"]), key=lambda n: min(rows[n]["fwd_bwd"]))
        breakdown = {n: sw.guard(res["errors"], f"breakdown {n}", lambda n=n: bench.per_kernel(cfgs[n]))
                     for n in dict.fromkeys(["tuned", best])}
        res["shapes"][f"{H}x{D}"] = {"rows": rows, "best": best, "breakdown": breakdown, "fwd_flops": bench.fwd_flops,
                                     "checks": {n: checks[c]["status"] for n, c in cfgs.items()}}
        first = next(iter(rows))
        base = min(rows[first]["fwd_bwd"])
        print(f"\n[{H} heads x {D}] GPU time (CUDA graph), ms, two rounds; ratio = {first} fwd+bwd / this fwd+bwd")
        print(f"{'configuration':30s} {'fwd':>15s} {'fwd+bwd':>15s} {'TFLOP/s':>8s} {'ratio':>6s}")
        for n, r in rows.items():
            if r["fwd_bwd"]:
                fb = min(r["fwd_bwd"])
                print(f"{n:30s} {' / '.join(f'{x:.3f}' for x in r['fwd']):>15s} {' / '.join(f'{x:.3f}' for x in r['fwd_bwd']):>15s}"
                      f" {3.5 * bench.fwd_flops / fb / 1e9:8.0f} {base / fb:6.3f}")
        for n, b in breakdown.items():
            print(f"  breakdown {n}: " + ", ".join(f"{k} {v:.3f}" for k, v in (b or {}).items() if v is not None))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    print(f"\nerrors: {len(res['errors'])}")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"wall {time.time() - t0:.0f} s")
    raise SystemExit(rc)
