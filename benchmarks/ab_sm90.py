"""A/B of two versions of the Gluon item-block kernels in one process (GPU only, an H100/H200).

Usage:
    python benchmarks/ab_sm90.py OLD_item_block_sm90.py [--rounds 7] [--iters 20] [--head-dim 128]
        [--new-set KNOB=a,b,c,d[,e] ...]    (the same module on both sides: `src/.../item_block_sm90.py`)

Loads this checkout's ``genrec.kernels.item_block_sm90`` and another copy of the module (e.g. the last
commit's: ``git show HEAD:src/genrec/kernels/item_block_sm90.py > /tmp/old.py``) side by side, runs
each kernel (forward, dq, dense dk/dv) of both on the same inputs (B 8 x 1,024 items x 5 tokens, the
tiles of ``ItemBlockConfig.tuned``), checks that the two write the same outputs, then times them from
CUDA graphs in alternation, old and new ``--rounds`` times each, and prints the median GPU time of
each and the ratio. ``--new-set`` gives the new side other tiles (e.g. registers for the loop
operands) than ``tuned``; outputs are then compared within bf16 tolerance instead of bit for bit. Timing both in alternation in one process removes most of the drift between
separate runs (which was +-10% per kernel on the H200).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.kernels import _time_graph  # noqa: E402
from genrec.kernels import item_block as ib  # noqa: E402
from genrec.kernels import item_block_sm90 as new  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig  # noqa: E402

T = 5


def load(path: str):
    spec = importlib.util.spec_from_file_location("item_block_sm90_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_STRIP: dict = {"on": False, "deleted": {}}


def _strip_loop_barriers(ptx: str, name: str) -> str:
    """Delete ``bar.sync 0;`` inside the kernel's main loops (backward branches over more than 150 PTX
    lines), counting them in ``_STRIP["deleted"]``."""
    import re

    lines = ptx.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\$L__BB\d+_\d+):", ln))}
    drop: set[int] = set()
    for i, ln in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);", ln)
        if m and m.group(1) in labels and i - labels[m.group(1)] > 150:
            drop |= {k for k in range(labels[m.group(1)], i) if re.match(r"^\s*bar\.sync\s+0;", lines[k])}
    _STRIP["deleted"][name] = len(drop)
    return "\n".join(ln for k, ln in enumerate(lines) if k not in drop) + "\n"


def _install_barrier_strip(names: set[str]) -> None:
    from triton import knobs

    def hook(backend, stages, options, language, capability):
        make_ptx = stages["ptx"]

        def ptx(src, metadata):
            out = make_ptx(src, metadata)
            hit = [n for n in names if f".entry {n}(" in out]
            return _strip_loop_barriers(out, hit[0]) if _STRIP["on"] and hit else out
        stages["ptx"] = ptx

    knobs.runtime.add_stages_inspection_hook = hook


def with_tiles(cfg: ItemBlockConfig, sets: list[str]) -> ItemBlockConfig:
    """``cfg`` with the Gluon tiles given as ``KNOB=a,b,c,d[,e]`` strings (e.g. ``sm90_fwd=64,64,4,2``)."""
    return cfg.replace(**{kv.split("=")[0]: tuple(int(x) for x in kv.split("=")[1].split(",")) for kv in sets})


def make_inputs(D: int, full: bool, B: int = 8, n: int = 1024, seed: int = 0) -> dict:
    """The benchmark's inputs (bf16, B x H x n*T x D, H = 8 at head dim 128 else 12; lengths drawn from
    n/2..n, the first full, or all full), and the forward's out / lse that the backward kernels read."""
    H = 8 if D == 128 else 12
    S = n * T
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    lengths = torch.randint(n // 2, n + 1, (B,), device="cuda", dtype=torch.int32, generator=g)
    lengths[0] = n
    if full:
        lengths.fill_(n)
    cfg = ItemBlockConfig.tuned(D)
    out, lse = ib.item_block_attention_fwd(q, k, v, lengths, T, config=cfg.replace(sm90_fwd=None))
    return {"q": q, "k": k, "v": v, "do": do, "lengths": lengths, "out": out, "lse": lse, "scale": 1 / math.sqrt(D)}


def bufs(x: dict) -> dict:
    q = x["q"]
    B, H, S, _ = q.shape
    return {"out": torch.zeros_like(q), "lse": torch.zeros(B, H, S, device="cuda"),
            "delta": torch.zeros(B, H, S, device="cuda"),
            "dq": torch.zeros_like(q), "dk": torch.zeros_like(q), "dv": torch.zeros_like(q)}


def kernels(mod, x: dict, o: dict, cfg: ItemBlockConfig) -> dict:
    """The three Gluon kernels of module ``mod`` as closures over inputs ``x``, writing into ``o``."""
    q, k, v, do, lengths, out, lse, scale = (x[key] for key in ("q", "k", "v", "do", "lengths", "out", "lse", "scale"))
    fw, dqc, kvc = (ib._sm90_tiles(t) for t in (cfg.sm90_fwd, cfg.sm90_dq, cfg.sm90_dense_kv))

    def fwd():
        mod.launch_fwd_sm90(q, k, v, lengths, o["out"], o["lse"], T, scale, block_m=fw[0], block_n=fw[1],
                            num_warps=fw[2], stages=fw[3], a_regs=fw[4], lpt=cfg.lpt)

    def dq():
        mod.launch_dq_sm90(q, k, v, out, do, lse, o["delta"], o["dq"], o["dk"], o["dv"], lengths, T, scale,
                           block_m=dqc[0], block_n=dqc[1], num_warps=dqc[2], stages=dqc[3], a_regs=dqc[4],
                           lpt=bool(cfg.dq_lpt if cfg.dq_lpt is not None else cfg.lpt))

    def dkv():
        mod.launch_dense_kv_sm90(q, k, v, do, lse, o["delta"], o["dk"], o["dv"], lengths, T, scale,
                                 block_i=kvc[0], block_q=kvc[1], num_warps=kvc[2], stages=kvc[3], a_regs=kvc[4],
                                 lpt=bool(cfg.kv_lpt if cfg.kv_lpt is not None else cfg.lpt))
    return {"forward": fwd, "dq": dq, "dense dk/dv": dkv}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--new-set", action="append", default=[], metavar="KNOB=a,b,c,d[,e]")
    ap.add_argument("--old-set", action="append", default=[], metavar="KNOB=a,b,c,d[,e]",
                    help="the same for the old side")
    ap.add_argument("--full", action="store_true", help="every row 1,024 items long (the table's shape), "
                    "not lengths drawn from 512..1,024")
    ap.add_argument("--strip-loop-barriers", default="", metavar="KERNELS",
                    help="an experiment: compile the new side's kernels named here (comma-separated: fwd, dq, "
                         "dense_kv) with every CTA barrier (bar.sync 0) inside their main loops deleted from the "
                         "PTX; run with TRITON_ALWAYS_COMPILE=1 (the on-disk cache would hand back the other "
                         "side's binary) and OLD = this checkout's module")
    a = ap.parse_args()
    strip = {f"_sm90_{x}_kernel" for x in a.strip_loop_barriers.split(",") if x}
    if strip:
        _install_barrier_strip(strip)
    old = load(a.old)
    D = a.head_dim
    H = 8 if D == 128 else 12
    B, n = 8, 1024
    cfg = with_tiles(ItemBlockConfig.tuned(D), a.old_set)
    cfg_new = with_tiles(ItemBlockConfig.tuned(D), a.new_set)
    x = make_inputs(D, a.full)
    bo, bn = bufs(x), bufs(x)
    ko, kn = kernels(old, x, bo, cfg), kernels(new, x, bn, cfg_new)
    for name in ko:  # (first calls compile: the old side's without the barrier strip, if any)
        ko[name]()
    torch.cuda.synchronize()
    _STRIP["on"] = bool(strip)
    for name in kn:
        kn[name]()
    torch.cuda.synchronize()
    _STRIP["on"] = False
    if strip:
        print(f"barriers deleted from main loops: {_STRIP['deleted']}", flush=True)
        for _ in range(4):  # races would show as outputs that change from run to run
            for name in ko:
                ko[name]()
                kn[name]()
            torch.cuda.synchronize()
            for key in bo:
                if not torch.equal(bo[key], bn[key]):
                    print(f"check {key}: DIFFERS on a repeated run", flush=True)
    ok = True
    for key in bo:
        same = torch.equal(bo[key], bn[key])
        diff = float((bo[key].float() - bn[key].float()).abs().max())
        print(f"check {key:5s}: {'identical' if same else f'max |old - new| {diff:.3g}'}", flush=True)
        ok &= diff < 1e-2 * max(float(bo[key].float().abs().max()), 1.0)
    times = {name: {"old": [], "new": []} for name in ko}
    for _ in range(a.rounds):
        for name in ko:
            times[name]["old"].append(_time_graph(ko[name], a.warmup, a.iters))
            times[name]["new"].append(_time_graph(kn[name], a.warmup, a.iters))
    print(f"\nold: {cfg.sm90_fwd} {cfg.sm90_dq} {cfg.sm90_dense_kv}; new: {cfg_new.sm90_fwd} {cfg_new.sm90_dq} "
          f"{cfg_new.sm90_dense_kv}")
    print(f"Gluon kernels, {H} x {D}, B {B} x {n} items (lengths {n if a.full else f'{n // 2}..{n}'}), median of {a.rounds} alternated "
          "graph timings")
    print(f"{'kernel':12s} {'old ms':>8s} {'new ms':>8s} {'new/old':>8s}  {'old range':>17s} {'new range':>17s}")
    tot = {"old": 0.0, "new": 0.0}
    for name, t in times.items():
        mo, mn = statistics.median(t["old"]), statistics.median(t["new"])
        tot["old"] += mo
        tot["new"] += mn
        print(f"{name:12s} {mo:8.4f} {mn:8.4f} {mn / mo:8.3f}  {min(t['old']):.4f}-{max(t['old']):.4f} "
              f"{min(t['new']):.4f}-{max(t['new']):.4f}")
    print(f"{'sum':12s} {tot['old']:8.4f} {tot['new']:8.4f} {tot['new'] / tot['old']:8.3f}")
    print("outputs agree" if ok else "OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
