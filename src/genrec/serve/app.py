"""``genrec serve``: the FastAPI service (issue 6 items 1, 2, 5; UniPinRec §4 / PinGER §4 serving).

Endpoints: ``POST /v1/recommend`` (one history encode -> SID beams + ANN -> ranking on the same
KV cache), ``POST /v1/rank`` (score given candidates), ``GET /healthz`` (process up), ``/readyz``
(a bundle is loaded; in two-process mode also the ranker), ``/metrics`` (Prometheus: per-stage
latency histograms, in-flight gauge, KV-pool occupancy, index version, degraded/stale counters),
``POST /admin/reload`` (and SIGHUP) for the versioned hot swap (:mod:`genrec.serve.swap`).

Non-standard: inference runs on a bounded thread pool (the event loop never blocks on torch); a
pure-ASGI middleware enforces the body size limit (413) before any JSON parsing, also for chunked
bodies; every validation failure is a 4xx whose message names the field; any other exception is
a 500 for that request only. A request takes the served bundle once, at its start (hot swap).
``micro_batch > 1`` groups concurrent one-process requests into one batched forward
(:mod:`genrec.serve.batcher`; default policy ``timed``: a group's first request waits up to
``micro_batch_wait_ms`` for more -- measured on the H200 and, under a closed loop of 4 clients, the
one that batches more; ``busy``: requests that queued while a batch ran form the next batch, no
timer, no cost at one client).

Per-request overhead (``benchmarks/bench_http_overhead.py``): request tracking is a pure ASGI
middleware (:class:`Track`, not Starlette's BaseHTTPMiddleware); the validated history reaches
the engine as the plain dicts pydantic checked (``HistoryItem`` is a TypedDict, no per-item
``model_dump``); once the bundle is loaded the heap is frozen out of the cyclic GC
(:func:`freeze_heap`: full collections had been ~165 ms stalls every ~50 requests on the CPU
box); uvicorn runs httptools/uvloop when installed, else h11/asyncio (:func:`uvicorn_impl`).
The response keeps FastAPI's ``response_model`` path: it already serialises through
pydantic-core (measured 20 us for a k=10 answer; ``json.dumps`` of the same dict: 38 us).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hmac
import importlib.util
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from genrec.errors import ConfigError
from genrec.serve.batcher import MicroBatcher
from genrec.serve.engine import Engine, InputError, RankingFailed
from genrec.serve.kv_pool import KVPool, StaleSlotError, pool_spec_for
from genrec.serve.schemas import RankRequest, RankResponse, RecommendRequest, RecommendResponse
from genrec.serve.swap import BundleHolder
from genrec.serve.workers import RankerClient, RankerUnavailable

log = logging.getLogger("genrec.serve")

STAGES = ("encode", "sid", "ann", "rank", "total")


def default_threads(device: str = "cpu") -> int:
    """How many requests run inference at once when ``--threads`` is not given: ``min(4, os.cpu_count())``.

    Not 1 where there are 2 cores or more: on the 2-core CPU box one request thread (with torch's 2
    intra-op threads) stalled under other load, 1-25 QPS; a few request threads also keep a GPU fed while
    others do their host work. Beyond 4 they only queue on the GIL. The threads inside each forward are
    :func:`default_torch_threads`'s."""
    return min(4, max(1, os.cpu_count() or 1))


def default_torch_threads(device: str = "cpu", threads: int | None = None, workers: int = 1) -> int:
    """torch's intra-op threads in a serving process when ``--torch-threads`` is not given; 0 = leave torch's
    default (a thread per core).

    CPU: ``os.cpu_count() // (threads * workers)``, at least 1, so that the forwards running side by side
    together use each core once instead of each spreading over every core. Measured on the 2-core CPU box
    (quickstart model, loopback, closed-loop clients, issue 38): 2 request threads x 1 torch thread gave
    75-106 QPS at 1 to 4 clients; the earlier 2 x 2 (torch's default) 41-46 QPS at 1 client and 75-83 at
    2 and 4. Re-measure: ``genrec bench serve RUN --duration 20 --concurrency 2`` against the same with
    ``--torch-threads 2`` (and ``--client httpx``). CUDA: 0, the forward runs on the GPU."""
    if str(device).startswith("cuda"):
        return 0
    t = default_threads(device) if threads is None else max(1, threads)
    return max(1, max(1, os.cpu_count() or 1) // (t * max(1, workers)))


@dataclass
class ServeConfig:
    workdir: Path
    checkpoint: Path | None = None
    device: str = "cpu"
    two_process: bool = False
    max_body_bytes: int = 1 << 20
    threads: int = 0  # requests running inference at once; 0 = default_threads(device)
    # torch.set_num_threads in the serving process (serve(), app_from_env), 0 = leave torch's; the CLI's
    # default is default_torch_threads(device, threads, workers)
    torch_threads: int = 0
    pool_slots: int = 16
    # two-process K/V pool: "cpu" = shared memory, the ranking process ranks on the CPU; "cuda" = the
    # pool on the server's GPU, shared through CUDA IPC handles, ranked there; "auto" = the server's device
    kv_pool_device: str = "auto"
    rank_timeout_s: float = 2.0
    stale_retries: int = 3
    pool_dir: Path | None = None
    micro_batch: int = 1  # > 1: group up to this many concurrent one-process requests into one forward
    # "busy": batch only requests that queued while a batch ran, no timer; "timed": the first request
    # of a group waits up to micro_batch_wait_ms for more (see genrec.serve.batcher)
    micro_batch_policy: str = "timed"
    micro_batch_wait_ms: float = 2.0  # timed policy only
    gc_freeze: bool = True  # move the loaded bundle out of the GC's sight (see freeze_heap)
    # /admin/reload needs "Authorization: Bearer <admin_token>" when set (default: $GENREC_ADMIN_TOKEN); unset,
    # it is open to whoever reaches the port (loopback by default)
    admin_token: str | None = dataclasses.field(default_factory=lambda: os.environ.get("GENREC_ADMIN_TOKEN") or None)
    workers: int = 1  # uvicorn worker processes (serve()'s argument): > 1 refuses /admin/reload (SIGHUP the main one)
    # print start-up lines on stderr (what was loaded, on which device, when it is ready): `genrec serve` does;
    # serve() sets the URL it listens on here, for the lines of --workers > 1 (each worker says when it is ready)
    announce: bool = False
    url: str | None = None


def freeze_heap() -> None:
    """Collect, then ``gc.freeze()`` everything alive: the loaded bundle (model, catalogue, indexes:
    ~315k tracked objects for the quickstart model) is never scanned again by the cyclic GC.

    Each request allocates thousands of short-lived objects, so the oldest generation gets
    collected now and then, and unfrozen that walks the whole heap. Measured on the 2-core CPU
    box (quickstart bundle, 1,000-item requests, history items still pydantic models): a full
    collection every ~50 requests, ~165 ms each (3.4 ms per request on average, and the p99);
    frozen, ~2.6 ms each. Reference counting still frees frozen objects; only cyclic garbage among
    them waits for the next :func:`thaw_and_freeze`."""
    gc.collect()
    gc.freeze()


def thaw_and_freeze() -> None:
    """After a hot swap: unfreeze (so cycles in the old bundle can be collected), collect, refreeze.
    One full collection per swap: a pause of the order of the ~165 ms above."""
    gc.unfreeze()
    freeze_heap()


def uvicorn_impl() -> dict[str, Any]:
    """uvicorn's HTTP parser and event loop, chosen explicitly: httptools / uvloop when installed
    (C extensions, faster), else the pure-Python h11 parser and the asyncio loop (what uvicorn's
    ``auto`` picks too; named here so the benchmark can report what ran)."""
    has = lambda m: importlib.util.find_spec(m) is not None  # noqa: E731
    return {"http": "httptools" if has("httptools") else "h11",
            "loop": "uvloop" if has("uvloop") else "asyncio"}


class BodyLimit:
    """Pure ASGI middleware: 413 when Content-Length or the streamed body exceeds ``limit`` bytes."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

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
                    return await _send_json(send, 413, _too_big(self.limit, n))
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
                return await _send_json(send, 413, _too_big(self.limit, seen))
        body = b"".join(chunks)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
            if self._paths is None:
                self._paths = self._paths_of()
            path = scope["path"]
            m.requests.labels(endpoint=path if path in self._paths else "other", status=str(status)).inc()


def _too_big(limit: int, n: int) -> dict[str, Any]:
    return {"error": "payload too large", "message": f"request body of {n} bytes exceeds the limit of {limit} bytes",
            "fields": ["body"]}


async def _send_json(send: Callable, status: int, obj: dict[str, Any]) -> None:
    import json

    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


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
        self.index_version = Gauge("genrec_index_version_info", "Served bundle version (value 1)", ["version"],
                                   registry=r)
        self.degraded = Counter("genrec_degraded_responses", "Retrieval-only answers (ranker down)", registry=r)
        self.stale = Counter("genrec_kv_stale_reads", "Stale KV-slot reads (retried)", registry=r)
        self.reloads = Counter("genrec_reloads", "Hot-swap attempts by outcome", ["outcome"], registry=r)

    def set_version(self, v: str) -> None:
        self.index_version.clear()
        self.index_version.labels(version=v).set(1)


class Service:
    """Everything the routes share: the bundle holder, metrics, and (two-process mode) pool + ranker."""

    def __init__(self, cfg: ServeConfig, holder: BundleHolder | None = None) -> None:
        if cfg.kv_pool_device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"kv_pool_device must be 'auto', 'cpu' or 'cuda', got {cfg.kv_pool_device!r}")
        if cfg.kv_pool_device == "cuda" and not str(cfg.device).startswith("cuda"):
            raise ConfigError("kv_pool_device 'cuda' needs the server on a GPU (--device cuda)")
        on_gpu = str(cfg.device).startswith("cuda")
        self.pool_on_gpu = cfg.kv_pool_device == "cuda" or (cfg.kv_pool_device == "auto" and on_gpu)
        if cfg.threads < 0:
            raise ConfigError(f"threads must be >= 0 (0 = from the machine), got {cfg.threads}")
        if cfg.threads == 0:
            cfg = dataclasses.replace(cfg, threads=default_threads(cfg.device))
        self.cfg = cfg
        self.holder = holder or BundleHolder(cfg.workdir, cfg.checkpoint, cfg.device)
        self.metrics = Metrics()
        self.batcher = (MicroBatcher(cfg.micro_batch, cfg.micro_batch_wait_ms, cfg.micro_batch_policy)
                        if cfg.micro_batch > 1 else None)
        # with micro-batching, up to micro_batch request threads wait together for one batched forward
        self.limiter = anyio.CapacityLimiter(max(1, cfg.threads, cfg.micro_batch if self.batcher else 1))
        self.pool: KVPool | None = None
        self.ranker: RankerClient | None = None
        self._pool_lock = threading.Lock()
        self._tmp: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        b = self.holder.current if self.holder.ready else self.holder.load_initial()
        self.metrics.set_version(b.version)
        if self.cfg.two_process:
            self._ensure_pool(b.engine)
            self.ranker = RankerClient(timeout_s=self.cfg.rank_timeout_s).start()
            self.ranker.wait_ready()
            # the ranking process loads the served model now, not on its first request (which would
            # otherwise wait out the load and could time out into a degraded answer); likewise after a
            # restart, and for a hot-swapped model before the swap
            self._warm_ranker(b.engine)
            self.ranker.after_restart = lambda: self._warm_ranker(self.holder.current.engine)
            self.holder.before_swap = self._warm_ranker
        if self.cfg.gc_freeze:
            freeze_heap()

    def stop(self) -> None:
        if self.cfg.gc_freeze:
            gc.unfreeze()  # hand the heap back to the cyclic GC (matters when the process outlives the app)
        if self.ranker is not None:
            self.ranker.stop()
        if self.pool is not None:
            self.pool.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _warm_ranker(self, eng: Engine) -> None:
        if self.ranker is not None:
            self.ranker.warm(self._ensure_pool(eng), eng.checkpoint, digest=eng.weights_digest)

    def _ensure_pool(self, eng: Engine) -> KVPool:
        # the ranking process ranks on the pool's device (see genrec.serve.workers.ranker_main)
        spec = pool_spec_for(eng.cfg, self.cfg.pool_slots, eng.cfg.max_items,
                             device=str(eng.rec.device) if self.pool_on_gpu else "cpu")
        with self._pool_lock:
            if self.pool is not None and self.pool.spec == spec:
                return self.pool
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="genrec-serve-", dir=self.cfg.pool_dir)
            path = Path(self._tmp.name) / f"pool-{os.getpid()}-{time.monotonic_ns()}.json"
            old, self.pool = self.pool, KVPool.create(spec, path)
            if old is not None:  # a swapped-in model of another shape: free the old pool once in-flight work is done
                t = threading.Timer(max(30.0, 10 * self.cfg.rank_timeout_s), old.close)
                t.daemon = True
                t.start()
            self.metrics.pool_slots.set(spec.slots)
            return self.pool

    # ------------------------------------------------------------------ request paths (run in threads)
    def recommend(self, req: RecommendRequest) -> dict[str, Any]:
        bundle = self.holder.current  # taken ONCE: the request finishes on this version
        eng = bundle.engine
        hist = req.history  # plain dicts (HistoryItem is a TypedDict)
        fusion = None if req.fusion is None else req.fusion.model_dump()
        kw: dict[str, Any] = dict(k=req.k, beam_width=req.beam_width, diversity_lambda=req.diversity_lambda,
                                  sources=req.sources, surface=req.surface, request_ts=req.request_ts, fusion=fusion,
                                  exclude_history=req.exclude_history)
        degraded = False
        if self.batcher is not None and not (self.cfg.two_process and req.rank):
            key = (id(eng), req.k, req.beam_width, req.diversity_lambda, tuple(req.sources), req.rank,
                   req.surface, req.request_ts, None if fusion is None else tuple(sorted(fusion.items())),
                   req.exclude_history)
            out = self.batcher.submit(key, hist, lambda hs: eng.recommend_many(hs, rank=req.rank, **kw))
        elif not (self.cfg.two_process and req.rank):
            out = eng.recommend(hist, rank=req.rank, **kw)  # type: ignore[arg-type]
        else:
            try:
                out = eng.recommend(hist, rank=True, remote_rank=self._remote_rank(eng), **kw)  # type: ignore[arg-type]
            except RankingFailed as e:
                # retrieval-only answer (re-encodes once: only on this degraded path)
                log.warning("ranking failed, answering retrieval-only (degraded): %s", e)
                degraded = True
                self.metrics.degraded.inc()
                out = eng.recommend(hist, rank=False, **kw)  # type: ignore[arg-type]
        out.update(degraded=degraded, index_version=bundle.version)
        return out

    def _remote_rank(self, eng: Engine) -> Callable[..., torch.Tensor]:
        pool = self._ensure_pool(eng)
        ranker = self.ranker
        assert ranker is not None

        def remote(cache: Any, vecs: np.ndarray, sid: np.ndarray | None, surface: int,
                   request_ts: int | None) -> torch.Tensor:
            for _ in range(self.cfg.stale_retries + 1):
                try:
                    lease = pool.lease()
                except StaleSlotError:  # every slot busy being written: count it as a stale try
                    self.metrics.stale.inc()
                    continue
                self.metrics.pool_occupancy.set(pool.occupancy())
                try:
                    pool.write(lease, cache)  # the one encode's KV, shared with the ranking process
                    return torch.from_numpy(ranker.rank(pool, lease, eng.checkpoint, vecs, sid, surface, request_ts,
                                                        digest=eng.weights_digest))
                except StaleSlotError:
                    self.metrics.stale.inc()  # slot recycled under us: rewrite into a fresh slot
                except RankerUnavailable as e:
                    raise RankingFailed(str(e)) from e
                finally:
                    pool.release(lease)
                    self.metrics.pool_occupancy.set(pool.occupancy())
            raise RankingFailed(f"KV slot stale {self.cfg.stale_retries + 1} times")

        return remote

    def rank(self, req: RankRequest) -> dict[str, Any]:
        bundle = self.holder.current
        t0 = time.perf_counter()
        out = bundle.engine.rank_items(req.history, req.candidates, req.surface, req.request_ts)
        ms = (time.perf_counter() - t0) * 1e3
        out.update(index_version=bundle.version, timings_ms={"rank": ms, "total": ms})
        return out

    def reload(self) -> dict[str, Any]:
        res = self.holder.reload()
        self.metrics.reloads.labels(outcome="ok" if res["ok"] else "failed").inc()
        if res["ok"]:
            self.metrics.set_version(self.holder.current.version)
            if self.cfg.gc_freeze and res.get("swapped"):
                thaw_and_freeze()
        return res


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(x) for x in loc if x != "body"]
    out = ""
    for x in parts:
        out += f"[{x}]" if x.isdigit() else (f".{x}" if out else x)
    return out or "body"


def create_app(cfg: ServeConfig, holder: BundleHolder | None = None) -> FastAPI:
    """The ASGI app (bundle loaded at startup; two-process mode starts the ranker)."""
    svc = Service(cfg, holder)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # SIGHUP's handler goes in before the bundle loads (minutes for a large model with CUDA graphs
        # to warm): the default action would end the process. A SIGHUP during the load means "a newer
        # checkpoint is there": one reload runs once the first load is done.
        loaded, hup_pending = threading.Event(), threading.Event()

        def on_hup() -> None:
            if loaded.is_set():
                threading.Thread(target=svc.reload, name="genrec-reload", daemon=True).start()
            else:
                hup_pending.set()

        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, on_hup)
        await anyio.to_thread.run_sync(svc.start)
        loaded.set()
        if cfg.announce:
            _announce_loaded(svc)
        if hup_pending.is_set():
            log.warning("SIGHUP arrived while the bundle was loading: reloading now")
            on_hup()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(svc.stop)

    app = FastAPI(title="genrec", lifespan=lifespan)
    app.state.service = svc

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        fields = ["body" if e.get("type") == "json_invalid" else _field_of(tuple(e.get("loc", ()))) for e in errs]
        msg = "; ".join(f"{f}: {e.get('msg', 'invalid')}" for f, e in zip(fields[:5], errs[:5]))
        if len(errs) > 5:
            msg += f"; ... {len(errs) - 5} more"
        return JSONResponse({"error": "invalid request", "message": msg, "fields": fields[:20]}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        fields = ["body"] if exc.status_code == 400 else []  # e.g. a body that is not UTF-8 / not parseable
        return JSONResponse({"error": "http error", "message": str(exc.detail), "fields": fields},
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(InputError)
    async def _bad_input(request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"error": "invalid request", "message": str(exc), "fields": [exc.field]}, status_code=422)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": "internal error", "message": f"{type(exc).__name__}: {exc}"}, status_code=500)

    def _observe(endpoint: str, timings: dict[str, float]) -> None:
        for s in STAGES:
            if s in timings:
                svc.metrics.stage.labels(endpoint=endpoint, stage=s).observe(float(timings[s]))

    @app.post("/v1/recommend", response_model=RecommendResponse)
    async def recommend(req: RecommendRequest) -> dict[str, Any]:
        out = await anyio.to_thread.run_sync(svc.recommend, req, limiter=svc.limiter)
        _observe("recommend", out["timings_ms"])
        return out

    @app.post("/v1/rank", response_model=RankResponse)
    async def rank(req: RankRequest) -> dict[str, Any]:
        out = await anyio.to_thread.run_sync(svc.rank, req, limiter=svc.limiter)
        _observe("rank", out["timings_ms"])
        return out

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready = svc.holder.ready and (svc.ranker is None or svc.ranker.alive)
        ranker = None if svc.ranker is None else {"alive": svc.ranker.alive, "pid": svc.ranker.pid,
                                                  "restarts": svc.ranker.restarts,
                                                  # False from a call that timed out to the next answer; hang_after
                                                  # timeouts in a row and the process is killed and restarted
                                                  "responsive": svc.ranker.responsive,
                                                  "timeouts_in_a_row": svc.ranker.timeouts_in_a_row,
                                                  "hang_kills": svc.ranker.hang_kills}
        body: dict[str, Any] = {"ready": ready, "ranker": ranker, "last_reload_error": svc.holder.last_error,
                                "index_version": svc.holder.current.version if svc.holder.ready else None}
        if svc.holder.ready:  # the L1 score fusion this version ranks with (genrec fusion tune / defaults)
            rec = svc.holder.current.engine.rec
            fusion: dict[str, Any] = dataclasses.asdict(rec.fusion)
            fusion["stored"] = None if rec.fusion_path is None else str(rec.fusion_path)
            fusion["utility"] = rec.default_utility()
            body["l1_fusion"] = fusion
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        if svc.pool is not None:
            svc.metrics.pool_occupancy.set(svc.pool.occupancy())
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/reload")
    async def reload(request: Request) -> JSONResponse:
        if cfg.admin_token is not None and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(), f"Bearer {cfg.admin_token}".encode()):
            return JSONResponse({"error": "unauthorized", "message": "/admin/reload needs the header "
                                 "'Authorization: Bearer <token>' (the server's --admin-token)", "fields": []},
                                status_code=401)
        if cfg.workers > 1:  # this request reaches one worker; the others would keep the old version
            return JSONResponse({"ok": False, "version": svc.holder.current.version if svc.holder.ready else None,
                                 "error": f"this server runs {cfg.workers} worker processes and /admin/reload reaches "
                                          f"only one of them: send SIGHUP to the main process (pid {os.getppid()}), "
                                          "which restarts every worker on the newest checkpoint and SID version"},
                                status_code=409)
        res = await anyio.to_thread.run_sync(svc.reload)  # not on the inference limiter: never queued behind load
        return JSONResponse(res, status_code=200 if res["ok"] else 409)

    wrapped = Track(BodyLimit(app, cfg.max_body_bytes), svc.metrics,
                    lambda: {p for r in app.routes if isinstance(p := getattr(r, "path", None), str)})
    wrapped.service = svc  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]


def _say(msg: str) -> None:
    print(f"genrec serve: {msg}", file=sys.stderr, flush=True)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _announce_loaded(svc: Service) -> None:
    """The start-up line once the bundle is loaded: the checkpoint, the served index_version, the device."""
    b = svc.holder.current
    rec = b.engine.rec
    tt = torch.get_num_threads()
    what = (f"loaded checkpoint {b.engine.checkpoint} (step {getattr(rec, 'step', '?')}), index_version "
            f"{b.version}, device {getattr(rec, 'device', svc.cfg.device)}, {svc.cfg.threads} request "
            f"thread{'' if svc.cfg.threads == 1 else 's'} x {tt} torch thread{'' if tt == 1 else 's'}"
            + (", ranking in a second process" if svc.cfg.two_process else ""))
    if svc.cfg.workers > 1:  # uvicorn's main process holds the socket already: this worker serves from now on
        _say(f"worker {os.getpid()} {what}; ready on {svc.cfg.url}")
    else:
        _say(what)


def uvicorn_log_config(access_log: bool) -> dict[str, Any]:
    """uvicorn's logging: its own messages from WARNING up (on stderr); with ``access_log`` one line per
    request on stdout (uvicorn's access log, at INFO: a plain ``log_level="warning"`` would hide it)."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    conf = copy.deepcopy(LOGGING_CONFIG)
    conf["loggers"]["uvicorn"]["level"] = "WARNING"
    conf["loggers"]["uvicorn.error"]["level"] = "WARNING"
    conf["loggers"]["uvicorn.access"]["level"] = "INFO" if access_log else "WARNING"
    return conf


def serve(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
          access_log: bool = False) -> None:
    """Run uvicorn (``workers > 1``: independent processes, each with its own bundle). With ``cfg.announce``
    it says on stderr where it listens, what it loaded and when it is ready."""
    import json

    url = _url(host, port)
    # (`genrec serve` ignores SIGHUP until the lifespan handles it)
    cfg = dataclasses.replace(cfg, workers=workers, url=url)
    log_kw: dict[str, Any] = {"log_level": None, "log_config": uvicorn_log_config(access_log),
                              "access_log": access_log}
    if cfg.announce:
        _say(f"starting on {url}: loading {cfg.checkpoint or Path(cfg.workdir) / 'checkpoints'} on {cfg.device}"
             + (f" in {workers} worker processes" if workers > 1 else "")
             + f" (access log {'on, to stdout' if access_log else 'off'}) ...")
    if workers > 1:
        os.environ["GENREC_SERVE_CONFIG"] = json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                                        for k, v in cfg.__dict__.items()})
        uvicorn.run("genrec.serve.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                    **log_kw, **uvicorn_impl())
        return
    app = _process_app(cfg)
    server = _AnnouncingServer(uvicorn.Config(app, host=host, port=port, **log_kw, **uvicorn_impl()),
                               service=app.service if cfg.announce else None)  # type: ignore[attr-defined]
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(3)  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits


class _AnnouncingServer(uvicorn.Server):
    """A uvicorn server that says "ready" with the URL it listens on once its socket is bound (after the
    lifespan loaded the bundle): from that moment requests are answered."""

    def __init__(self, config: uvicorn.Config, service: Service | None) -> None:
        super().__init__(config)
        self.service = service  # None: say nothing

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.service is None or self.should_exit or not self.service.holder.ready:
            return
        bound = [sock.getsockname() for srv in getattr(self, "servers", []) for sock in (srv.sockets or [])]
        where = ", ".join(_url(str(a[0]), int(a[1])) for a in bound if isinstance(a, tuple)) or \
            _url(self.config.host, self.config.port)
        _say(f"ready on {where}, serving index_version {self.service.holder.current.version} "
             "(POST /v1/recommend, GET /readyz; Ctrl-C stops)")


def app_from_env() -> FastAPI:
    """uvicorn factory for ``--workers > 1`` (config passed in ``GENREC_SERVE_CONFIG``)."""
    import json

    d = json.loads(os.environ["GENREC_SERVE_CONFIG"])
    for k in ("workdir", "checkpoint", "pool_dir"):
        if d.get(k) is not None:
            d[k] = Path(d[k])
    return _process_app(ServeConfig(**d))


def _process_app(cfg: ServeConfig) -> FastAPI:
    """The app of one server process (``serve``'s, or each ``--workers`` process's): torch's threads set for
    the process first (``cfg.torch_threads``; 0 leaves torch's default)."""
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    return create_app(cfg)

