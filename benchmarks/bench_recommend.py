"""In-process latency of one recommendation, stage by stage (no HTTP): where the time goes.

    python benchmarks/bench_recommend.py WORKDIR [--device cuda] [--history-len 1000] [--beam-width 60]
        [--precisions float32,bf16] [--n 50] [--profile [--batch-sizes 1,8,32] [--sync]] [--torch-profile N]

One request at a time (batch 1) through ``Recommender.recommend``: encode -> SID beams -> ANN ->
union -> ranking decode -> top K, on histories of exactly ``--history-len`` real items. Prints the
median of each stage and p50/p99 of the total per precision; JSON to $OUT/bench_recommend.json.

``--profile``: then, per precision and batch size, the serving path's stages (:mod:`genrec.infer.profile`)
for batches of requests that arrive together, as the server runs them: the request bodies validated
from JSON bytes (``http.in``), the engine (``Engine.recommend`` at batch 1, else the micro-batch's
``Engine.recommend_many``: screen, parse, history tensors, encode, SID beams and their rows, ANN, union,
ranking gather / decode / fuse, top K, result objects, answer dicts) and the response models
serialised (``http.out``; the response model's validation and dump, as FastAPI's response_model path
does). Per stage: the median host milliseconds per batch, the device milliseconds between CUDA events
at the stage's ends (GPU only) and host milliseconds per request. ``--sync``: synchronise the device at
every stage boundary (host time = the stage's whole latency); without it host time is what the host
spent, including any wait for the device a stage makes itself.

``--torch-profile N``: torch.profiler over N more requests one at a time per precision (with ``--profile``, also over N
micro-batches of each batch size above 1): the top ops by host and device time, and each timeline in
$OUT/trace_NAME.json.
"""

from __future__ import annotations

import argparse
import json
import os

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from genrec.infer.profile import profiling, stage
from genrec.infer.recommender import Recommender
from genrec.serve.engine import Engine
from genrec.serve.loadgen import history_body, sample_histories
from genrec.serve.schemas import api_models


def stage_profile(a: argparse.Namespace, hist: list[list[int]], prec: str) -> dict[int, dict[str, Any]]:
    """Per batch size: {stage: {host_ms, device_ms, host_ms_per_request}} (medians over ``a.n`` batches)."""
    os.environ["GENREC_PRECISION"] = prec  # Engine.load reads it, as the server's --precision sets it
    eng = Engine.load(a.workdir, None, device=a.device)
    models = api_models(False)
    out: dict[int, dict[str, Any]] = {}
    for b in (int(x) for x in a.batch_sizes.split(",")):
        bodies = [json.dumps({**history_body(hist[i % len(hist)], a.columns), "k": a.k,
                              "beam_width": a.beam_width}).encode() for i in range(b * (a.n + a.warmup))]
        host: dict[str, list[float]] = {}
        dev: dict[str, list[float]] = {}
        depth: dict[str, int] = {}
        for rep in range(a.n + a.warmup):
            with profiling(a.device, sync=a.sync) as prof:
                with stage("request"):
                    with stage("http.in"):
                        reqs = [models.recommend_request.model_validate_json(x) for x in bodies[rep * b:(rep + 1) * b]]
                    r0 = reqs[0]
                    kw: dict[str, Any] = dict(k=r0.k, beam_width=r0.beam_width, diversity_lambda=r0.diversity_lambda,
                                              sources=r0.sources, rank=r0.rank)
                    hs: list[Any] = [r.the_history() for r in reqs]
                    with stage("engine"):
                        res = [eng.recommend(hs[0], **kw)] if b == 1 else eng.recommend_many(hs, **kw)
                    with stage("http.out"):
                        for o in res:
                            models.recommend_response.model_validate(
                                {**o, "degraded": False, "index_version": eng.version}).model_dump_json()
            if rep >= a.warmup:
                depth.update(prof.depth)
                for s_, v in prof.host.items():
                    host.setdefault(s_, []).append(v)
                for s_, v in prof.device().items():
                    dev.setdefault(s_, []).append(v)
        if a.torch_profile and b > 1:  # the micro-batch's kernels: what the device spends a batch on
            _torch_profile(a, f"{prec}_b{b}", lambda: eng.recommend_many([r.the_history() for r in reqs], **kw),
                           a.torch_profile)
        out[b] = {s_: {"host_ms": float(np.median(v)), "device_ms": float(np.median(dev[s_])) if s_ in dev else None,
                       "host_ms_per_request": float(np.median(v)) / b} for s_, v in host.items()}
        print(f"== stages, {prec}, {a.device}, batch {b} ({a.n} batches, median ms; history {a.history_len}, "
              f"beam {a.beam_width}, k {a.k}{', synced' if a.sync else ''})")
        print(f"{'stage':22s} {'host':>9s} {'device':>9s} {'host/req':>9s}")
        for s_, r in out[b].items():
            d = "-" if r["device_ms"] is None else f"{r['device_ms']:.3f}"
            name = "  " * depth[s_] + s_
            print(f"{name:22s} {r['host_ms']:9.3f} {d:>9s} {r['host_ms_per_request']:9.3f}")
        print(flush=True)
    return out


def _torch_profile(a: argparse.Namespace, name: str, run: Callable[[], Any], reps: int = 1) -> None:
    """torch.profiler over ``reps`` calls of ``run``: the top ops by host and device time, and the
    timeline in $OUT/trace_NAME.json (chrome://tracing), to see the gaps between kernels."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            run()
    if os.environ.get("OUT"):
        prof.export_chrome_trace(os.path.join(os.environ["OUT"], f"trace_{name}.json"))
    for key in ("self_cpu_time_total",) + (("self_cuda_time_total",) if a.device == "cuda" else ()):
        print(f"== profile {name}, by {key}")
        print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--history-len", type=int, default=1000)
    ap.add_argument("--beam-width", type=int, default=60)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precisions", default="float32,bf16")
    ap.add_argument("--torch-profile", type=int, default=0,
                    help="then profile N more requests per precision with torch.profiler (top ops; the timeline in "
                         "$OUT/trace_PREC.json)")
    ap.add_argument("--profile", action="store_true", help="then the serving path's stages per batch size")
    ap.add_argument("--batch-sizes", default="1,8,32", help="--profile: requests per batch")
    ap.add_argument("--sync", action="store_true", help="--profile: synchronise the device at every stage boundary")
    ap.add_argument("--columns", action="store_true", help="--profile: the bodies send history_columns")
    a = ap.parse_args()
    hist = sample_histories(a.workdir, a.n + a.warmup + a.torch_profile, a.history_len, exact=True)
    out = {"args": vars(a), "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "rows": {}}
    for prec in a.precisions.split(","):
        rec = Recommender.from_checkpoint(a.workdir, None, device=a.device, precision=prec)
        stages: dict[str, list[float]] = {}
        for i, h in enumerate(hist[: a.n + a.warmup]):
            r = rec.recommend([{"item_id": x} for x in h], k=a.k, beam_width=a.beam_width, rank=True)
            if i >= a.warmup:
                for s, v in r.timings_ms.items():
                    stages.setdefault(s, []).append(v)
        row = {s: float(np.median(v)) for s, v in stages.items()}
        row["p99_total"] = float(np.percentile(stages["total"], 99))
        row["p99_wall"] = float(np.percentile(stages["wall"], 99))  # the whole recommend() call
        out["rows"][prec] = row
        print(f"{prec:8s} " + "  ".join(f"{s} {v:.2f}" for s, v in row.items()) + "  (ms, median)", flush=True)
        if a.torch_profile:
            def one_by_one() -> None:
                for h in hist[a.n + a.warmup:]:
                    rec.recommend([{"item_id": x} for x in h], k=a.k, beam_width=a.beam_width, rank=True)

            _torch_profile(a, prec, one_by_one)
        del rec
        if a.profile:
            out.setdefault("stages", {})[prec] = stage_profile(a, hist, prec)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_recommend.json"), "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
