"""In-process latency of one recommendation, stage by stage (no HTTP): where the time goes.

    python benchmarks/bench_recommend.py WORKDIR [--device cuda] [--history-len 1000] [--beam-width 60]
        [--precisions float32,bf16] [--n 50]

One request at a time (batch 1) through ``Recommender.recommend``: encode -> SID beams -> ANN ->
union -> ranking decode -> top K, on histories of exactly ``--history-len`` real items. Prints the
median of each stage and p50/p99 of the total per precision; JSON to $OUT/bench_recommend.json.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch

from genrec.infer.recommender import Recommender
from genrec.serve.loadgen import sample_histories


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
    ap.add_argument("--profile", type=int, default=0, help="then profile N more requests per precision (top ops)")
    a = ap.parse_args()
    hist = sample_histories(a.workdir, a.n + a.warmup + a.profile, a.history_len, exact=True)
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
        if a.profile:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
            with profile(activities=acts) as prof:
                for h in hist[a.n + a.warmup:]:
                    rec.recommend([{"item_id": x} for x in h], k=a.k, beam_width=a.beam_width, rank=True)
            for key in ("self_cpu_time_total",) + (("self_cuda_time_total",) if a.device == "cuda" else ()):
                print(f"== profile {prec}, {a.profile} requests, by {key}")
                print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70))
        del rec
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_recommend.json"), "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
