"""Serving latency/QPS on loopback: one-process vs two-process mode (and ranking on/off), side by side.

    python benchmarks/bench_serve.py WORKDIR --duration 60 --concurrency 8 [--modes one,two,twocpu,norank,batch8,batch8busy,batch8timed]

Each mode starts its own ``genrec serve`` child on a free 127.0.0.1 port, drives ``POST
/v1/recommend`` with ``--concurrency`` closed-loop clients (``--client raw``, the default: one lean
HTTP/1.1 keep-alive connection each; ``--client httpx``: an httpx.AsyncClient) for ``--duration`` seconds
(histories of ``--history-len`` items sampled from the run's events), and stops it. Prints one
table row per mode (p50/p90/p99 latency, QPS, errors, degraded); full numbers go to
$OUT/bench_serve.json when OUT is set. The issue's GPU target (1,000-item history, beam 60,
ranking on) is ``--history-len 1000 --beam-width 60`` on a run trained with a long context.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

from genrec.serve.loadgen import bench_serve

MODES = {
    "one": dict(two_process=False, rank=True),
    "two": dict(two_process=True, rank=True),  # the KV pool on the server's device (GPU: CUDA IPC)
    "twocpu": dict(two_process=True, rank=True, kv_pool_device="cpu"),  # the KV pool in CPU shared memory
    "norank": dict(two_process=False, rank=False),
    "batch8": dict(two_process=False, rank=True, micro_batch=8),  # the server's default policy (timed)
    "batch8busy": dict(two_process=False, rank=True, micro_batch=8, micro_batch_policy="busy"),
    "batch8timed": dict(two_process=False, rank=True, micro_batch=8, micro_batch_policy="timed",
                        micro_batch_wait_ms=2.0),  # the earlier policy: a group's first request waits 2 ms
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workdir")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--history-len", type=int, default=50)
    ap.add_argument("--beam-width", type=int, default=20)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--modes", default="one,two")
    ap.add_argument("--device", default="cpu", help="the server's device (cpu, cuda)")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="load-generator client (raw: pre-encoded bytes on asyncio streams; httpx: AsyncClient)")
    ap.add_argument("--exact-history", action="store_true",
                    help="every history exactly --history-len items (short users extended with others')")
    a = ap.parse_args()
    rows = {}
    for m in a.modes.split(","):
        if m not in MODES:
            raise SystemExit(f"--modes: unknown mode {m!r}; choose from {sorted(MODES)}")
        res = bench_serve(a.workdir, duration=a.duration, concurrency=a.concurrency, history_len=a.history_len,
                          beam_width=a.beam_width, k=a.k, device=a.device,
                          exact_history=a.exact_history, client=a.client, **MODES[m])
        rows[m] = res.summary()
        print(f"[{m}]\n{res.table()}\n", flush=True)
    out = {"machine": platform.platform(), "cpus": os.cpu_count(), "args": vars(a), "results": rows}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_serve.json"), "w") as f:
            json.dump(out, f, indent=2)
    keys = ["requests", "errors", "degraded", "qps", "p50_ms", "p90_ms", "p99_ms"]
    print("| mode | " + " | ".join(keys) + " |")
    print("|---|" + "|".join("---" for _ in keys) + "|")
    for m, s in rows.items():
        print(f"| {m} | " + " | ".join(str(s[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
