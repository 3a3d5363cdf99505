"""Serving latency/QPS on loopback: server modes x client counts, side by side, with the client's CPU beside them.

    python benchmarks/bench_serve.py WORKDIR --duration 60 --clients 1,16,64 [--procs 4] [--warmup 3]
        [--modes one,two,twocpu,norank,batch8,batch8busy,batch32,fronts4,...] [--batch-buckets auto|off|1,2,4,8]
        [--precision float32|bf16]

Each mode starts its own ``genrec serve`` child on a free 127.0.0.1 port and, for each client count of
``--clients``, drives ``POST /v1/recommend`` with that many closed-loop clients for ``--duration`` seconds
(histories of ``--history-len`` items sampled from the run's events), then stops it. ``--procs P`` spreads the
clients over up to P client processes (:mod:`genrec.serve.loadtest`; "auto": a quarter of the cores, at most 4),
so the load generator is not the bottleneck: ``client_busy`` is the busiest client process's CPU seconds per
second (near 1.0: that process is saturated, add processes), ``client_cpu`` the client processes' CPU seconds
per second together and ``server_cpu`` the server's (its process and children: the ranking process of
two-process mode, the front processes of ``--fronts``). From the server's /metrics: ``rows_per_batch`` (requests per
micro-batched forward), ``batch_busy`` (batched forwards' wall time, parse and formatting included, per second of the
clients' run: they overlap, so it may pass 1.0), ``device_busy`` (the share of the run a batch held the model: near
1.0 the model's run is the limit; well below, what runs around it), ``batch_wait_ms`` (a request's mean wait in the
micro-batcher for its batch to start) and ``graph_captures`` (CUDA graphs the server captured during the measured run:
shapes met for the first time, each a stall of every batch behind it); ``gc_full`` / ``gc_full_ms`` the engine
process's full GC collections during the run and their summed ms; ``max_ms`` the slowest request. ``--client raw``
(default: one lean HTTP/1.1 keep-alive connection per client, request bytes encoded before the clock) or ``httpx``.
Modes: the table below, and ``batch<N>[busy|timed]`` for any N (the
server's ``--micro-batch N``; timed unless told) and ``fronts<N>[overlap][two][b<M>][l<ms>]`` (as shipped, with
``--fronts N``; ``overlap``: and ``--host-overlap``; ``two``: and ``--two-process``; ``b<M>``: and ``--micro-batch
M``, e.g. ``fronts4b64`` with ``--batch-buckets 1,2,4,8,16,32,64``; ``l<ms>``: and ``--micro-batch-linger-ms``,
e.g. ``fronts4l2``), ``two<S>`` (two-process mode with ``--pool-slots S``, e.g. ``two16``: a batch of 32 ranked
in two calls) and ``[pipeline][hostfunnel|devicefunnel][sw<ms>][tt<N>]`` (as shipped, with ``$GENREC_PIPELINE=1``,
``$GENREC_DEVICE_FUNNEL=off`` (the funnel's lists copied to the host, as before 2026-12-07) or ``=on`` (every batch
on the device, one row too), ``$GENREC_SWITCH_INTERVAL_MS``, ``--torch-threads N``: e.g. ``pipeline``, ``hostfunnel``,
``sw5`` (Python's switch interval), ``tt2``).
``default`` is the server as shipped (micro-batch 32, busy); ``one`` the same without micro-batching.
``--batch-buckets``: the servers' static batch shapes ($GENREC_BATCH_BUCKETS: "auto" pads batches to 1, 2, 4, ... 32
when CUDA graphs replay; "off" to compare). One table row per (mode, clients), ``start_s`` the mode's server start to
ready (load, warm-up, graph captures: what a device call's budget must hold); full numbers to $OUT/bench_serve.json
when OUT is set (rewritten after each row). ``--warmup S``: S seconds of the same load, not counted, before each
measured run (graphs of shapes the server's warm-up did not cover are captured there).
``--gil-profile``: py-spy (``pip install py-spy``; it must be allowed to read the server's memory) samples which
thread of the server's main process holds its interpreter lock during each measured run, and a table gives the
share of the run per stage (:data:`GIL_STAGES`): what the model's own Python costs beside the request plumbing
around it. The issue's GPU target (1,000-item history,
beam 60, ranking on) is ``--history-len 1000 --exact-history --beam-width 60`` on a run trained with a long
context (benchmarks/README.md has the command).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from genrec.bench.timing import machine
from genrec.serve.loadgen import as_sent, sample_histories, start_server
from genrec.serve.loadtest import ClientProcs, drive, split, stop_server

MODES: dict[str, dict[str, Any]] = {
    "default": dict(two_process=False, rank=True),  # `genrec serve` as shipped: micro-batch 32, busy policy (and on
    # a GPU 4 front processes since 2026-12-07: genrec.serve.config.default_fronts)
    "plain": dict(two_process=False, rank=True, fronts=0),  # one process, micro-batch 32, no fronts
    "one": dict(two_process=False, rank=True, micro_batch=1),  # one process, no micro-batching
    "two": dict(two_process=True, rank=True),  # the KV pool on the server's device (GPU: CUDA IPC)
    "twocpu": dict(two_process=True, rank=True, kv_pool_device="cpu"),  # the KV pool in CPU shared memory
    "norank": dict(two_process=False, rank=False),
    "overlap": dict(two_process=False, rank=True, host_overlap=True),  # parse and format beside the batch
    "batch8": dict(two_process=False, rank=True, micro_batch=8, micro_batch_policy="timed"),  # batch<N>: timed
    "batch8busy": dict(two_process=False, rank=True, micro_batch=8, micro_batch_policy="busy"),
    "batch8timed": dict(two_process=False, rank=True, micro_batch=8, micro_batch_policy="timed",
                        micro_batch_wait_ms=2.0),  # the earlier policy: a group's first request waits 2 ms
}
GIL_STAGES = [("model (run_many)", "run_parsed"), ("link: receive, unpickle", "EngineLink._read"),
              ("link: reply", "EngineLink._reply"), ("parse", "Engine.read"), ("answer: lists", "recommendation_lists"),
              ("answer: dicts", "Engine.answer"), ("micro-batcher", "MicroBatcher"), ("service", "Service."),
              ("metrics", "Metrics."), ("thread pool", "concurrent/futures"), ("HTTP (uvicorn, fastapi)", "uvicorn")]
"""``--gil-profile``'s stages: a sample counts for the first whose text is in its stack (outermost frame first)."""
KEYS = ["requests", "errors", "degraded", "qps", "p50_ms", "p90_ms", "p99_ms", "client_cpu_per_s", "client_busy",
        "server_cpu_per_s", "rows_per_batch", "batch_busy", "device_busy", "batch_wait_ms", "graph_captures", "gc_full",
        "gc_full_ms", "max_ms", "start_s"]


def mode(name: str) -> dict[str, Any]:
    """A mode's server settings (``rank``: what the requests ask for)."""
    if name in MODES:
        return dict(MODES[name])
    f = re.fullmatch(r"fronts(\d+)(overlap)?(two)?(?:b(\d+))?(?:l([\d.]+))?", name)
    if f is not None and int(f.group(1)) >= 1:  # as shipped, with N front processes for HTTP (two: two-process mode,
        return dict(two_process=bool(f.group(3)), rank=True, fronts=int(f.group(1)),  # b<M>: micro-batch M,
                    host_overlap=bool(f.group(2)),  # l<ms>: linger, --micro-batch-linger-ms)
                    **({"micro_batch": int(f.group(4))} if f.group(4) else {}),
                    **({"micro_batch_linger_ms": float(f.group(5))} if f.group(5) else {}))
    t = re.fullmatch(r"two(\d+)", name)
    if t is not None and int(t.group(1)) >= 1:  # two<S>: two-process mode with --pool-slots S
        return dict(MODES["two"], pool_slots=int(t.group(1)))
    e = re.fullmatch(r"(pipeline)?(hostfunnel|devicefunnel)?(?:sw([\d.]+))?(?:tt(\d+))?", name)
    if e is not None and any(e.groups()):  # as shipped, with the serve switches of the environment:
        # pipeline ($GENREC_PIPELINE), host/devicefunnel ($GENREC_DEVICE_FUNNEL off / on), sw<ms>
        # ($GENREC_SWITCH_INTERVAL_MS; e.g. pipelinesw0.5), tt<N> (--torch-threads N)
        env = {"GENREC_PIPELINE": e.group(1) and "1",
               "GENREC_DEVICE_FUNNEL": e.group(2) and ("off" if e.group(2) == "hostfunnel" else "on"),
               "GENREC_SWITCH_INTERVAL_MS": e.group(3)}
        return dict(MODES["default"], env={k: v for k, v in env.items() if v},
                    **({"torch_threads": int(e.group(4))} if e.group(4) else {}))
    m = re.fullmatch(r"batch(\d+)(busy|timed)?", name)
    if m is None or int(m.group(1)) < 2:
        raise SystemExit(f"--modes: unknown mode {name!r}; choose from {sorted(MODES)}, batch<N>[busy|timed], "
                         "two<S>, fronts<N>[overlap][two][b<M>][l<ms>] or "
                         "[pipeline][hostfunnel|devicefunnel][sw<ms>][tt<N>]")
    return dict(two_process=False, rank=True, micro_batch=int(m.group(1)), micro_batch_policy=m.group(2) or "timed")


def gil_profile_start(pid: int, duration: float) -> tuple[subprocess.Popen, str, float] | None:
    """py-spy recording which thread of ``pid`` holds the interpreter lock, for the run's ``duration`` (less its
    start); None (said) where py-spy is not installed."""
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(exe):
        print("--gil-profile: py-spy not found (pip install py-spy)", flush=True)
        return None
    out = tempfile.mktemp(suffix=".txt", prefix="gil-")
    secs, rate = max(1, int(duration) - 1), 200
    cmd = [exe, "record", "-p", str(pid), "--gil", "-r", str(rate), "-d", str(secs), "-f", "raw", "-o", out,
           "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out, secs * rate


def gil_profile_table(spy: subprocess.Popen, path: str, possible: float) -> dict[str, float]:
    """The recording's share of the run per stage (:data:`GIL_STAGES`; ``other``: the rest; ``free``: the lock
    held by none), printed as a table."""
    _, err = spy.communicate()
    if spy.returncode != 0 or not os.path.exists(path):
        print(f"--gil-profile: py-spy failed ({spy.returncode}): {err.decode(errors='replace')[-300:]}", flush=True)
        return {}
    per: collections.Counter[str] = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, n = line.rstrip().rsplit(" ", 1)
            per[next((name for name, key in GIL_STAGES if key in stack), "other")] += int(n)
    os.unlink(path)
    held = sum(per.values())
    if held == 0:  # (on the lent GPU machine py-spy ran and recorded nothing: no table of zeros)
        print("--gil-profile: py-spy recorded no sample (may it read the server's memory? ptrace)", flush=True)
        return {}
    share = {k: v / possible for k, v in per.most_common()}
    share["free"] = max(0.0, 1.0 - held / possible)
    print("| GIL held by | share of the run |\n|---|---|")
    for k, v in share.items():
        print(f"| {k} | {v:.3f} |")
    print(flush=True)
    return share


def save(rows: list[dict[str, Any]], a: argparse.Namespace) -> None:
    """The rows so far to $OUT/bench_serve.json (written whole, then renamed), when OUT is set."""
    if not os.environ.get("OUT"):
        return
    path = os.path.join(os.environ["OUT"], "bench_serve.json")
    with open(path + ".tmp", "w") as f:
        json.dump({**machine(), "args": vars(a), "results": rows}, f, indent=2)
    os.replace(path + ".tmp", path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workdir")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds of the same load before each measured run, not counted (first-use graph captures)")
    ap.add_argument("--clients", default=None, help="closed-loop client counts, e.g. 1,16,64 (default: --concurrency)")
    ap.add_argument("--concurrency", type=int, default=8, help="one client count (when --clients is not given)")
    ap.add_argument("--procs", default="1", help="client processes at most (auto: cores // 4, at most 4)")
    ap.add_argument("--history-len", type=int, default=50)
    ap.add_argument("--beam-width", type=int, default=20)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--modes", default="one,two")
    ap.add_argument("--device", default="cpu", help="the server's device (cpu, cuda)")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="load-generator client (raw: pre-encoded bytes on asyncio streams; httpx: AsyncClient)")
    ap.add_argument("--columns", action="store_true",
                    help="send each history as history_columns (one list of ids) instead of a list of events")
    ap.add_argument("--exact-history", action="store_true",
                    help="every history exactly --history-len items (short users extended with others')")
    ap.add_argument("--precision", default="float32", choices=("float32", "bf16"), help="the servers' --precision")
    ap.add_argument("--gil-profile", action="store_true",
                    help="py-spy: the share of each measured run the server's interpreter lock is held, per stage")
    ap.add_argument("--batch-buckets", default=None, help="the servers' $GENREC_BATCH_BUCKETS (auto, off, 1,2,4,8)")
    ap.add_argument("--warm-beams", default="auto",
                    help="the servers' --warm-beams: auto (the --beam-width the clients ask, as an operator would "
                         "set it), server (the server's default, 20) or widths, e.g. 20,60")
    a = ap.parse_args()
    clients = [int(x) for x in (a.clients or str(a.concurrency)).split(",")]
    procs = max(1, min(4, (os.cpu_count() or 1) // 4)) if a.procs == "auto" else int(a.procs)
    modes = [(m, mode(m)) for m in a.modes.split(",")]  # a list: a mode named twice runs twice (a repeat)
    print("machine:", ", ".join(f"{k} {v}" for k, v in machine().items()), flush=True)
    if a.batch_buckets is not None:
        os.environ["GENREC_BATCH_BUCKETS"] = a.batch_buckets  # the servers read it (start_server passes the env)
    hist = as_sent(a.workdir, sample_histories(a.workdir, 512, a.history_len, 0, exact=a.exact_history))
    named: dict[str, tuple[int, ...]] = {"auto": (a.beam_width,), "server": ()}
    warm = named[a.warm_beams] if a.warm_beams in named else tuple(int(w) for w in a.warm_beams.split(","))
    rows: list[dict[str, Any]] = []
    n_procs = len(split(max(clients), procs))  # the client processes, spawned once for every mode and client count
    with ClientProcs(n_procs) if n_procs > 1 else contextlib.nullcontext() as pool:
        for name, kw in modes:
            run_mode(a, name, kw, hist, warm, clients, procs, pool, rows)
    print("| mode | clients | procs | " + " | ".join(KEYS) + " |")
    print("|---|---|---|" + "|".join("---" for _ in KEYS) + "|")
    for r in rows:
        print(f"| {r['mode']} | {r['clients']} | {r['procs']} | " + " | ".join(str(r[k]) for k in KEYS) + " |")


def run_mode(a: argparse.Namespace, name: str, kw: dict[str, Any], hist: Any, warm: tuple[int, ...],
             clients: list[int], procs: int, pool: ClientProcs | None, rows: list[dict[str, Any]]) -> None:
    """One mode's server, loaded at each client count (a row each, saved as it comes)."""
    rank = kw.pop("rank")
    t_start = time.perf_counter()  # the server's start to ready (its load, warm-up and graph captures)
    proc, url = start_server(a.workdir, device=a.device, precision=a.precision, warm_beams=warm, **kw)
    start_s = round(time.perf_counter() - t_start, 1)
    print(f"[{name}] server ready in {start_s} s", flush=True)
    try:
        for c in clients:
            body = {"k": a.k, "beam_width": a.beam_width, "rank": rank}
            if a.warmup > 0:
                drive(url, hist, concurrency=c, procs=procs, duration=a.warmup, client=a.client, body=body,
                      columns=a.columns, pool=pool)
            spy = gil_profile_start(proc.pid, a.duration) if a.gil_profile else None
            res = drive(url, hist, concurrency=c, procs=procs, duration=a.duration, client=a.client, body=body,
                        server_pid=proc.pid, columns=a.columns, pool=pool)
            row = {"mode": name, "clients": c, "procs": len(split(c, procs)), **res.summary(),
                   "start_s": start_s}
            rows.append(row)
            print(f"[{name}, {c} clients, {row['procs']} client processes]\n{res.table()}\n", flush=True)
            if spy is not None:
                row["gil"] = gil_profile_table(*spy)
            save(rows, a)  # after each row: a run cut by a device call's limit keeps what it measured
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()
