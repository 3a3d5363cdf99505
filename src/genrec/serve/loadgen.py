"""``genrec bench serve``: a bounded httpx async load generator on loopback (issue 6 item 6).

``concurrency`` closed-loop clients send ``POST /v1/recommend`` with histories sampled from the
run's own event table (real item ids, ``history_len`` newest items of random users) until
``duration`` seconds or ``max_requests`` requests, whichever comes first. Latency is measured
client-side (send -> full body). Non-standard: it refuses non-loopback targets, and can start
its own server (a child ``genrec serve`` process on a free port) and stop it afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from genrec.errors import ConfigError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class BenchResult:
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    degraded: int = 0

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else np.zeros(1)
        return {"requests": self.requests, "errors": self.errors, "degraded": self.degraded,
                "seconds": round(self.seconds, 2), "qps": round(self.requests / max(self.seconds, 1e-9), 2),
                "p50_ms": round(float(np.percentile(lat, 50)), 2), "p90_ms": round(float(np.percentile(lat, 90)), 2),
                "p99_ms": round(float(np.percentile(lat, 99)), 2), "max_ms": round(float(lat.max()), 2),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())}}

    def table(self) -> str:
        s = self.summary()
        keys = ["requests", "errors", "degraded", "seconds", "qps", "p50_ms", "p90_ms", "p99_ms", "max_ms"]
        head = "| " + " | ".join(keys) + " |"
        sep = "|" + "|".join("---" for _ in keys) + "|"
        row = "| " + " | ".join(str(s[k]) for k in keys) + " |"
        return "\n".join([head, sep, row])


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host not in LOOPBACK:
        raise ConfigError(f"--url: the load generator only targets loopback (127.0.0.1/localhost), got {host!r}")


def sample_histories(workdir: str | Path, n: int, history_len: int, seed: int = 0,
                     exact: bool = False) -> list[list[int]]:
    """``n`` histories (newest ``history_len`` items of random users) from the run's events.

    ``exact``: every history has exactly ``history_len`` items -- a user's sequence is extended
    at the front with other random users' sequences (real item ids, real transitions inside each
    piece) when it is shorter; for latency at a fixed history length on short-sequence data.
    """
    from genrec.pipeline import open_store

    ev = open_store(workdir).read_events(columns=["user_id", "item_id", "timestamp"])
    u = ev.column("user_id").to_numpy()
    it = ev.column("item_id").to_numpy()
    ts = ev.column("timestamp").to_numpy()
    order = np.lexsort((ts, u))
    u, it = u[order], it[order]
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    ends = np.r_[starts[1:], len(u)]
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(starts), n)
    if not exact:
        return [it[max(starts[j], ends[j] - history_len):ends[j]].tolist() for j in pick]
    out = []
    for j in pick:
        pieces: list[np.ndarray] = []
        have = 0
        while have < history_len:
            pieces.insert(0, it[starts[j]:ends[j]])
            have += int(ends[j] - starts[j])
            j = int(rng.integers(0, len(starts)))
        out.append(np.concatenate(pieces)[-history_len:].tolist())
    return out


async def run_load(url: str, histories: list[list[int]], *, duration: float = 60.0, concurrency: int = 8,
                   max_requests: int = 1_000_000, body: dict[str, Any] | None = None,
                   timeout: float = 30.0) -> BenchResult:
    """Closed-loop load: each of ``concurrency`` clients sends its next request when the last one returns."""
    import httpx

    check_loopback(url)
    if concurrency < 1 or duration <= 0 or max_requests < 1:
        raise ConfigError("concurrency, duration and max_requests must be positive")
    res = BenchResult(0, 0, 0.0)
    extra = body or {"k": 10, "beam_width": 20, "rank": True}
    # request bodies encoded before the clock starts: the latency measured is the service's, not
    # the load generator's JSON encoding (~2-3 ms for a 1,000-item history on the CPU box)
    bodies = [json.dumps({"history": [{"item_id": int(x)} for x in h], **extra}).encode() for h in histories]
    headers = {"content-type": "application/json"}
    t_start = time.perf_counter()
    t_end = t_start + duration
    counter = iter(range(max_requests))

    async def client(cid: int, c: httpx.AsyncClient) -> None:
        while time.perf_counter() < t_end:
            i = next(counter, None)
            if i is None:
                return
            t0 = time.perf_counter()
            try:
                r = await c.post("/v1/recommend", content=bodies[i % len(bodies)], headers=headers)
                status = r.status_code
                if status == 200 and r.json().get("degraded"):
                    res.degraded += 1
            except httpx.HTTPError:
                status = 0
            res.latencies_ms.append((time.perf_counter() - t0) * 1e3)
            res.requests += 1
            res.statuses[status] = res.statuses.get(status, 0) + 1
            if status != 200:
                res.errors += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as c:
        await asyncio.gather(*(client(i, c) for i in range(concurrency)))
    res.seconds = time.perf_counter() - t_start
    return res


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: str | Path, *, two_process: bool = False, threads: int = 2, micro_batch: int = 1,
                 ready_timeout: float = 180.0, device: str = "cpu") -> tuple[subprocess.Popen, str]:
    """A child ``genrec serve`` on a free loopback port; returns (process, url) once /readyz answers 200."""
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "genrec.cli", "serve", str(workdir), "--host", "127.0.0.1", "--port", str(port),
           "--threads", str(threads), "--micro-batch", str(micro_batch), "--device", device] + (["--two-process"] if two_process else [])
    proc = subprocess.Popen(cmd, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    t_end = time.time() + ready_timeout
    while time.time() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"server not ready after {ready_timeout}s")


def bench_serve(workdir: str | Path, *, url: str | None = None, duration: float = 60.0, concurrency: int = 8,
                max_requests: int = 1_000_000, history_len: int = 50, beam_width: int = 20, k: int = 10,
                rank: bool = True, two_process: bool = False, micro_batch: int = 1, seed: int = 0,
                device: str = "cpu", exact_history: bool = False) -> BenchResult:
    """Start (or target) a local server, drive it, stop it; returns the result."""
    hist = sample_histories(workdir, 512, history_len, seed, exact=exact_history)
    proc = None
    if url is None:
        proc, url = start_server(workdir, two_process=two_process, micro_batch=micro_batch, device=device)
    try:
        return asyncio.run(run_load(url, hist, duration=duration, concurrency=concurrency, max_requests=max_requests,
                                    body={"k": k, "beam_width": beam_width, "rank": rank}))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
