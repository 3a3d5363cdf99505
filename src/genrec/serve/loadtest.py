"""``genrec bench serve``'s driver (:func:`bench_serve`: start a server, load it, stop it) and closed-loop load from
several client processes (:func:`run_load_procs`), so the load generator is not what limits the QPS.

One asyncio client process tops out at a few thousand small requests a second (less with 1,000-item
bodies): past that a benchmark measures the client. :func:`run_load_procs` spreads ``concurrency``
closed-loop clients over ``procs`` processes (spawned; each runs :func:`genrec.serve.loadgen.run_load`
with its share of the connections and of the histories, request bytes encoded before the clock), starts
them together on a barrier, and merges what they measured: every latency, the statuses, and the CPU
each client process used while the clock ran (``resource.getrusage``, user + system). The result says
``client_cpu_per_s`` (client CPU seconds per wall second, summed over the processes) and
``client_busy`` (the busiest process's share of one core): near 1.0 the client, not the server, is the
bottleneck. When it is given the server's pid it also reports the server's CPU over the same span (that
process and its descendants -- the ranking process of two-process mode -- read from ``/proc``; None
elsewhere).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from genrec.errors import ConfigError
from genrec.serve.loadgen import CLIENTS, BenchResult, as_sent, check_loopback, run_client, run_load, \
    sample_histories, start_server

__all__ = ["ClientProcs", "batch_counts", "bench_serve", "drive", "proc_tree_cpu_s", "run_load_procs", "split",
           "stop_server"]


def split(total: int, parts: int) -> list[int]:
    """``total`` clients over at most ``parts`` processes, as evenly as can be (no empty process)."""
    parts = max(1, min(parts, total))
    return [total // parts + (i < total % parts) for i in range(parts)]


def proc_tree_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its live descendants (Linux ``/proc``; else None)."""
    proc = Path("/proc")
    if not (proc / str(pid) / "stat").exists():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        f = raw[raw.rindex(")") + 2:].split()  # the fields after "pid (comm)": state ppid ... utime stime
        stats[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo += [c for c, (pp, _) in stats.items() if pp == p and c not in tree]
    return sum(stats[p][1] for p in tree if p in stats)


def _child(idx: int, url: str, histories: Sequence[Sequence[int | str]], conns: int, duration: float,
           max_requests: int, body: dict[str, Any] | None, timeout: float, client: str, path: str,
           barrier: Any, out: Any, columns: bool = False, run: int = 0) -> None:
    """One client process: its closed loops from the barrier on; puts (run, idx, summary | error text) on ``out``."""
    try:  # request bytes encoded, it waits for the others at the barrier, then starts its clock
        res = run_client(run_load(url, histories, duration=duration, concurrency=conns, max_requests=max_requests,
                                  body=body, timeout=timeout, client=client, path=path,
                                  ready=lambda: barrier.wait(timeout=300), columns=columns))
        out.put((run, idx, {"requests": res.requests, "errors": res.errors, "seconds": res.seconds,
                       "latencies_ms": res.latencies_ms, "statuses": res.statuses, "degraded": res.degraded,
                       "client_loop": res.client_loop, "cpu_s": res.client_cpu_s}))
    except BaseException as e:  # noqa: BLE001 - the parent reports it, naming this process
        barrier.abort()
        out.put((run, idx, f"{type(e).__name__}: {e}"))


def _worker(idx: int, jobs: Any, barrier: Any, out: Any) -> None:
    """A process of :class:`ClientProcs`: runs each job it is given (:func:`_child`; none of the clients: only the
    start barrier) until None."""
    while (job := jobs.get()) is not None:
        if job["conns"] == 0:  # not in this run: it only takes its place at the start
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=300)
            out.put((job["run"], idx, None))
            continue
        _child(idx, job["url"], job["histories"], job["conns"], job["duration"], job["max_requests"], job["body"],
               job["timeout"], job["client"], job["path"], barrier, out, job["columns"], job["run"])


class ClientProcs:
    """``procs`` client processes, spawned once and reused by every :meth:`run` (a spawn imports genrec and torch:
    seconds a process, paid twice a benchmark cell -- warm-up, run -- when each run spawned its own)."""

    def __init__(self, procs: int) -> None:
        if procs < 1:
            raise ConfigError(f"procs must be positive, got {procs}")
        ctx = mp.get_context("spawn")  # a fresh interpreter each: nothing of the parent's threads or CUDA state
        self.procs = procs
        self._run = 0  # each run's number, on its jobs and their results
        self._stuck = False  # a run ended without every process's result: its processes may still be in it
        self._barrier = ctx.Barrier(procs + 1)
        self._out = ctx.Queue()
        self._jobs = [ctx.Queue() for _ in range(procs)]
        self._ps = [ctx.Process(target=_worker, args=(i, self._jobs[i], self._barrier, self._out), daemon=True)
                    for i in range(procs)]
        for p in self._ps:
            p.start()

    def __enter__(self) -> ClientProcs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the processes (each after its current job)."""
        for q in self._jobs:
            q.put(None)
        for p in self._ps:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()

    def run(self, url: str, histories: Sequence[Sequence[int | str]], *, concurrency: int, duration: float = 60.0,
            max_requests: int = 1_000_000, body: dict[str, Any] | None = None, timeout: float = 30.0,
            client: str = "raw", path: str = "/v1/recommend", server_pid: int | None = None,
            columns: bool = False) -> BenchResult:
        """:func:`run_load_procs` on these processes (``concurrency`` spread over at most :attr:`procs`)."""
        _check(url, self.procs, concurrency, duration, max_requests, client, histories)
        if self._stuck:
            raise RuntimeError("these client processes did not finish an earlier run; start new ones")
        self._run += 1
        conns = split(concurrency, self.procs)
        n = len(conns)
        share = [list(histories[i::n]) or list(histories) for i in range(n)]
        per = [max(1, max_requests // n + (i < max_requests % n)) for i in range(n)]
        for i, q in enumerate(self._jobs):
            q.put({"url": url, "histories": share[i] if i < n else [], "conns": conns[i] if i < n else 0,
                   "duration": duration, "max_requests": per[i] if i < n else 0, "body": body, "timeout": timeout,
                   "client": client, "path": path, "columns": columns, "run": self._run})
        got: dict[int, Any] = {}
        try:
            self._barrier.wait(timeout=300)  # every process has its job and has encoded its requests
        except threading.BrokenBarrierError:
            pass  # a process failed before the start: its error is on the queue
        srv0 = proc_tree_cpu_s(server_pid) if server_pid is not None else None
        t0 = time.perf_counter()
        t_end = time.monotonic() + duration + timeout + 120
        while len(got) < self.procs:
            try:
                run, i, r = self._out.get(timeout=max(1.0, t_end - time.monotonic()))
            except queue.Empty:
                self._stuck = True
                dead = [i for i, p in enumerate(self._ps) if i not in got and not p.is_alive()]
                raise RuntimeError(f"load processes {dead or sorted(set(range(self.procs)) - set(got))} gave no "
                                   "result") from None
            if run == self._run:
                got[i] = r
        wall = time.perf_counter() - t0
        srv1 = proc_tree_cpu_s(server_pid) if server_pid is not None else None
        if self._barrier.broken:
            self._barrier.reset()  # for the next run
        bad = {i: r for i, r in got.items() if isinstance(r, str)}
        if bad:
            raise RuntimeError("load process(es) failed: " + "; ".join(f"#{i}: {r}" for i, r in sorted(bad.items())))
        res = BenchResult(0, 0, 0.0, client=client, client_loop=got[0]["client_loop"], procs=n)
        for i in range(n):
            r = got[i]
            res.requests += r["requests"]
            res.errors += r["errors"]
            res.degraded += r["degraded"]
            res.latencies_ms += r["latencies_ms"]
            for st, c in r["statuses"].items():
                res.statuses[st] = res.statuses.get(st, 0) + c
        res.seconds = max(got[i]["seconds"] for i in range(n))
        res.client_cpu_s = sum(got[i]["cpu_s"] for i in range(n))
        res.client_busy = max(got[i]["cpu_s"] / max(got[i]["seconds"], 1e-9) for i in range(n))
        if srv0 is not None and srv1 is not None:  # over the wall time the processes ran, scaled to theirs
            res.server_cpu_s = (srv1 - srv0) * res.seconds / max(wall, 1e-9)
        return res


def _check(url: str, procs: int, concurrency: int, duration: float, max_requests: int, client: str,
           histories: Sequence[Sequence[int | str]]) -> None:
    check_loopback(url)
    if procs < 1 or concurrency < 1 or duration <= 0 or max_requests < 1:
        raise ConfigError("procs, concurrency, duration and max_requests must be positive")
    if client not in CLIENTS:
        raise ConfigError(f"client must be one of {', '.join(CLIENTS)}, got {client!r}")
    if not histories:
        raise ConfigError("run_load_procs: no histories to send")


def run_load_procs(url: str, histories: Sequence[Sequence[int | str]], *, procs: int, concurrency: int,
                   duration: float = 60.0, max_requests: int = 1_000_000, body: dict[str, Any] | None = None,
                   timeout: float = 30.0, client: str = "raw", path: str = "/v1/recommend",
                   server_pid: int | None = None, columns: bool = False) -> BenchResult:
    """``concurrency`` closed-loop clients (:func:`genrec.serve.loadgen.run_load`) spread over ``procs``
    processes (:func:`split`; process ``i`` sends histories ``i, i + procs, ...``), started together; the
    merged result, with the client processes' CPU (and the server's, given ``server_pid``). The processes are
    spawned for this run (:class:`ClientProcs` keeps them for several)."""
    _check(url, procs, concurrency, duration, max_requests, client, histories)
    with ClientProcs(len(split(concurrency, procs))) as cp:
        return cp.run(url, histories, concurrency=concurrency, duration=duration, max_requests=max_requests,
                      body=body, timeout=timeout, client=client, path=path, server_pid=server_pid, columns=columns)


BATCH_METRICS = ("genrec_batch_rows_count", "genrec_batch_rows_sum", "genrec_batch_latency_ms_sum",
                 "genrec_device_latency_ms_sum", "genrec_batch_wait_ms_sum", "genrec_batch_wait_ms_count")
"""The server's micro-batch counters :func:`batch_counts` reads: batches, the requests in them, their summed wall
ms, the summed ms they held the model, the requests' summed wait for their batch and how many waited."""


def batch_counts(url: str) -> dict[str, float] | None:
    """The server's :data:`BATCH_METRICS` from its ``/metrics`` (0 for one it lacks) and ``graph_captures``, its
    CUDA graphs captured so far over every stage; None when it has no batch metrics (micro-batching off, not a
    genrec server)."""
    want = dict.fromkeys(BATCH_METRICS, 0.0)
    want["graph_captures"] = want["gc_full"] = want["gc_full_ms"] = 0.0  # the engine process's full collections
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    seen = False
    for line in text.splitlines():
        name, _, val = line.partition(" ")
        if name.startswith("genrec_graph_captures{"):
            want["graph_captures"] += float(val)
        elif name in ('genrec_gc_pause_ms_count{generation="2"}', 'genrec_gc_pause_ms_sum{generation="2"}'):
            want["gc_full" if "_count" in name else "gc_full_ms"] = float(val)
        elif name in want:
            want[name], seen = float(val), True
    return want if seen else None


def drive(url: str, histories: Sequence[Sequence[int | str]], *, concurrency: int, procs: int = 1,
          duration: float = 60.0, max_requests: int = 1_000_000, body: dict[str, Any] | None = None,
          client: str = "raw", server_pid: int | None = None, columns: bool = False,
          pool: ClientProcs | None = None) -> BenchResult:
    """``concurrency`` closed-loop clients against ``url``: in this process (``procs`` 1) or spread over
    ``procs`` processes (:func:`run_load_procs`; ``pool``: over its processes instead, kept from run to run); the
    server's CPU too, given ``server_pid``, and its micro-batches (:func:`batch_counts`). ``columns``: the
    histories go as ``history_columns``."""
    b0 = batch_counts(url)
    if (pool.procs if pool is not None else procs) > 1 and concurrency > 1:
        kw: dict[str, Any] = dict(concurrency=concurrency, duration=duration, max_requests=max_requests, body=body,
                                  client=client, server_pid=server_pid, columns=columns)
        res = pool.run(url, histories, **kw) if pool is not None else run_load_procs(url, histories, procs=procs, **kw)
    else:
        srv0 = proc_tree_cpu_s(server_pid) if server_pid is not None else None
        res = run_client(run_load(url, histories, duration=duration, concurrency=concurrency,
                                  max_requests=max_requests, body=body, client=client, columns=columns))
        srv1 = proc_tree_cpu_s(server_pid) if server_pid is not None else None
        if srv0 is not None and srv1 is not None:  # encoding the requests included: an upper bound
            res.server_cpu_s = srv1 - srv0
    b1 = batch_counts(url) if b0 is not None else None
    if b0 is not None and b1 is not None:
        d = {k: b1[k] - b0[k] for k in b1}
        res.batches, res.batch_rows = int(d["genrec_batch_rows_count"]), int(d["genrec_batch_rows_sum"])
        # over the clients' measured run (batches run only while they send; the span between the two reads also
        # held the client processes' start, and understated the share)
        sec = max(res.seconds, 1e-9)
        res.batch_busy = d["genrec_batch_latency_ms_sum"] / 1e3 / sec
        res.device_busy = d["genrec_device_latency_ms_sum"] / 1e3 / sec
        waits = d["genrec_batch_wait_ms_count"]
        res.batch_wait_ms = d["genrec_batch_wait_ms_sum"] / waits if waits else None
        res.graph_captures = int(d["graph_captures"])  # during the run: each one stalled the batches behind it
        res.gc_full, res.gc_full_ms = int(d["gc_full"]), d["gc_full_ms"]  # the engine's full GC collections
    return res


def stop_server(proc: subprocess.Popen | None) -> None:
    """End a server :func:`~genrec.serve.loadgen.start_server` started (SIGTERM, then SIGKILL after 20 s)."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def bench_serve(workdir: str | Path, *, url: str | None = None, duration: float = 60.0, concurrency: int = 8,
                max_requests: int = 1_000_000, history_len: int = 50, beam_width: int = 20, k: int = 10,
                rank: bool = True, two_process: bool = False, micro_batch: int | None = None, seed: int = 0,
                device: str = "cpu", exact_history: bool = False, client: str = "raw",
                micro_batch_policy: str | None = None, micro_batch_wait_ms: float = 2.0,
                kv_pool_device: str = "auto", threads: int | None = None,
                torch_threads: int | None = None, procs: int = 1, fronts: int | None = None) -> BenchResult:
    """Start (or target) a local server, drive it (:func:`drive`; ``procs`` client processes), stop it; returns
    the result. ``threads`` / ``torch_threads`` / ``micro_batch`` / ``micro_batch_policy``: the started server's
    ``--threads`` / ``--torch-threads`` / ``--micro-batch`` / ``--micro-batch-policy`` (None: its defaults) and
    ``--fronts``."""
    if client not in CLIENTS:  # before starting anything
        raise ConfigError(f"client must be one of {', '.join(CLIENTS)}, got {client!r}")
    if procs < 1:
        raise ConfigError(f"procs must be >= 1, got {procs}")
    hist = as_sent(workdir, sample_histories(workdir, 512, history_len, seed, exact=exact_history))
    proc = None
    if url is None:
        proc, url = start_server(workdir, two_process=two_process, micro_batch=micro_batch, device=device,
                                 micro_batch_policy=micro_batch_policy, micro_batch_wait_ms=micro_batch_wait_ms,
                                 kv_pool_device=kv_pool_device, threads=threads, torch_threads=torch_threads,
                                 fronts=fronts)
    try:
        return drive(url, hist, concurrency=concurrency, procs=procs, duration=duration, max_requests=max_requests,
                     body={"k": k, "beam_width": beam_width, "rank": rank}, client=client,
                     server_pid=None if proc is None else proc.pid)
    finally:
        stop_server(proc)
