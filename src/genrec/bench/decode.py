# mypy: ignore-errors
# (benchmark scripts: loosely typed config dicts and closures; checked by running them, see tests/kernels/test_bench_cpu.py)
"""Serving-side speed, side by side in one process: SID beam decoding (cascade attention over the
shared history vs. the cache copied per beam), the trie on the GPU vs. on the CPU, and ranking as
a decode step over the cached history vs. a full prefill of history + candidates.

    python benchmarks/bench_decode.py [--only beam,sid,trie,rank] [--tiny]   # or, after the kernels:
    genrec bench kernels

Random weights (timings do not depend on them) in the ``pinger-paper`` shape (d 768, 4 layers,
12 heads of 64; the ranking rows at 12 layers, the issue's shape, unless ``--rank-layers``), bf16
autocast on CUDA. Each fast path is checked against its reference on the
same inputs before it is timed. Prints tables; JSON to $OUT/bench_decode.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from genrec.bench.kernels import _time_graph
from genrec.bench.timing import capture
from genrec.decode.beam import beam_search
from genrec.decode.graphs import GraphedBeamSearch
from genrec.decode.trie_torch import TorchTrie
from genrec.model import GenRecModel, ModelBatch, ModelConfig
from genrec.sid.trie import SidTrie
from genrec.validation import trusted_inputs

RESULTS: dict[str, Any] = {"beam": [], "sid": [], "trie": [], "rank": [], "checks": {}}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _time(fn: Callable[[], Any], dev: torch.device, warmup: int, iters: int) -> float:
    """Median milliseconds per call."""
    for _ in range(warmup):
        fn()
    _sync(dev)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


def _model(dev: torch.device, tiny: bool, levels: int, K: int, max_items: int = 1100,  # type: ignore[no-untyped-def]
           layers: int | None = None):
    torch.manual_seed(0)
    depth = {} if layers is None else {"n_layers": layers}
    if tiny:
        cfg = ModelConfig.from_name("tiny", sid_levels=levels, sid_codebook_sizes=[K] * levels, max_items=max_items,
                                    **depth)
    else:
        cfg = ModelConfig.from_name("pinger-paper", sid_levels=levels, sid_codebook_sizes=[K] * levels,
                                    item_feat_dim=64, n_actions=4, n_surfaces=2, dropout=0.0, max_items=max_items,
                                    **depth)
    return GenRecModel(cfg).to(dev).eval()


def _batch(cfg, B: int, n: int, dev: torch.device):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    return ModelBatch(
        actions=torch.randint(0, cfg.n_actions, (B, n), generator=g).to(dev),
        surfaces=torch.randint(0, cfg.n_surfaces, (B, n), generator=g).to(dev),
        lengths=torch.full((B,), n, dtype=torch.int64).to(dev),
        sid_codes=torch.stack([torch.randint(0, k, (B, n), generator=g) for k in cfg.sid_codebook_sizes], -1).to(dev),
        item_vecs=F.normalize(torch.randn(B, n, cfg.item_dim, generator=g), dim=-1).to(dev),
    )


def _autocast(dev: torch.device):  # type: ignore[no-untyped-def]
    return torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)


def _random_trie(n_items: int, levels: int, K: int, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    codes = np.unique(rng.integers(0, K, (int(n_items * 1.1), levels)), axis=0)[:n_items]
    return SidTrie.build(codes, np.arange(len(codes)), [K] * levels)


@torch.no_grad()
def bench_beams(dev: torch.device, B: int, n: int, widths: list[int], levels: int, K: int, tiny: bool,
                warmup: int, iters: int) -> None:
    """Full constrained beam search (every level) over a cached history: shared (cascade) vs copied."""
    model = _model(dev, tiny, levels, K)
    cfg = model.config
    st = _random_trie(20_000 if tiny else 1_000_000, levels, K)
    trie = TorchTrie.from_sid_trie(st, device=dev)
    with _autocast(dev):
        cache, _, _ = model.encode_history(_batch(cfg, B, n, dev))

    def search(W: int) -> Any:
        def step(prefix: torch.Tensor) -> torch.Tensor:
            with _autocast(dev):
                return F.log_softmax(model.sid_logits_next(cache, prefix).float(), dim=-1)
        return beam_search(step, B, levels, [K] * levels, W, trie=trie, device=dev)

    kv_bytes_per_beam_copy = sum(t.numel() * t.element_size() for t in cache.k + cache.v)  # the whole history KV
    for W in widths:
        row: dict[str, Any] = {"B": B, "hist": n, "W": W, "levels": levels, "K": K}
        model.shared_beam_decode = False
        ref = search(W)
        model.shared_beam_decode = True
        got = search(W)
        same = float((got.codes == ref.codes).all(-1).float().mean())
        row["same_beams_share"] = same  # bf16: near-ties may swap; fp32 equality is in the tests
        row["copied_ms"] = _time(lambda: (setattr(model, "shared_beam_decode", False), search(W)), dev, warmup, iters)
        row["shared_ms"] = _time(lambda: (setattr(model, "shared_beam_decode", True), search(W)), dev, warmup, iters)
        row["speedup"] = row["copied_ms"] / row["shared_ms"]
        row["kv_copy_MiB_per_step"] = kv_bytes_per_beam_copy * W / 2**20  # what the copied path materialises
        row["kv_shared_MiB"] = kv_bytes_per_beam_copy / 2**20
        if dev.type == "cuda":  # measured: the search's peak memory above what was allocated before it
            for side, shared in (("shared", True), ("copied", False)):
                model.shared_beam_decode = shared
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                search(W)
                torch.cuda.synchronize()
                row[f"peak_{side}_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        RESULTS["beam"].append(row)
        peak = (f"  peak memory shared {row['peak_shared_MiB']:.0f} MiB vs copied {row['peak_copied_MiB']:.0f} MiB"
                if "peak_shared_MiB" in row else "")
        print(f"  beams W={W:4d}: shared {row['shared_ms']:.2f} ms  copied {row['copied_ms']:.2f} ms  "
              f"x{row['speedup']:.2f}  same beams {same:.3f}  KV copied/step {row['kv_copy_MiB_per_step']:.0f} MiB"
              + peak, flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


@torch.no_grad()
def bench_sid_decode(dev: torch.device, B: int, n: int, W: int, lam: float, levels: int, K: int, n_items: int,
                     tiny: bool, warmup: int, iters: int) -> None:
    """The whole SID decode (every level, trie constraints and the diversity penalty on) over a
    cached history: eager with the per-pick torch selection loop, eager with the selection kernel,
    and the CUDA-graph replay (GraphedBeamSearch) -- checked equal to the eager search first."""
    model = _model(dev, tiny, levels, K, max_items=max(1100, n + 1))
    cfg = model.config
    st = _random_trie(n_items, levels, K)
    trie = TorchTrie.from_sid_trie(st, device=dev)
    with _autocast(dev):
        cache, _, _ = model.encode_history(_batch(cfg, B, n, dev))
        ctx = model.beam_context(cache)
    assert ctx is not None, "the shared-prefix plan must hold for the PinGER layout"

    def eager() -> Any:
        def step(prefix: torch.Tensor) -> torch.Tensor:
            return F.log_softmax(model.sid_logits_ctx(ctx, prefix).float(), dim=-1)

        with _autocast(dev):
            return beam_search(step, B, levels, [K] * levels, W, diversity_lambda=lam, trie=trie, device=dev)

    def eager_torch_select() -> Any:
        os.environ["GENREC_BEAM_SELECT"] = "torch"
        try:
            return eager()
        finally:
            del os.environ["GENREC_BEAM_SELECT"]

    row: dict[str, Any] = {"B": B, "hist": n, "W": W, "lambda": lam, "levels": levels, "K": K, "items": n_items}
    ref = eager()
    if dev.type == "cuda":
        graphed = GraphedBeamSearch(model, trie)

        def run_graph() -> Any:
            with _autocast(dev):
                return graphed(ctx, W, diversity_lambda=lam)

        got = run_graph()
        row["graph_same_beams"] = float((got.codes == ref.codes).all(-1).float().mean())
        row["graph_valid_share"] = float(got.valid.float().mean())
        row["graph_ms"] = _time(run_graph, dev, warmup, iters)
    row["eager_kernel_select_ms"] = _time(eager, dev, warmup, iters)
    row["eager_torch_select_ms"] = _time(eager_torch_select, dev, max(1, warmup // 2), max(2, iters // 3))
    RESULTS["sid"].append(row)
    RESULTS["checks"][f"graphed SID decode W={W} same beams as eager"] = row.get("graph_same_beams")
    print(f"  SID decode B={B} hist={n} W={W} lambda={lam}: graph {row.get('graph_ms', float('nan')):.2f} ms  "
          f"eager+kernel select {row['eager_kernel_select_ms']:.2f} ms  eager+torch select "
          f"{row['eager_torch_select_ms']:.2f} ms  same beams {row.get('graph_same_beams')}", flush=True)
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def bench_trie(dev: torch.device, n_items: int, levels: int, K: int, beams: list[int], warmup: int, iters: int) -> None:
    """One constrained step = valid-code mask for every beam's node + advance, GPU vs CPU trie."""
    st = _random_trie(n_items, levels, K)
    gpu = TorchTrie.from_sid_trie(st, device=dev)
    rng = np.random.default_rng(2)
    for nb in beams:
        for depth in range(1, levels):
            nodes = rng.integers(0, st.nodes_per_depth[depth], nb)
            nd = torch.as_tensor(nodes, device=dev)
            want = st.valid_mask(depth, nodes)
            got = gpu.valid_mask(depth, nd).cpu().numpy()
            ok = bool(np.array_equal(want, got))
            RESULTS["checks"][f"trie depth {depth} beams {nb}"] = ok
            codes_t = torch.as_tensor(rng.integers(0, K, nb), device=dev)

            def gpu_step() -> Any:  # the fast path (one Triton launch per query on CUDA)
                m = gpu.valid_mask(depth, nd)
                return m, gpu.advance(depth, nd, codes_t)

            def torch_step() -> Any:  # the same step in plain torch ops (the reference)
                m = gpu.valid_mask_reference(depth, nd)
                return m, gpu.advance_reference(depth, nd, codes_t)

            def cpu_step() -> Any:
                return st.valid_mask(depth, nodes), st.child(depth, nodes, codes_t.cpu().numpy())

            fm, fa = gpu_step()
            tm, ta = torch_step()
            same = bool(torch.equal(fm, tm) and torch.equal(fa, ta))
            RESULTS["checks"][f"trie fast step == torch step, depth {depth} beams {nb}"] = same
            row = {"beams": nb, "depth": depth, "dense_table": gpu.is_dense(depth), "items": n_items,
                   "gpu_ms": _time(gpu_step, dev, warmup, iters), "gpu_torch_ops_ms": _time(torch_step, dev, warmup, iters),
                   "cpu_ms": _time(cpu_step, torch.device("cpu"), warmup, iters), "match": ok and same}
            row["speedup"] = row["cpu_ms"] / row["gpu_ms"]
            if dev.type == "cuda":  # GPU time per step, as the captured SID decode runs it (no host launch cost)
                try:
                    row["gpu_graph_ms"] = _time_graph(gpu_step, warmup, iters)
                except Exception as e:  # noqa: BLE001 - report, do not hide: a sync in the step breaks capture
                    row["gpu_graph_error"] = f"{type(e).__name__}: {e}"[:300]
            RESULTS["trie"].append(row)
            graphed = row.get("gpu_graph_ms", row.get("gpu_graph_error"))
            print(f"  trie beams={nb:4d} depth={depth} dense={row['dense_table']}: gpu {row['gpu_ms']:.3f} ms  "
                  f"(graph-replayed {graphed if not isinstance(graphed, float) else f'{graphed:.4f} ms'})  "
                  f"gpu torch ops {row['gpu_torch_ops_ms']:.3f} ms  cpu {row['cpu_ms']:.3f} ms  match={ok and same}",
                  flush=True)


def _graphed(fn: Callable[[], Any]) -> tuple[Callable[[], Any], Any]:
    """``fn`` under bf16 autocast captured as one CUDA graph (``genrec.bench.timing.capture``: value
    checks off, warmed up on a side stream): (replay, static output)."""
    outs: list[Any] = []

    def call() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            outs.append(fn())
    graph = capture(call, 1)
    graph.replay()
    return graph.replay, outs[-1]


def _fp8_backend() -> str:
    """Transformer Engine's version where it imports (the issue's fp8 route), else why not."""
    try:
        import transformer_engine  # type: ignore[import-not-found]
    except Exception as e:  # noqa: BLE001 - absent or broken: either way no fp8 row
        return f"absent ({type(e).__name__})"
    return str(getattr(transformer_engine, "__version__", "present"))


@torch.no_grad()
def bench_rank(dev: torch.device, B: int, n: int, k: int, tiny: bool, warmup: int, iters: int,
               layers: int | None = None, compile_levers: bool = True) -> None:
    """Whole forwards: rank k candidates over the cached history (decode) vs a full prefill of
    history + candidates (M-FALCON mask), and encode + decode (no cache reuse); then the levers one
    at a time: float32 vs bf16, each side as one CUDA graph, the decode under torch.compile (with and
    without CUDA graphs). ``layers`` overrides the model's depth (the issue's shape has 12)."""
    model = _model(dev, tiny, 4, 256 if not tiny else 8, layers=layers)
    cfg = model.config
    batch = _batch(cfg, B, n, dev)
    g = torch.Generator().manual_seed(3)
    cv = F.normalize(torch.randn(B, k, cfg.item_dim, generator=g), dim=-1).to(dev)
    cs = torch.stack([torch.randint(0, s, (B, k), generator=g) for s in cfg.sid_codebook_sizes], -1).to(dev)
    surf = torch.zeros(B, dtype=torch.int64, device=dev)

    full = replace(batch, cand_vecs=cv, cand_sid_codes=cs, cand_surface=surf)
    with _autocast(dev):
        cache, _, _ = model.encode_history(batch)
        dec = model.rank(cache, cv, cs, surf).float()
        pre = model(full, serving_layout=True).cand_action_logits.float()
    err = float((dec - pre).abs().max())
    RESULTS["checks"]["rank decode vs prefill max abs diff (bf16)"] = err

    def decode() -> Any:
        return model.rank(cache, cv, cs, surf)

    def prefill() -> Any:
        return model(full, serving_layout=True).cand_action_logits

    def run_decode() -> Any:
        with _autocast(dev):
            return decode()

    def run_prefill() -> Any:
        with _autocast(dev):
            return prefill()

    def run_encode_decode() -> Any:
        with _autocast(dev):
            c, _, _ = model.encode_history(batch)
            return model.rank(c, cv, cs, surf)

    row = {"B": B, "hist": n, "k": k, "layers": cfg.n_layers, "max_abs_diff": err,
           "decode_ms": _time(run_decode, dev, warmup, iters), "prefill_ms": _time(run_prefill, dev, warmup, iters),
           "encode_plus_decode_ms": _time(run_encode_decode, dev, warmup, iters)}
    row["speedup_decode_vs_prefill"] = row["prefill_ms"] / row["decode_ms"]
    row["decode_path"] = "cascade" if model._candidate_plan(cache) is not None else "masked"
    if row["decode_path"] == "cascade":  # the same decode with the cascade ruled out: the masked attention
        cache.plans["cand_ok"] = False
        row["decode_masked_ms"] = _time(run_decode, dev, warmup, iters)
        if dev.type == "cuda":
            try:
                replay, out = _graphed(decode)
                row["decode_masked_graph_max_abs_diff"] = float((out.float() - dec).abs().max())
                row["decode_masked_graph_ms"] = _time(replay, dev, warmup, iters)
            except Exception as e:  # noqa: BLE001 - report, do not hide
                row["decode_masked_graph_error"] = f"{type(e).__name__}: {e}"[:300]
        cache.plans["cand_ok"] = True
    row["decode_fp32_ms"] = _time(decode, dev, warmup, iters)
    row["prefill_fp32_ms"] = _time(prefill, dev, warmup, iters)
    row["fp8"] = _fp8_backend()
    if dev.type == "cuda":
        for name, fn in (("decode", decode), ("prefill", prefill)):
            try:
                replay, out = _graphed(fn)
                row[f"{name}_graph_max_abs_diff"] = float((out.float() - (dec if name == "decode" else pre)).abs().max())
                row[f"{name}_graph_ms"] = _time(replay, dev, warmup, iters)
            except Exception as e:  # noqa: BLE001 - report, do not hide: a sync inside breaks capture
                row[f"{name}_graph_error"] = f"{type(e).__name__}: {e}"[:300]
        if "decode_graph_ms" in row:
            row["speedup_graph_vs_prefill"] = row["prefill_ms"] / row["decode_graph_ms"]
        if compile_levers:
            for mode in ("default", "reduce-overhead"):
                key = "decode_compiled" if mode == "default" else "decode_compiled_graph"
                try:
                    torch._dynamo.reset()
                    fn = torch.compile(model.rank, mode=mode, dynamic=False)

                    def run_compiled(fn: Any = fn) -> Any:
                        with torch.autocast("cuda", dtype=torch.bfloat16), trusted_inputs():
                            return fn(cache, cv, cs, surf)
                    t0 = time.perf_counter()
                    for _ in range(3):  # compile, then (reduce-overhead) record and replay the graph
                        out = run_compiled()
                    _sync(dev)
                    row[f"{key}_compile_s"] = time.perf_counter() - t0
                    row[f"{key}_max_abs_diff"] = float((out.float() - dec).abs().max())
                    row[f"{key}_ms"] = _time(run_compiled, dev, warmup, iters)
                except Exception as e:  # noqa: BLE001 - report, do not hide
                    row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
            torch._dynamo.reset()
    RESULTS["rank"].append(row)
    print(f"  rank B={B} n={n} k={k} layers={cfg.n_layers}: decode {row['decode_ms']:.2f} ms  full prefill "
          f"{row['prefill_ms']:.2f} ms (x{row['speedup_decode_vs_prefill']:.2f}); encode+decode "
          f"{row['encode_plus_decode_ms']:.2f} ms; max|diff| {err:.1e}; fp32 decode {row['decode_fp32_ms']:.2f} ms, "
          f"prefill {row['prefill_fp32_ms']:.2f} ms; fp8: {row['fp8']}", flush=True)
    levers = [(lab, row.get(f"{key}_ms"), row.get(f"{key}_error")) for lab, key in (
        ("prefill, float32", "prefill_fp32"), ("prefill, bf16", "prefill"), ("prefill, bf16, CUDA graph", "prefill_graph"),
        ("decode, float32", "decode_fp32"), ("decode, bf16, masked attention", "decode_masked"),
        ("decode, bf16, masked attention, CUDA graph", "decode_masked_graph"),
        ("decode, bf16", "decode"), ("decode, bf16, CUDA graph", "decode_graph"),
        ("decode, bf16, torch.compile", "decode_compiled"),
        ("decode, bf16, torch.compile + CUDA graphs", "decode_compiled_graph"))]
    print(f"  decode attention: {row['decode_path']} (the rows without 'masked')")
    print(f"  {'ranking forward':44s} {'ms':>8s} {'vs bf16 prefill':>16s}")
    for lab, ms, e in levers:
        if ms is not None:
            print(f"  {lab:44s} {ms:8.2f} {row['prefill_ms'] / ms:15.2f}x")
        elif e is not None:
            print(f"  {lab:44s}  failed: {e[:80]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke run)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="beam,sid,trie,rank")
    ap.add_argument("--rank-layers", type=int, default=12,
                    help="the ranking forwards' depth (the issue's shape: 12 layers; the other rows keep pinger-paper's 4)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows of the ranking levers")
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    RESULTS["device"] = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    RESULTS["torch"] = torch.__version__
    only = set(a.only.split(","))
    t0 = time.time()
    if "beam" in only:
        print("[beam search over a cached 1,000-item history]", flush=True)
        if a.tiny:
            bench_beams(dev, 2, 40, [4, 16], 3, 8, True, 1, 2)
        else:
            bench_beams(dev, 8, 1000, [10, 30, 60, 100, 400], 4, 256, False, a.warmup, a.iters)  # 30: the memory row
    if "sid" in only:
        print("[whole SID decode, constraints + diversity on: CUDA graph vs eager]", flush=True)
        if a.tiny:
            bench_sid_decode(dev, 2, 40, 12, 0.5, 3, 8, 2000, True, 1, 2)
        else:
            bench_sid_decode(dev, 16, 2048, 200, 0.5, 4, 256, 1_000_000, False, a.warmup, a.iters)
            bench_sid_decode(dev, 1, 1000, 60, 0.0, 4, 256, 1_000_000, False, a.warmup, a.iters)
    if "trie" in only:
        print("[constrained step: trie on the device vs the CPU]", flush=True)
        if a.tiny:
            bench_trie(dev, 5000, 3, 16, [10, 100], 1, 3)
        else:
            bench_trie(dev, 1_000_000, 4, 256, [100, 800], a.warmup, a.iters)
    if "rank" in only:
        print("[ranking: decode over the cache vs full prefill]", flush=True)
        if a.tiny:
            bench_rank(dev, 2, 30, 12, True, 1, 2)
        else:
            bench_rank(dev, 8, 992, 656, False, a.warmup, a.iters, layers=a.rank_layers,
                       compile_levers=not a.no_compile)
    RESULTS["wall_s"] = time.time() - t0
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_decode.json"), "w") as f:
            json.dump(RESULTS, f, indent=2, default=str)
    print(json.dumps(RESULTS["checks"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
