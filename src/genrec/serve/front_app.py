"""A front process's app (``genrec serve --fronts N``, :mod:`genrec.serve.fronts`): the two inference routes read and
validate the body here and ask the engine process; every other path is passed on to the engine's own app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from genrec.infer.cases import SourceIds
from genrec.serve.app import install_inference_routes
from genrec.serve.errors import install_error_handlers
from genrec.serve.fronts import EngineGone, FrontLink
from genrec.serve.middleware import PROXIED, BodyLimit, Metrics, Track
from genrec.serve.schemas import api_models
from genrec.serve.service import Refreeze

__all__ = ["compact", "create_front_app"]

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "content-length"})
"""Headers that describe one connection, not the request or answer (RFC 9110 §7.6.1), and the length, which the
message is sent with anew."""
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def compact(op: str, req: Any) -> Any:
    """A recommend request whose ``history_columns`` ids are all integers, with those ids as one int64 array: it
    travels to the engine and is parsed there at once (a list of 1,000 ints is unpickled and converted item by
    item). The same request otherwise; explained requests (their answers echo the history) go as they came."""
    hc = getattr(req, "history_columns", None)
    if op != "recommend" or hc is None or req.explain or not all(type(i) is int for i in hc.item_id):
        return req
    ids = np.asarray(hc.item_id, dtype=np.int64)  # (the request model bounds an id to int64)
    return req.model_copy(update={"history_columns": hc.model_copy(update={"item_id": ids})})


def create_front_app(cfg: dict[str, Any], link: FrontLink, engine_uds: str, metrics: Metrics) -> Any:
    """The ASGI app of one front: ``cfg`` is the server's :class:`~genrec.serve.config.ServeConfig` as a dict."""
    engine = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=engine_uds), base_url="http://engine",
                               timeout=None)
    # the engine's app documents every route (/docs, /openapi.json are passed on)
    app = FastAPI(title="genrec front", openapi_url=None, docs_url=None, redoc_url=None)
    install_error_handlers(app)

    @app.exception_handler(EngineGone)
    async def _gone(request: Request, exc: EngineGone) -> JSONResponse:
        return JSONResponse({"error": "unavailable", "message": str(exc), "fields": []}, status_code=503)

    remapped = SourceIds.remapped(Path(cfg["workdir"]))
    refreeze = Refreeze(bool(cfg.get("gc_freeze", True)))  # this front's heap frozen again after its first requests

    async def ask(op: str, req: Any) -> Any:
        out = await link.call(op, req if remapped else compact(op, req))
        refreeze.tick()
        return out

    install_inference_routes(app, api_models(remapped), ask)

    async def proxy(request: Request) -> Response:
        url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in HOP_BY_HOP]
        try:
            r = await engine.request(request.method, url, headers=headers, content=await request.body())
        except httpx.TransportError as e:
            raise EngineGone(f"the engine process did not answer ({type(e).__name__})") from None
        request.scope[PROXIED] = True  # the engine's app counted it
        out = Response(r.content, status_code=r.status_code)
        del out.headers["content-length"]
        for k, v in r.headers.multi_items():
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-encoding":  # (httpx decoded the body)
                out.headers.append(k, v)
        out.headers["content-length"] = str(len(r.content))
        return out

    app.add_api_route("/{path:path}", proxy, methods=METHODS, include_in_schema=False)
    return Track(BodyLimit(app, int(cfg["max_body_bytes"])), metrics,
                 lambda: {p for r in app.routes if isinstance(p := getattr(r, "path", None), str)} - {"/{path:path}"})
