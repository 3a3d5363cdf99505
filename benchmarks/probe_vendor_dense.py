"""Probe (GPU): the fastest vendor attention kernels on PinGER's dense part ALONE, beside genrec's whole item-block
attention, in one process, each as GPU time replayed from a CUDA graph.

The dense part is ~95% of the training attention's work: every token of item i reads the dense tokens of items < i.
Packing each item's T query tokens as T query heads of one KV head (GQA) at position i - 1 turns it into ONE plain
causal attention over n - 1 positions, which every vendor kernel runs natively (the seventh session's
``probe_dense_flash.py``). So the time of the best vendor kernel on that piece is a floor for any composition of
vendor kernels -- the in-item part, the log-sum-exp merge and the packing copies come on top -- and a measure of
where genrec's kernel stands against the state of the art on the same GPU at the same moment.

Rows, per shape (B 8, 1,024 items x T 5; 12 heads of 64 and 8 heads of 128; bf16; fwd+bwd):
  * genrec item-block (tuned), the whole attention;
  * SDPA forced to each backend (cuDNN, FlashAttention-2, memory-efficient) on the dense part, K/V expanded to the
    packed query heads, and with ``enable_gqa`` where the backend takes it;
  * FlexAttention on the dense part with its causal block mask (blocks above the diagonal skipped: its best case).

    python benchmarks/probe_vendor_dense.py [--iters 20] [--warmup 5] [--sustain 2]

Prints a table last; with $OUT set writes vendor_dense.json there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--extra", action="store_true", help="also: forward-only rows (genrec, cuDNN) and the TIGER "
                                                           "layout's causal attention on cuDNN and FlashAttention-2")
    ap.add_argument("--sustain", type=float, default=0.0, help="also run the item-block and best vendor rows back "
                                                               "to back this many seconds, with the SM clock")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("probe_vendor_dense: no CUDA device; nothing to measure")
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from genrec.bench import kernels as bk
    from genrec.kernels.item_block import ItemBlockConfig, item_block_attention

    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    B, n, T = 8, 1024, 5
    m = n - 1
    rows: list[dict[str, Any]] = []
    flex = torch.compile(flex_attention, dynamic=False)
    for H, D in ((12, 64), (8, 128)):
        shape = f"{H}x{D}"
        dt = torch.bfloat16
        # genrec: the whole attention (dense + in-item parts), the model's [B, H, S, D] layout
        S = n * T
        xs = [torch.randn(B, H, S, D, device="cuda", dtype=dt).requires_grad_() for _ in range(3)]
        dd = torch.randn(B, H, S, D, device="cuda", dtype=dt)
        lengths = torch.full((B,), n, device="cuda", dtype=torch.int32)
        cfg = ItemBlockConfig.tuned(D)
        whole_pairs = bk._visible_pairs(lengths.cpu(), n, T) * H  # (summed over the batch, per head)

        def genrec_both() -> Any:
            return torch.autograd.grad(item_block_attention(*xs, lengths, T, config=cfg), xs, dd)

        def genrec_fwd() -> Any:
            with torch.no_grad():
                return item_block_attention(*xs, lengths, T, config=cfg)

        # the dense part alone: [B, H*T, m, D] queries over [B, H, m, D] (GQA) or expanded K/V, causal
        qg = torch.randn(B, H * T, m, D, device="cuda", dtype=dt).requires_grad_()
        kd = torch.randn(B, H, m, D, device="cuda", dtype=dt).requires_grad_()
        vd = torch.randn(B, H, m, D, device="cuda", dtype=dt).requires_grad_()
        ke = kd.detach().repeat_interleave(T, dim=1).contiguous().requires_grad_()
        ve = vd.detach().repeat_interleave(T, dim=1).contiguous().requires_grad_()
        dg = torch.randn_like(qg)
        dense_pairs = B * H * T * m * (m + 1) // 2

        def sdpa(backend: Any, gqa: bool) -> Callable[[], Any]:
            k, v = (kd, vd) if gqa else (ke, ve)

            def both() -> Any:
                with sdpa_kernel([backend]):
                    o = F.scaled_dot_product_attention(qg, k, v, is_causal=True, enable_gqa=gqa)
                return torch.autograd.grad(o, (qg, k, v), dg)
            return both

        def sdpa_fwd(backend: Any) -> Callable[[], Any]:
            def fwd() -> Any:
                with torch.no_grad(), sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qg, ke, ve, is_causal=True)
            return fwd

        def tiger(backend: Any) -> Callable[[], Any]:  # the TIGER layout's causal attention over all S tokens
            def both() -> Any:
                with sdpa_kernel([backend]):
                    o = F.scaled_dot_product_attention(*xs, is_causal=True)
                return torch.autograd.grad(o, xs, dd)
            return both

        bm = create_block_mask(lambda b, h, q, kv: kv <= q, None, None, m, m, device="cuda")

        def flex_both() -> Any:
            o = flex(qg, kd, vd, block_mask=bm, enable_gqa=True)
            return torch.autograd.grad(o, (qg, kd, vd), dg)

        cands: list[tuple[str, str, Callable[[], Any], int]] = [("genrec item-block (tuned)", "whole", genrec_both,
                                                                  whole_pairs)]
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash-2", SDPBackend.FLASH_ATTENTION),
                         ("mem-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            cands.append((f"sdpa {name}, K/V expanded", "dense part", sdpa(be, False), dense_pairs))
            cands.append((f"sdpa {name}, enable_gqa", "dense part", sdpa(be, True), dense_pairs))
        cands.append(("flex, causal block mask, gqa", "dense part", flex_both, dense_pairs))
        if a.extra:
            fwd_frac = 1 / 3.5  # the forward's share of fwd+bwd FLOPs (useful TFLOP/s below count fwd+bwd's)
            cands.append(("genrec item-block (tuned), forward only", "whole", genrec_fwd, int(whole_pairs * fwd_frac)))
            cands.append(("sdpa cudnn, K/V expanded, forward only", "dense part", sdpa_fwd(SDPBackend.CUDNN_ATTENTION),
                          int(dense_pairs * fwd_frac)))
            causal = B * H * S * (S + 1) // 2
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash-2", SDPBackend.FLASH_ATTENTION)):
                cands.append((f"sdpa {name} causal, TIGER layout's {S} tokens", "tiger", tiger(be), causal))
        for name, part, fn, pairs in cands:
            label = f"{shape} {name}"
            eager = bk._guard(f"{label} eager", lambda: bk._time(fn, a.warmup, a.iters))
            graph = bk._guard(f"{label} graph", lambda: bk._time_graph(fn, a.warmup, a.iters, reps=5)) \
                if eager is not None else None
            best = graph if graph is not None else eager
            tf = 3.5 * 4 * pairs * D / best / 1e9 if best else None
            row = {"shape": shape, "impl": name, "part": part, "eager_ms": eager, "graph_ms": graph,
                   "useful_tflops": tf, "fn": fn}
            rows.append(row)
            print(f"  {label:52s} {part:10s} eager {eager or float('nan'):7.3f} ms  graph {graph or float('nan'):7.3f}"
                  f" ms  {tf or float('nan'):5.0f} TFLOP/s", flush=True)
        if a.sustain > 0:
            mine = [r for r in rows if r["shape"] == shape]
            vend = [r for r in mine if r["part"] == "dense part" and "forward" not in r["impl"]
                    and (r["graph_ms"] or r["eager_ms"])]
            best_v = min(vend, key=lambda r: r["graph_ms"] or r["eager_ms"]) if vend else None
            for r in (mine[0], best_v):
                if r is None or not (r["graph_ms"] or r["eager_ms"]):
                    continue
                target = bk.capture(r["fn"], 5).replay if r["graph_ms"] else r["fn"]
                res = bk._guard(f"{shape} {r['impl']} sustained",
                                lambda: bk.sustained_ms(target, a.sustain, 5 if r["graph_ms"] else 1))
                if res is not None:
                    r["sustained_ms"], smp = res
                    if smp is not None:
                        r.update(sm_clock_mhz=smp.clock_mhz, power_w=smp.power_w)
                    print(f"  {shape} {r['impl']} sustained {r['sustained_ms']:.3f} ms at "
                          f"{r.get('sm_clock_mhz') or float('nan'):.0f} MHz, {r.get('power_w') or float('nan'):.0f} W",
                          flush=True)
        del xs, dd, qg, kd, vd, ke, ve, dg, cands
        bk._empty_cache()

    print("\nshape | implementation | part | GPU time (graph) ms | eager ms | useful TFLOP/s | this ÷ genrec (fwd+bwd, or fwd)"
          " | sustained ms @ MHz")
    for shape in ("12x64", "8x128"):
        mine = [r for r in rows if r["shape"] == shape]
        refs = {fw: next((r["graph_ms"] for r in mine if r["impl"].startswith("genrec")
                          and ("forward" in r["impl"]) == fw), None) for fw in (False, True)}
        for r in mine:
            t = r["graph_ms"] or r["eager_ms"]
            ref = refs["forward" in r["impl"]]  # a forward row against genrec's forward
            ratio = f"{t / ref:.2f}x" if (t and ref) else "-"
            sus = f"{r['sustained_ms']:.3f} @ {r.get('sm_clock_mhz') or 0:.0f}" if r.get("sustained_ms") else "-"
            print(f"{shape} | {r['impl']} | {r['part']} | {r['graph_ms'] or float('nan'):.3f} | "
                  f"{r['eager_ms'] or float('nan'):.3f} | {r['useful_tflops'] or float('nan'):.0f} | {ratio} | {sus}")
    out = os.environ.get("OUT")
    if out:
        keep = [{k: v for k, v in r.items() if k != "fn"} for r in rows]
        Path(out, "vendor_dense.json").write_text(json.dumps({"rows": keep, "errors": bk.RESULTS["errors"]},
                                                             indent=1))


if __name__ == "__main__":
    main()
