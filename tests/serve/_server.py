"""A real uvicorn server on a free loopback port, in a thread (tests only)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    def __init__(self, app: Any, **uvicorn_kw: Any) -> None:
        """``uvicorn_kw``: e.g. ``http="h11", loop="asyncio"`` (default: uvicorn's ``auto``)."""
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on", timeout_graceful_shutdown=5, **uvicorn_kw))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        t_end = time.time() + 120
        while not self.server.started:
            if time.time() > t_end or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serving(cfg: Any, **uvicorn_kw: Any) -> Iterator[ServerThread]:
    """For a fixture: ``yield from serving(ServeConfig(...))`` -- the app of ``cfg`` served on loopback,
    its Service at ``.service``."""
    from genrec.serve.app import create_app

    app = create_app(cfg)
    with ServerThread(app, **uvicorn_kw) as s:
        s.service = app.service  # type: ignore[attr-defined]
        yield s


def http_client(server: ServerThread) -> Iterator[httpx.Client]:
    """For a fixture: ``yield from http_client(server)``."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
