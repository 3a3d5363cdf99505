"""How the service answers a request it cannot serve: every validation failure a 422 (or the HTTP error's
own 4xx) whose body names the fields at fault, an engine's :class:`~genrec.serve.engine.InputError` a 422
naming its field, and any other exception a 500 for that request only. Each body is
``{"error", "message", "fields"}``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from genrec.serve.engine import InputError

__all__ = ["install_error_handlers"]


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(x) for x in loc if x != "body"]
    out = ""
    for x in parts:
        out += f"[{x}]" if x.isdigit() else (f".{x}" if out else x)
    return out or "body"


def install_error_handlers(app: FastAPI) -> None:
    """The service's exception handlers on ``app``."""

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
