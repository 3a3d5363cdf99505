"""``genrec serve``: the FastAPI service (issue 6 items 1, 2, 5; UniPinRec §4 / PinGER §4 serving).

Endpoints: ``POST /v1/recommend`` (one history encode -> SID beams + ANN -> ranking on the same
KV cache), ``POST /v1/rank`` (score given candidates), ``GET /healthz`` (process up), ``/readyz``
(a bundle is loaded; in two-process mode also the ranker), ``/metrics`` (Prometheus: per-stage
latency histograms, in-flight gauge, KV-pool occupancy, index version, degraded/stale counters),
``POST /admin/reload`` (and SIGHUP) for the versioned hot swap (:mod:`genrec.serve.swap`); ``GET /``, the
explorer page, with ``/v1/users`` and ``/v1/users/{user_id}/history`` (:mod:`genrec.serve.explorer`).

Non-standard: inference runs on a bounded thread pool (the event loop never blocks on torch); a
pure-ASGI middleware enforces the body size limit (413) before any JSON parsing, also for chunked
bodies; every validation failure is a 4xx whose message names the field; any other exception is
a 500 for that request only. A request takes the served bundle once, at its start (hot swap).
``micro_batch > 1`` (the default: 32) groups concurrent requests into one batched forward (in two-process mode
too: one ranking call for the batch's rows) (:mod:`genrec.serve.batcher`; default policy ``busy``: requests that queued while a batch ran form the next batch, no
timer, no cost at one client; ``timed``: a group's first request waits up to ``micro_batch_wait_ms`` for more).

The routes live here; beside them: the configuration (:mod:`genrec.serve.config`), the shared state
(:mod:`genrec.serve.service`), the middleware and metrics (:mod:`genrec.serve.middleware`), the error
answers (:mod:`genrec.serve.errors`) and the request/response models (:mod:`genrec.serve.schemas`).

Per-request overhead (``benchmarks/bench_http_overhead.py``): request tracking is a pure ASGI
middleware (:class:`~genrec.serve.middleware.Track`, not Starlette's BaseHTTPMiddleware); the body is parsed and
validated in one pass from its bytes (:func:`json_body`, not FastAPI's ``json.loads`` + validation); the validated
history reaches the engine as the plain dicts pydantic checked (``HistoryItem`` is a TypedDict, no per-item
``model_dump``); once the bundle is loaded the heap is frozen out of the cyclic GC
(:func:`~genrec.serve.service.freeze_heap`: full collections had been ~165 ms stalls every ~50 requests on the CPU
box); uvicorn runs httptools/uvloop when installed, else h11/asyncio (:func:`uvicorn_impl`).
The response keeps FastAPI's ``response_model`` path: it already serialises through
pydantic-core (measured 20 us for a k=10 answer; ``json.dumps`` of the same dict: 38 us).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hmac
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import torch
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from uvicorn.config import LOGGING_CONFIG

from genrec.errors import ConfigError
from genrec.serve.config import ServeConfig
from genrec.serve.errors import install_error_handlers
from genrec.serve.explorer import install_explorer
from genrec.serve.fronts import EngineServer, engine_link_dir
from genrec.serve.middleware import BodyLimit, Track
from genrec.serve.schemas import RankRequest, RecommendRequest, api_models
from genrec.serve.service import Service
from genrec.serve.swap import BundleHolder

__all__ = ["create_app", "install_inference_routes", "serve", "uvicorn_impl", "uvicorn_log_config"]

log = logging.getLogger("genrec.serve")

_IDS_DOC = ("Item ids are the run's: int64 ids, or -- when `genrec data prepare` remapped them (string ids, "
            "`--map-ids`) -- the source file's ids as strings (a number is matched as its text), in the request "
            "and in every id of the answer.")
RECOMMEND_DOC = ("One encode of the history, then SID beam search and ANN retrieval over it, and the L1 ranking of "
                 "their union on the same KV cache. `items[].score` is the L1 score (see its schema), the same "
                 "number /v1/rank gives the item. " + _IDS_DOC)
RANK_DOC = ("Score the given candidates for the history by the L1 score /v1/recommend ranks by (same fusion "
            "weights; a candidate's score does not depend on the other candidates) and return them best first, ties "
            "in the request's order. With the SID weight > 0, the SID term reads the beams at `beam_width` / "
            "`diversity_lambda` (a candidate they miss takes their lowest log-probability, as in /v1/recommend). "
            "No known history item: a cold start, the known candidates by popularity. " + _IDS_DOC)


def uvicorn_impl() -> dict[str, Any]:
    """uvicorn's HTTP parser and event loop, chosen explicitly: httptools / uvloop when installed
    (C extensions, faster), else the pure-Python h11 parser and the asyncio loop (what uvicorn's
    ``auto`` picks too; named here so the benchmark can report what ran)."""
    has = lambda m: importlib.util.find_spec(m) is not None  # noqa: E731
    return {"http": "httptools" if has("httptools") else "h11",
            "loop": "uvloop" if has("uvloop") else "asyncio"}


def _is_json(content_type: str | None) -> bool:
    """A JSON media type (``application/json``, ``application/*+json``, parameters allowed), as FastAPI reads one."""
    if not content_type:
        return False
    mt = content_type.split(";", 1)[0].strip().lower()
    return mt == "application/json" or (mt.startswith("application/") and mt.endswith("+json"))


def json_body(model: type[BaseModel]) -> Callable[[Request], Awaitable[Any]]:
    """The request body as ``model``, validated straight from its bytes: pydantic-core parses the JSON and checks
    the fields in one pass (FastAPI's own body handling parses it with ``json.loads`` and then validates the Python
    objects: at a 1,000-event history 0.45 + 0.66 ms on the CPU box, one pass 0.58 ms, ``bench_http_overhead.py``).
    The errors are FastAPI's: a 422 whose locations start at ``body``, a body that is not JSON (or not sent as JSON)
    named ``body``."""
    async def body(request: Request) -> Any:
        raw = await request.body()
        if not raw:
            raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
        if not _is_json(request.headers.get("content-type")):
            raise RequestValidationError([{"type": "model_attributes_type", "loc": ("body",),
                                           "msg": "Input should be a valid dictionary or object to extract fields "
                                                  "from (send it as Content-Type: application/json)"}])
        try:
            return model.model_validate_json(raw)
        except ValidationError as e:
            raise RequestValidationError([{"type": err["type"], "loc": ("body", *err["loc"]), "msg": err["msg"]}
                                          for err in e.errors(include_url=False, include_input=False)]) from None

    return body


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads ``model`` by :func:`json_body`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def document_bodies(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Put ``models``' JSON schemas (and the models they use) into ``app``'s OpenAPI components, where the
    routes' :func:`body_doc` points."""
    default = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = default()
            comps = spec.setdefault("components", {}).setdefault("schemas", {})
            for m in models:
                sch = m.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, sub in sch.pop("$defs", {}).items():
                    comps.setdefault(name, sub)
                comps[m.__name__] = sch
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def install_inference_routes(app: FastAPI, models: Any, infer: Callable[[str, Any], Awaitable[dict[str, Any]]]) -> None:
    """``POST /v1/recommend`` and ``POST /v1/rank`` on ``app``: the body read by :func:`json_body` as ``models``'
    request (:func:`genrec.serve.schemas.api_models`), ``await infer("recommend" | "rank", request)`` answered
    through the response model. The one-process app's ``infer`` runs the engine in a thread; a front process's
    (:mod:`genrec.serve.fronts`) asks the engine process."""

    async def recommend(req: RecommendRequest = Depends(json_body(models.recommend_request))) -> dict[str, Any]:
        return await infer("recommend", req)

    async def rank(req: RankRequest = Depends(json_body(models.rank_request))) -> dict[str, Any]:
        return await infer("rank", req)

    app.post("/v1/recommend", response_model=models.recommend_response, summary="Recommend items for a history",
             description=RECOMMEND_DOC, openapi_extra=body_doc(models.recommend_request))(recommend)
    app.post("/v1/rank", response_model=models.rank_response, summary="Rank given candidates for a history",
             description=RANK_DOC, openapi_extra=body_doc(models.rank_request))(rank)
    document_bodies(app, (models.recommend_request, models.rank_request))


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

    install_error_handlers(app)
    install_explorer(app, svc)

    async def infer(op: str, req: Any) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(svc.infer, op, req, limiter=svc.limiter)

    # the bodies of this run's kind of ids: the tables' integers, or the source file's ids when they were remapped
    install_inference_routes(app, api_models(svc.source_ids), infer)

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
                                "index_version": svc.holder.current.version if svc.holder.ready else None,
                                # checkpoint, tables and SID versions served, and those the checkpoint was trained on
                                "versions": svc.holder.current.engine.versions(svc.holder.workdir)
                                if svc.holder.ready else None}
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
        svc.gc_pauses.drain(svc.metrics.gc_pause_ms)  # this process's (the fronts' and the ranking process's are theirs)
        if svc.holder.ready:  # this process's graphs (two-process mode's ranking process keeps its own)
            for stage, n in svc.holder.current.engine.rec.graph_captures.items():
                svc.metrics.graph_captures.labels(stage=stage).set(n)
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
    conf = copy.deepcopy(LOGGING_CONFIG)
    conf["loggers"]["uvicorn"]["level"] = "WARNING"
    conf["loggers"]["uvicorn.error"]["level"] = "WARNING"
    conf["loggers"]["uvicorn.access"]["level"] = "INFO" if access_log else "WARNING"
    return conf


def serve(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
          access_log: bool = False, fronts: int = 0) -> None:
    """Run uvicorn (``workers > 1``: independent processes, each with its own bundle; ``fronts > 0``: this process
    runs the model and ``fronts`` processes answer HTTP, :mod:`genrec.serve.fronts`). With ``cfg.announce`` it says
    on stderr where it listens, what it loaded and when it is ready."""
    if fronts > 0 and workers > 1:
        raise ConfigError("--fronts and --workers > 1 do not go together: --fronts N is one model, N HTTP processes")
    url = _url(host, port)
    # (`genrec serve` ignores SIGHUP until the lifespan handles it)
    cfg = dataclasses.replace(cfg, workers=workers, url=url)
    log_kw: dict[str, Any] = {"log_level": None, "log_config": uvicorn_log_config(access_log),
                              "access_log": access_log}
    if cfg.announce:
        _say(f"starting on {url}: loading {cfg.checkpoint or Path(cfg.workdir) / 'checkpoints'} on {cfg.device}"
             + (f" in {workers} worker processes" if workers > 1 else "")
             + (f", with {fronts} front processes for HTTP" if fronts > 0 else "")
             + f" (access log {'on, to stdout' if access_log else 'off'}) ...")
    if workers > 1:
        os.environ["GENREC_SERVE_CONFIG"] = json.dumps(_plain(cfg))
        uvicorn.run("genrec.serve.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                    **log_kw, **uvicorn_impl())
        return
    if fronts > 0:
        return _serve_with_fronts(cfg, host, port, fronts, log_kw)
    app = _process_app(cfg)
    server = _AnnouncingServer(uvicorn.Config(app, host=host, port=port, **log_kw, **uvicorn_impl()),
                               service=app.service if cfg.announce else None)  # type: ignore[attr-defined]
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(3)  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits


def _plain(cfg: ServeConfig) -> dict[str, Any]:
    """``cfg`` as plain values (paths as text): for another process (:func:`app_from_env`, the fronts)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()}


def _serve_with_fronts(cfg: ServeConfig, host: str, port: int, fronts: int, log_kw: dict[str, Any]) -> None:
    """This process loads the bundle and serves its whole app on a private Unix socket; ``fronts`` processes
    answer the public port (:class:`genrec.serve.fronts.EngineServer` starts them once the bundle is loaded)."""
    where = engine_link_dir()
    app = _process_app(cfg)
    front_args = {"cfg": _plain(cfg),
                  "log_config": log_kw["log_config"], "impl": uvicorn_impl()}
    server = EngineServer(uvicorn.Config(app, uds=os.path.join(where, "engine.sock"), **log_kw, **uvicorn_impl()),
                          service=app.service, fronts=fronts, host=host, port=port,  # type: ignore[attr-defined]
                          front_args=front_args, link_dir=where, say=_say if cfg.announce else None)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if not server.started:
        sys.exit(3)


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
    d = json.loads(os.environ["GENREC_SERVE_CONFIG"])
    for k in ("workdir", "pool_dir"):  # (checkpoint stays as given: a name or a path, find_checkpoint's rule)
        if d.get(k) is not None:
            d[k] = Path(d[k])
    return _process_app(ServeConfig(**d))


def _process_app(cfg: ServeConfig) -> FastAPI:
    """The app of one server process (``serve``'s, or each ``--workers`` process's): torch's threads set for
    the process first (``cfg.torch_threads``; 0 leaves torch's default)."""
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    return create_app(cfg)
