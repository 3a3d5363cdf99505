"""The service's pure-ASGI middleware and the Prometheus metrics they feed: :class:`BodyLimit` (413 before any
JSON parsing, also for chunked bodies; the refused body is read to its end, so the client gets the 413),
:class:`Track` (in-flight gauge, requests by endpoint and status) and :class:`Metrics` (the registry ``/metrics``
exports)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["PROXIED", "BodyLimit", "Metrics", "Track"]

STAGES = ("encode", "sid", "ann", "rank", "total")
"""The stages ``/metrics`` keeps a latency histogram of (those of an answer's ``timings_ms``)."""
PROXIED = "genrec.proxied"
"""Set in a request's ASGI scope by a front process (``--fronts``) that passed the request on to the engine's own
app: the engine counted it, so the front's :class:`Track` does not."""


DRAIN_BYTES = 64 << 20
"""The most of a refused body :class:`BodyLimit` reads (and discards) before it closes the connection."""
DRAIN_SECONDS = 30.0
"""The longest :class:`BodyLimit` waits for the rest of a refused body."""


class BodyLimit:
    """Pure ASGI middleware: 413 when Content-Length or the streamed body exceeds ``limit`` bytes.

    The 413 goes out at once, with ``Connection: close``; the rest of the refused body is then read and thrown
    away (up to ``drain_bytes``, for up to ``drain_seconds``) before the response ends and the connection
    closes. A connection closed with request bytes still unread is *reset* by the kernel, and a client that
    sends its whole body before reading the answer (``urllib``, ``http.client``) then sees the reset, not the
    413. (A client waiting on ``Expect: 100-continue`` gets no "100 Continue" after the 413 -- uvicorn sends none
    once the response started -- so it sends no body and closes: the drain ends there.)"""

    def __init__(self, app: Any, limit: int, *, drain_bytes: int = DRAIN_BYTES,
                 drain_seconds: float = DRAIN_SECONDS) -> None:
        self.app, self.limit = app, limit
        self.drain_bytes, self.drain_seconds = drain_bytes, drain_seconds

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return await _send_json(send, 400, {"error": "bad request", "message": "invalid Content-Length"})
                if n > self.limit:
                    return await self._refuse(send, receive if n <= self.drain_bytes else None, n, 0)
        # read (at most limit + 1 bytes of) the body here, so a chunked body without Content-Length is
        # refused too; the app then gets the buffered body replayed
        chunks: list[bytes] = []
        seen = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # client went away
            chunks.append(msg.get("body", b""))
            seen += len(chunks[-1])
            more = msg.get("more_body", False)
            if seen > self.limit:
                return await self._refuse(send, receive if more else None, seen, seen)
        body = b"".join(chunks)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Callable, receive: Callable[[], Awaitable[dict]] | None, n: int,
                      seen: int) -> None:
        """Answer 413 for a body of ``n`` bytes (or more); with ``receive``, read and drop the body's rest
        (``seen`` bytes were read already) before the response ends."""
        await _send_json(send, 413, _too_big(self.limit, n), close=True, more=receive is not None)
        if receive is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_seconds
        with contextlib.suppress(asyncio.TimeoutError):
            while seen <= self.drain_bytes:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
                if msg["type"] != "http.request":
                    break  # the client went away
                seen += len(msg.get("body", b""))
                if not msg.get("more_body", False):
                    break
        await send({"type": "http.response.body", "body": b""})


class Track:
    """Pure ASGI middleware: the in-flight gauge and the per-endpoint/status request counter.

    (Was a ``@app.middleware("http")`` -- Starlette's BaseHTTPMiddleware, which wraps every request
    in a task group and streams the response through a memory channel.) An exception that escapes
    the app before a response started is counted as status 500, the answer the client gets. It wraps
    the body limit too, so a refused body is counted (413). The endpoint label is the request's path
    only for the app's own routes (``paths``) and "other" for any other path: a scanner's random
    URLs must not grow the metrics without bound."""

    def __init__(self, app: Any, metrics: Metrics, paths: Callable[[], set[str]]) -> None:
        self.app, self.metrics, self._paths_of = app, metrics, paths
        self._paths: set[str] | None = None

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        m = self.metrics
        status = 500

        async def send_status(msg: dict) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        m.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            m.in_flight.dec()
            if not scope.get(PROXIED):  # a request a front passed on is counted where it was answered
                if self._paths is None:
                    self._paths = self._paths_of()
                path = scope["path"]
                m.requests.labels(endpoint=path if path in self._paths else "other", status=str(status)).inc()


def _too_big(limit: int, n: int) -> dict[str, Any]:
    return {"error": "payload too large", "message": f"request body of {n} bytes exceeds the limit of {limit} bytes",
            "fields": ["body"]}


async def _send_json(send: Callable, status: int, obj: dict[str, Any], *, close: bool = False,
                     more: bool = False) -> None:
    """A JSON response; ``close``: with ``Connection: close``; ``more``: the body is sent but the response not
    ended (the caller sends the final empty body)."""
    body = json.dumps(obj).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": body, "more_body": more})


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        buckets = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
        self.stage = Histogram("genrec_stage_latency_ms", "Per-stage latency (ms)", ["endpoint", "stage"],
                               buckets=buckets, registry=r)
        self.in_flight = Gauge("genrec_in_flight_requests", "Requests being served", registry=r)
        self.requests = Counter("genrec_requests", "Requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.pool_occupancy = Gauge("genrec_kv_pool_occupancy", "KV-pool slots leased", registry=r)
        self.pool_slots = Gauge("genrec_kv_pool_slots", "KV-pool slots", registry=r)
        self.graph_captures = Gauge("genrec_graph_captures", "CUDA graphs the served model has captured, per stage (a "
                                    "rise under load: a shape met for the first time, a latency spike)", ["stage"],
                                    registry=r)
        self.index_version = Gauge("genrec_index_version_info", "Served bundle version (value 1)", ["version"],
                                   registry=r)
        self.degraded = Counter("genrec_degraded_responses", "Retrieval-only answers (ranker down)", registry=r)
        self.stale = Counter("genrec_kv_stale_reads", "Stale KV-slot reads (retried)", registry=r)
        self.reloads = Counter("genrec_reloads", "Hot-swap attempts by outcome", ["outcome"], registry=r)
        # each micro-batched forward: how many requests it served and how long it took (its host work included)
        self.batch_rows = Histogram("genrec_batch_rows", "Requests per micro-batched forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.batch_ms = Histogram("genrec_batch_latency_ms", "Wall time of a micro-batched forward (ms)",
                                  buckets=buckets, registry=r)
        # the part of it that held the device (the model's run, not the parse or the answers' formatting: the next
        # batch parses meanwhile), and each request's wait in the micro-batcher before its batch started
        self.device_ms = Histogram("genrec_device_latency_ms", "Wall time a micro-batch held the model (ms)",
                                   buckets=buckets, registry=r)
        self.batch_wait_ms = Histogram("genrec_batch_wait_ms", "A request's wait for its micro-batch to start (ms)",
                                       buckets=buckets, registry=r)
        self.gc_pause_ms = Histogram("genrec_gc_pause_ms", "This process's cyclic GC collections by generation (ms): "
                                     "each stalls every thread of it", ["generation"], buckets=buckets, registry=r)

    def observe(self, endpoint: str, timings: dict[str, float]) -> None:
        """A request's stage timings (its answer's ``timings_ms``) into the stage histograms."""
        for s in STAGES:
            if s in timings:
                self.stage.labels(endpoint=endpoint, stage=s).observe(float(timings[s]))

    def set_version(self, v: str) -> None:
        self.index_version.clear()
        self.index_version.labels(version=v).set(1)


_clock = time.perf_counter  # bound once: a collection in any thread calls it, whatever replaces time.perf_counter


class GcPauses:
    """This process's cyclic GC collections, timed through ``gc.callbacks``: each stalls every thread of the
    process (a reference cycle per request, or an unfrozen heap, shows here as long full collections). The callback
    only appends to a bounded deque -- no lock: a collection may start while a thread holds a metric's lock --
    and :meth:`drain` moves what it timed into :attr:`Metrics.gc_pause_ms` when /metrics is read."""

    def __init__(self, keep: int = 10_000) -> None:
        self._t0 = 0.0  # the running collection's start (collections do not nest)
        self._done: deque[tuple[int, float]] = deque(maxlen=keep)  # (generation, ms); never drained: the newest kept

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = _clock()
        else:
            self._done.append((int(info["generation"]), (_clock() - self._t0) * 1e3))

    def install(self) -> "GcPauses":
        gc.callbacks.append(self._timed)
        return self

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._timed)

    def drain(self, hist: Histogram) -> None:
        while True:
            try:
                generation, ms = self._done.popleft()
            except IndexError:
                return
            hist.labels(generation=str(generation)).observe(ms)

