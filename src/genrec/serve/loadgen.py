"""``genrec bench serve``: a bounded async load generator on loopback (issue 6 item 6).

``concurrency`` closed-loop clients send ``POST /v1/recommend`` with histories sampled from the
run's own event table (real item ids, ``history_len`` newest items of random users) until
``duration`` seconds or ``max_requests`` requests, whichever comes first. Latency is measured
client-side (send -> full body). Non-standard: it refuses non-loopback targets, and can start
its own server (a child ``genrec serve`` process on a free port) and stop it afterwards.

Two clients (``client=``): ``"raw"`` (default) is :class:`RawConnection`, a minimal HTTP/1.1
keep-alive client on asyncio streams, one connection per closed-loop client, writing request
bytes encoded before the clock starts -- so the latency is the service's, not the client
library's; ``"httpx"`` is an ``httpx.AsyncClient`` (what earlier figures used; it adds ~2 ms more
per 1,000-item request than the raw client on the 2-core CPU box, see docs/RESULTS.md). The load
runs on uvloop when installed (:func:`run_client`). Driving a server from several client processes, and
``bench_serve`` (start a server, load it, stop it): :mod:`genrec.serve.loadtest`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from genrec.catalog import open_store
from genrec.errors import ConfigError, GenrecError
from genrec.infer.cases import SourceIds

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class BenchResult:
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    degraded: int = 0
    client: str = "raw"
    client_loop: str = "asyncio"
    procs: int = 1  # client processes (genrec.serve.loadtest)
    client_cpu_s: float = 0.0  # user + system CPU seconds of the client process(es) while the clock ran
    client_busy: float = 0.0  # the busiest client process's CPU seconds per second (1.0: it used a whole core)
    server_cpu_s: float | None = None  # the server's process tree over the same span, when measured
    # the server's micro-batched forwards over the run (its /metrics, when it has them): how many, the requests they
    # served, and the share of the run's wall time one of them was running
    batches: int | None = None
    batch_rows: int | None = None
    batch_busy: float | None = None  # batches' wall time (parse, model, format; they overlap) per second
    device_busy: float | None = None  # the share of the run a batch held the model
    batch_wait_ms: float | None = None  # a request's mean wait for its batch to start
    graph_captures: int | None = None  # CUDA graphs the server captured during the run (shapes met the first time)
    gc_full: int | None = None  # the server's (engine process's) full GC collections during the run, and their ms
    gc_full_ms: float | None = None

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else np.zeros(1)
        sec = max(self.seconds, 1e-9)
        return {"client": self.client, "client_loop": self.client_loop, "procs": self.procs,
                "requests": self.requests, "errors": self.errors, "degraded": self.degraded,
                "seconds": round(self.seconds, 2), "qps": round(self.requests / sec, 2),
                "p50_ms": round(float(np.percentile(lat, 50)), 2), "p90_ms": round(float(np.percentile(lat, 90)), 2),
                "p99_ms": round(float(np.percentile(lat, 99)), 2), "max_ms": round(float(lat.max()), 2),
                "client_cpu_per_s": round(self.client_cpu_s / sec, 2), "client_busy": round(self.client_busy, 2),
                "server_cpu_per_s": None if self.server_cpu_s is None else round(self.server_cpu_s / sec, 2),
                "batches": self.batches,
                "rows_per_batch": round(self.batch_rows / self.batches, 2) if self.batches and self.batch_rows else None,
                "batch_busy": None if self.batch_busy is None else round(self.batch_busy, 2),
                "device_busy": None if self.device_busy is None else round(self.device_busy, 2),
                "batch_wait_ms": None if self.batch_wait_ms is None else round(self.batch_wait_ms, 2),
                "graph_captures": self.graph_captures, "gc_full": self.gc_full,
                "gc_full_ms": None if self.gc_full_ms is None else round(self.gc_full_ms, 1),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())}}

    def table(self) -> str:
        s = self.summary()
        keys = ["requests", "errors", "degraded", "seconds", "qps", "p50_ms", "p90_ms", "p99_ms", "max_ms",
                "client_cpu_per_s", "client_busy"]
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


def as_sent(workdir: str | Path, histories: list[list[int]]) -> list[list[int | str]]:
    """The histories (the tables' item ids) as a client of WORKDIR's service sends them: the source file's ids
    when the run's ids were remapped (:mod:`genrec.serve.ids`), else as they are."""
    src = SourceIds.of(workdir)
    if src is None:
        return list(histories)  # type: ignore[arg-type]
    back = src.item_original
    return [[str(back[i]) if i in back else f"#{i}" for i in h] for h in histories]


class ResponseError(GenrecError):
    """A response the raw client does not read: no Content-Length (e.g. chunked), or not HTTP/1.x."""


class RawConnection:
    """One HTTP/1.1 keep-alive connection on asyncio streams (the load generator's lean client).

    :meth:`request` writes pre-encoded request bytes (:func:`encode_request`) and reads the status
    line, the headers and exactly ``Content-Length`` body bytes. It connects lazily: the first
    request, and the first after the server closed the connection (``Connection: close`` or EOF),
    opens a new one inside the request's time. A response without ``Content-Length`` raises
    :class:`ResponseError` (the service always sends it; chunked bodies are not read).
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.connects = 0

    async def request(self, data: bytes) -> tuple[int, bytes]:
        """Send ``data`` (a whole request); return (status, body). Transport errors propagate
        (``OSError``, ``asyncio.IncompleteReadError`` on EOF) with the connection closed."""
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                self.connects += 1
            assert self.reader is not None
            self.writer.write(data)
            await self.writer.drain()
            status = 100
            while 100 <= status < 200:  # interim answers (100 Continue) come before the final one
                status, length, close = _parse_head(await self.reader.readuntil(b"\r\n\r\n"))
            body = await self.reader.readexactly(length) if length else b""
        except BaseException:
            await self.close()
            raise
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        w, self.reader, self.writer = self.writer, None, None
        if w is not None:
            w.close()
            with contextlib.suppress(Exception):
                await w.wait_closed()


def encode_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """``POST path`` as bytes on the wire: request line, Host, Content-Type, Content-Length, body."""
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("ascii") + body


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, Content-Length, connection closes after this response) of a response head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ResponseError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(parts[1])
    length: int | None = None
    close = parts[0] == "HTTP/1.0"
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            if not value.strip().isdigit():
                raise ResponseError(f"HTTP {status} response with an invalid Content-Length: {value.strip()[:40]!r}")
            length = int(value.strip())
        elif name == "connection":
            v = value.strip().lower()
            close = "close" in v or (close and "keep-alive" not in v)
        elif name == "transfer-encoding":
            chunked = "chunked" in value.lower()
    if status < 200 or status in (204, 304):
        return status, 0, close
    if length is None or chunked:
        raise ResponseError(f"HTTP {status} response without Content-Length"
                            f"{' (Transfer-Encoding: chunked)' if chunked else ''}: the raw client reads "
                            f"Content-Length bodies only (use client='httpx')")
    return status, length, close


CLIENTS = ("raw", "httpx")


def client_loop() -> str:
    """The event loop the load generator runs on: uvloop when installed (measured on the CPU box:
    ~0.2-0.3 ms less client time per 1,000-item request than asyncio's), else asyncio."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_client(coro: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` on :func:`client_loop`'s loop."""
    if client_loop() == "uvloop":
        import uvloop  # optional (the serve extra, not on Windows): only this client loop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            return r.run(coro)
    return asyncio.run(coro)


def history_body(history: Sequence[int | str], columns: bool = False) -> dict[str, Any]:
    """A request's history field for item ids ``history`` (each event the default action): ``{"history": [{"item_id":
    ..}, ..]}``, or with ``columns`` ``{"history_columns": {"item_id": [..]}}``."""
    ids = [x if isinstance(x, str) else int(x) for x in history]
    return {"history_columns": {"item_id": ids}} if columns else {"history": [{"item_id": x} for x in ids]}


async def run_load(url: str, histories: Sequence[Sequence[int | str]], *, duration: float = 60.0, concurrency: int = 8,
                   max_requests: int = 1_000_000, body: dict[str, Any] | None = None,
                   timeout: float = 30.0, client: str = "raw", path: str = "/v1/recommend",
                   ready: Callable[[], None] | None = None, columns: bool = False) -> BenchResult:
    """Closed-loop load: each of ``concurrency`` clients sends its next request when the last one returns.

    ``client``: ``"raw"`` (:class:`RawConnection`, one per closed-loop client) or ``"httpx"`` (one
    shared ``httpx.AsyncClient`` with ``concurrency`` keep-alive connections). Either way the clock
    runs from sending the pre-encoded body to having the full response body; the JSON answer is
    parsed (for its ``degraded`` flag) after the clock stops. A transport error or a request
    slower than ``timeout`` seconds counts as status 0 (an error) and the next request reconnects.
    ``ready``: called once the request bytes are encoded, just before the clock starts (the multi-process
    client's start barrier). The process's CPU time while the clock runs is ``client_cpu_s``. ``columns``: send
    each history as ``history_columns`` (one list of item ids) instead of a list of events."""
    check_loopback(url)
    if concurrency < 1 or duration <= 0 or max_requests < 1:
        raise ConfigError("concurrency, duration and max_requests must be positive")
    if client not in CLIENTS:
        raise ConfigError(f"client must be one of {', '.join(CLIENTS)}, got {client!r}")
    u = urlparse(url)
    if u.scheme != "http":
        raise ConfigError(f"--url: only http:// is supported, got {url!r}")
    host, port = u.hostname or "127.0.0.1", u.port or 80
    loop = asyncio.get_running_loop()
    res = BenchResult(0, 0, 0.0, client=client,
                      client_loop="uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio")
    extra = body or {"k": 10, "beam_width": 20, "rank": True}
    # request bodies encoded before the clock starts: the latency measured is the service's, not
    # the load generator's JSON encoding (~2-3 ms for a 1,000-item history on the CPU box)
    bodies = [json.dumps({**history_body(h, columns), **extra}).encode() for h in histories]
    wire = [encode_request(host, port, path, b) for b in bodies] if client == "raw" else []
    if ready is not None:
        ready()
    cpu0 = _cpu_s()
    t_start = time.perf_counter()
    t_end = t_start + duration
    counter = iter(range(max_requests))

    def record(t0: float, status: int) -> None:
        res.latencies_ms.append((time.perf_counter() - t0) * 1e3)
        res.requests += 1
        res.statuses[status] = res.statuses.get(status, 0) + 1
        if status != 200:
            res.errors += 1

    def note_degraded(data: bytes) -> None:  # after the clock stopped
        try:
            if json.loads(data).get("degraded"):
                res.degraded += 1
        except (ValueError, AttributeError):
            pass

    async def closed_loop(send: Callable[[int], Awaitable[tuple[int, bytes]]]) -> None:
        """One client: the next request as soon as the last one returned, until time or count run out."""
        while time.perf_counter() < t_end:
            i = next(counter, None)
            if i is None:
                return
            t0 = time.perf_counter()
            status, data = await send(i)
            record(t0, status)
            if status == 200:
                note_degraded(data)

    async def raw_client(cid: int) -> None:
        conn = RawConnection(host, port)

        async def send(i: int) -> tuple[int, bytes]:
            try:
                return await asyncio.wait_for(conn.request(wire[i % len(wire)]), timeout)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
                return 0, b""  # connection refused / reset / closed mid-response / timed out

        try:
            await closed_loop(send)
        finally:
            await conn.close()

    async def httpx_client(cid: int, c: Any) -> None:
        import httpx  # the httpx client only (`--client httpx`)

        headers = {"content-type": "application/json"}

        async def send(i: int) -> tuple[int, bytes]:
            try:
                r = await c.post(path, content=bodies[i % len(bodies)], headers=headers)
                return r.status_code, r.content
            except httpx.HTTPError:
                return 0, b""

        await closed_loop(send)

    async def drive(make: Callable[[int], Coroutine[Any, Any, None]]) -> None:
        tasks = [asyncio.create_task(make(i)) for i in range(concurrency)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    if client == "raw":
        await drive(raw_client)
    else:
        import httpx  # the httpx client only (`--client httpx`)

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as c:
            await drive(lambda i: httpx_client(i, c))
    res.seconds = time.perf_counter() - t_start
    res.client_cpu_s = _cpu_s() - cpu0
    res.client_busy = res.client_cpu_s / max(res.seconds, 1e-9)
    return res


def _cpu_s() -> float:
    """This process's user + system CPU seconds so far."""
    return time.process_time()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: str | Path, *, two_process: bool = False, threads: int | None = None,
                 micro_batch: int | None = None, ready_timeout: float = 180.0, device: str = "cpu",
                 micro_batch_policy: str | None = None,
                 micro_batch_wait_ms: float = 2.0, kv_pool_device: str = "auto",
                 torch_threads: int | None = None, fronts: int | None = None,
                 precision: str = "float32", host_overlap: bool = False,
                 micro_batch_linger_ms: float = 0.0, pool_slots: int = 0,
                 warm_beams: Sequence[int] = (), env: Mapping[str, str] | None = None
                 ) -> tuple[subprocess.Popen, str]:
    """A child ``genrec serve`` on a free loopback port; returns (process, url) once /readyz answers 200.
    ``threads`` / ``torch_threads``: ``--threads`` / ``--torch-threads`` (None: the server's defaults, from
    the machine); ``micro_batch`` / ``micro_batch_policy``: likewise (None: the server's, 32 and busy); ``fronts``:
    ``--fronts`` (None: the server's default, :func:`genrec.serve.config.default_fronts`); ``precision``:
    ``--precision`` (float32 or bf16); ``host_overlap``: ``--host-overlap``;
    ``micro_batch_linger_ms``: ``--micro-batch-linger-ms``; ``pool_slots``: ``--pool-slots`` (0: the server's
    default); ``warm_beams``: ``--warm-beams`` (empty: the server's default); ``env``: variables set for the server
    on top of this process's (e.g. ``GENREC_PIPELINE``)."""
    import httpx  # the serve extra's HTTP client, loaded only when a server is started

    port = _free_port()
    cmd = [sys.executable, "-m", "genrec.cli", "serve", str(workdir), "--host", "127.0.0.1", "--port", str(port),
           *(["--threads", str(threads)] if threads is not None else []),
           *(["--torch-threads", str(torch_threads)] if torch_threads is not None else []),
           *(["--micro-batch", str(micro_batch)] if micro_batch is not None else []),
           *(["--micro-batch-policy", micro_batch_policy] if micro_batch_policy is not None else []),
           "--micro-batch-wait-ms", str(micro_batch_wait_ms),
           *(["--fronts", str(fronts)] if fronts is not None else []),
           "--precision", precision, *(["--host-overlap"] if host_overlap else []),
           *(["--micro-batch-linger-ms", str(micro_batch_linger_ms)] if micro_batch_linger_ms else []),
           *(["--pool-slots", str(pool_slots)] if pool_slots else []),
           *(["--warm-beams", ",".join(str(int(w)) for w in warm_beams)] if warm_beams else []),
           "--device", device] + (["--two-process", "--kv-pool-device", kv_pool_device] if two_process else [])
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})})
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
