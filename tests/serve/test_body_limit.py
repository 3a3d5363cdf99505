"""An over-limit body gets its 413, not a connection reset, from a real uvicorn server (both of uvicorn's HTTP
parsers), whatever the client: one that sends the whole body before it reads the answer and then closes
(``Connection: close``, as ``urllib`` does), a keep-alive one (``requests``), and a chunked upload without a
Content-Length. A server that answered and closed with the body's rest unread made the kernel reset the
connection, and the client saw the reset instead of the 413."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from genrec.serve.config import ServeConfig
from genrec.serve.middleware import BodyLimit

from ._server import ServerThread, serving

LIMIT = ServeConfig.max_body_bytes  # the default limit (1 MiB)
BIG = 12 * 1000 * 1000  # a 12 MB body
TRIES = 5
PATH = "/v1/recommend"


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(run_dir: Path, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    loop = "uvloop" if request.param == "httptools" else "asyncio"
    yield from serving(ServeConfig(workdir=run_dir), http=request.param, loop=loop)


def _body() -> bytes:
    return b'{"history": [' + b" " * BIG + b"]}"


def _pieces() -> Iterator[bytes]:
    body = _body()
    for i in range(0, len(body), 1 << 16):
        yield body[i:i + (1 << 16)]


def _urllib(url: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url + PATH, data=_body(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _http_client(url: str, *, chunked: bool = False, expect: bool = False) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        headers = {"content-type": "application/json", "connection": "close"}
        if expect:  # (http.client sends the body without waiting for a "100 Continue": as the RFC allows)
            headers["expect"] = "100-continue"
        if chunked:
            c.request("POST", PATH, body=_pieces(), headers=headers, encode_chunked=True)
        else:
            c.request("POST", PATH, body=_body(), headers=headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _requests(url: str, *, chunked: bool = False) -> tuple[int, bytes]:
    r = requests.post(url + PATH, data=_pieces() if chunked else _body(),
                      headers={"content-type": "application/json"}, timeout=60)
    return r.status_code, r.content


CLIENTS: dict[str, Callable[[str], tuple[int, bytes]]] = {
    "urllib": _urllib,
    "http.client, Connection: close": _http_client,
    "http.client, chunked, Connection: close": lambda url: _http_client(url, chunked=True),
    "http.client, Expect: 100-continue": lambda url: _http_client(url, expect=True),
    "requests": _requests,
    "requests, chunked": lambda url: _requests(url, chunked=True),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_12mb_body_always_gets_its_413(server: ServerThread, client: str) -> None:
    outcomes: Counter[str] = Counter()
    for _ in range(TRIES):
        try:
            status, body = CLIENTS[client](server.url)
        except Exception as e:  # noqa: BLE001 - every outcome is counted; a reset is one
            outcomes[f"{type(e).__name__}: {e}"] += 1
            continue
        outcomes[str(status)] += 1
        if status == 413:
            err = json.loads(body)
            assert err["error"] == "payload too large" and f"limit of {LIMIT} bytes" in err["message"], err
    assert outcomes == Counter({"413": TRIES}), dict(outcomes)
    r = requests.post(server.url + PATH, json={"history": [{"item_id": 1}, {"item_id": 2}]}, timeout=60)
    assert r.status_code == 200  # and the server still serves


def _asgi(limit: int, headers: list[tuple[bytes, bytes]], pieces: list[bytes], *, wait: float = 0.0,
          **kw: float) -> tuple[list[dict], int, float]:
    """BodyLimit (``kw``: its drain bounds) called the way uvicorn calls it, on a body of ``pieces`` (then a
    client that sends nothing for ``wait`` s, when > 0): what it sent, how many pieces it read, and how long."""
    sent: list[dict] = []
    read = 0

    async def receive() -> dict:
        nonlocal read
        if read == len(pieces):
            await asyncio.sleep(wait)
            return {"type": "http.disconnect"}
        read += 1
        return {"type": "http.request", "body": pieces[read - 1], "more_body": read < len(pieces) or wait > 0}

    async def send(msg: dict) -> None:
        sent.append(msg)

    async def app(scope: dict, receive: Any, send: Any) -> None:
        raise AssertionError("a refused body must not reach the app")

    t0 = time.perf_counter()
    asyncio.run(BodyLimit(app, limit, **kw)({"type": "http", "headers": headers}, receive, send))
    return sent, read, time.perf_counter() - t0


def test_the_drain_is_bounded() -> None:
    """The rest of a refused body is read only up to the drain bounds: a declared body over ``drain_bytes`` is not
    read at all; a chunked one is read until ``drain_bytes``; a client that stalls is given ``drain_seconds``.
    Each time the 413 (with Connection: close) went out first and the response is ended."""
    kb = [b"x" * 1024] * 40
    for headers, pieces, want_read in (([(b"content-length", b"10240")], kb[:10], 10),  # drained to its end
                                       ([(b"content-length", b"40960")], kb, 0),  # over drain_bytes: not read
                                       ([], kb, 21)):  # chunked: read past the limit (2 pieces), then to drain_bytes
        sent, read, _ = _asgi(1500, headers, pieces, drain_bytes=20 * 1024)
        assert read == want_read, headers
        assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
        assert json.loads(sent[1]["body"])["message"].endswith("exceeds the limit of 1500 bytes")
        assert not sent[-1].get("more_body", False)
    sent, read, took = _asgi(1500, [], kb[:3], wait=5.0, drain_seconds=0.3)  # a client that stalls mid-body
    assert read == 3 and sent[0]["status"] == 413 and not sent[-1].get("more_body", False) and took < 2.0
