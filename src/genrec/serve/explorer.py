"""The explorer page (issue 41 item 1): ``GET /`` serves a plain HTML page and its script (``static/``, no build
step, nothing from a CDN) that picks a user of the run, or takes a pasted history, and shows what
``/v1/recommend`` with ``"explain": true`` found: the history with titles, the SID beams (codes, log-probs), the
ANN items (scores), the ranked list (per-action probabilities, the stages that found each item) and each
stage's latency.

Two read-only JSON routes feed the picker, from the served run's tables: ``GET /v1/users`` (the users, with
their event counts) and ``GET /v1/users/{user_id}/history`` (one user's events, oldest first, with titles).
They hand out users' histories, so they answer loopback clients only (403 otherwise), whatever ``--host``
the server binds: a remote reader tunnels in (``ssh -L``). The page itself and ``/v1/recommend`` answer as
before. A run whose ids were remapped speaks the source file's user and item ids here too.
"""

from __future__ import annotations

import ipaddress
import threading
from importlib import resources
from typing import Any

import anyio
import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from genrec.catalog import open_store
from genrec.errors import DataError
from genrec.infer.cases import SourceIds, user_history
from genrec.serve.explain import AnyItemId
from genrec.serve.schemas import MAX_HISTORY
from genrec.serve.service import Service

__all__ = ["install_explorer", "is_loopback"]

PAGE = "index.html"


class UserEntry(BaseModel):
    user_id: AnyItemId = Field(description="The user's id (the source file's, text, for a run whose ids were "
                                           "remapped).")
    events: int = Field(description="How many events the run's tables hold for the user.")


class UsersResponse(BaseModel):
    users: list[UserEntry] = Field(description="The run's users in the tables' order, from `offset` on.")
    total: int = Field(description="How many users the run has.")
    offset: int = Field(description="The first user's place in that order.")


class UserEvent(BaseModel):
    item_id: AnyItemId = Field(description="The item's id (the source file's for a remapped run).")
    title: str | None = Field(description="The catalogue's title (null: none).")
    action: str = Field(description="The event's action.")
    surface: str = Field(description="The surface it happened on.")
    ts: int = Field(description="Its time, epoch seconds.")


class UserHistoryResponse(BaseModel):
    user_id: AnyItemId = Field(description="The user, as asked for.")
    events: int = Field(description="How many events the user has.")
    history: list[UserEvent] = Field(description="The newest `limit` of them, oldest first: a /v1/recommend "
                                                 "`history` as it is (item_id, action, surface, ts).")
    context_len: int = Field(description="How many of the newest known items the served model reads.")


def is_loopback(request: Request) -> bool:
    """Whether the request comes from this machine (127.0.0.0/8, ::1, or IPv4-mapped 127.x)."""
    host = request.client.host if request.client is not None else ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _refuse(status: int, error: str, message: str, fields: list[str]) -> JSONResponse:
    return JSONResponse({"error": error, "message": message, "fields": fields}, status_code=status)


class _RunUsers:
    """The served run's users (ids, event counts) and its source-id maps, read once per served version."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self._lock = threading.Lock()
        self._version: str | None = None
        self._users: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._src: SourceIds | None = None

    def _load(self) -> tuple[np.ndarray, np.ndarray, SourceIds | None]:
        version = self.svc.holder.current.version
        with self._lock:
            if self._version != version:
                wd = self.svc.cfg.workdir
                uid = open_store(wd).read_events(columns=["user_id"]).column("user_id").to_numpy()
                self._users = np.unique(uid, return_counts=True)
                self._src = SourceIds.of(wd)
                self._version = version
            return self._users[0], self._users[1], self._src

    def page(self, offset: int, limit: int) -> dict[str, Any]:
        uids, counts, src = self._load()
        names = None if src is None else {v: k for k, v in src.users.items()}
        sel = slice(offset, offset + limit)
        users = [{"user_id": int(u) if names is None else names.get(int(u), f"#{u}"), "events": int(c)}
                 for u, c in zip(uids[sel].tolist(), counts[sel].tolist())]
        return {"users": users, "total": int(len(uids)), "offset": offset}

    def history(self, user: str, limit: int) -> dict[str, Any]:
        _, _, src = self._load()
        if src is not None:
            uid = src.user(user)  # DataError naming user_id: not in the source data
            shown: Any = user
        else:
            uid = shown = int(user)  # the route checked it
        hist = user_history(self.svc.cfg.workdir, uid)  # DataError naming user_id: no events
        eng = self.svc.holder.current.engine
        cat = eng.rec.catalog
        newest = hist[-limit:]
        ids = np.asarray([h["item_id"] for h in newest], dtype=np.int64)
        rows = cat.rows(ids, strict=False) if len(ids) else np.zeros(0, np.int64)
        titles = [None if cat.titles is None or r < 0 else cat.titles[int(r)] for r in rows.tolist()]
        out_ids: list[Any] = ids.tolist()
        if src is not None:
            out_ids = [src.item_original.get(i, f"#{i}") for i in out_ids]
            out_ids = [str(i) for i in out_ids]
        events = [{"item_id": i, "title": t, "action": h["action"], "surface": h["surface"], "ts": h["ts"]}
                  for i, t, h in zip(out_ids, titles, newest)]
        return {"user_id": shown, "events": len(hist), "history": events, "context_len": eng.context_len}


def install_explorer(app: FastAPI, svc: Service) -> None:
    """``GET /`` (the page), ``/static/*`` (its script and style) and the two user routes, on ``app``."""
    static = resources.files("genrec.serve") / "static"
    page = (static / PAGE).read_text(encoding="utf-8")
    app.mount("/static", StaticFiles(packages=[("genrec.serve", "static")]), name="static")
    run_users = _RunUsers(svc)
    local_only = ("{} lists the run's users and their histories: it answers clients on this machine only "
                  "(tunnel in, e.g. `ssh -L 8000:127.0.0.1:8000 HOST`)")

    @app.get("/", include_in_schema=False)
    async def explorer_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/v1/users", response_model=UsersResponse, summary="The run's users (explorer)",
             description="The served run's users with their event counts, in the tables' order. Loopback "
                         "clients only.", responses={403: {"description": "Not a loopback client."}})
    async def users(request: Request, offset: int = Query(0, ge=0), limit: int = Query(100, ge=1, le=10_000)) -> Any:
        if not is_loopback(request):
            return _refuse(403, "forbidden", local_only.format("/v1/users"), [])
        return await anyio.to_thread.run_sync(run_users.page, offset, limit, limiter=svc.limiter)

    @app.get("/v1/users/{user_id}/history", response_model=UserHistoryResponse,
             summary="One user's events with titles (explorer)",
             description="The newest `limit` events of a user of the served run, oldest first, with the items' "
                         "titles: a /v1/recommend `history` as it is. Loopback clients only.",
             responses={403: {"description": "Not a loopback client."}, 404: {"description": "No such user."}})
    async def user_history_route(request: Request, user_id: str,
                                 limit: int = Query(200, ge=1, le=MAX_HISTORY)) -> Any:
        if not is_loopback(request):
            return _refuse(403, "forbidden", local_only.format("/v1/users/{user_id}/history"), [])
        if not svc.source_ids and not _is_int(user_id):
            return _refuse(422, "invalid request", f"user_id: {user_id!r} is not an integer (this run's user ids "
                                                   "are)", ["user_id"])
        try:
            return await anyio.to_thread.run_sync(run_users.history, user_id, limit, limiter=svc.limiter)
        except DataError as e:
            return _refuse(404, "not found", str(e), ["user_id"])
