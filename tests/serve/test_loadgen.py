"""The load generator's raw HTTP/1.1 client (``run_load(client="raw")``, the default): the same status
counts as the httpx client against the real service, one latency per request, and a server that closes
connections, stalls or sends no Content-Length gives counted errors or a clear error -- never a hang."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genrec.errors import ConfigError
from genrec.serve.config import ServeConfig
from genrec.serve.loadgen import RawConnection, ResponseError, client_loop, encode_request, run_client, run_load
from genrec.serve.schemas import INT64

from ._server import ServerThread, serving


@pytest.fixture(scope="module", params=["auto", "h11+asyncio"])
def server(run_dir: Path, request: pytest.FixtureRequest):
    """The service as uvicorn runs it by default (httptools/uvloop when installed) and with the
    pure-Python parser and loop (what a user without them gets)."""
    kw = {} if request.param == "auto" else {"http": "h11", "loop": "asyncio"}
    yield from serving(ServeConfig(workdir=run_dir), **kw)


# good histories (an unknown id is dropped, not an error) and histories whose item id is out of the
# int64 range (422 naming history[0].item_id)
MIX = [[1, 50, 172], [INT64 + 1], [7, 9, 99999999], [2 ** 64, 3]]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_raw_client_counts_like_httpx(server: ServerThread, concurrency: int) -> None:
    n = 10
    got = {}
    for client in ("raw", "httpx"):
        res = asyncio.run(run_load(server.url, MIX, duration=60, concurrency=concurrency, max_requests=n,
                                   body={"k": 3, "beam_width": 4, "rank": True}, client=client))
        assert res.requests == n and len(res.latencies_ms) == n, client
        assert res.errors == res.statuses.get(422, 0) and res.degraded == 0, client
        got[client] = res.statuses
    assert got["raw"] == got["httpx"] == {200: 5, 422: 5}


def test_raw_connection_reads_the_service_answer(server: ServerThread) -> None:
    async def main() -> tuple[list[tuple[int, bytes]], int]:
        c = RawConnection("127.0.0.1", server.port)
        out = []
        for h in ([1, 50], [INT64 + 1], [1, 50]):
            body = ('{"history": [%s], "k": 2}' % ", ".join('{"item_id": %d}' % i for i in h)).encode()
            out.append(await c.request(encode_request("127.0.0.1", server.port, "/v1/recommend", body)))
        await c.close()
        return out, c.connects

    out, connects = asyncio.run(main())
    assert [s for s, _ in out] == [200, 422, 200] and connects == 1  # one keep-alive connection
    assert b'"items"' in out[0][1] and b"history[0].item_id" in out[1][1]


# ----------------------------------------------------------------------------- misbehaving servers
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _with_server(handler: Handler, **load: object) -> tuple[object, int]:
    """Run ``run_load`` against a throwaway asyncio server; returns (result or exception, connections)."""
    conns = 0

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal conns
        conns += 1
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        res: object = await asyncio.wait_for(run_load(f"http://127.0.0.1:{port}", [[1, 2]], **load), 30)
    except ResponseError as e:
        res = e
    finally:
        srv.close()
    return res, conns


async def _read_request(r: asyncio.StreamReader) -> None:
    head = await r.readuntil(b"\r\n\r\n")
    n = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
    await r.readexactly(n)


def test_server_closing_connection_gives_counted_errors() -> None:
    async def close_at_once(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)  # then EOF, no answer

    res, conns = asyncio.run(_with_server(close_at_once, max_requests=6, concurrency=2, duration=30))
    assert res.requests == 6 and res.errors == 6 and res.statuses == {0: 6}  # type: ignore[attr-defined]
    assert len(res.latencies_ms) == 6 and conns == 6  # type: ignore[attr-defined]  # reconnected each time


def test_run_client_uses_the_load_generators_loop() -> None:
    async def close_at_once(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)

    res, _ = run_client(_with_server(close_at_once, max_requests=2, concurrency=1, duration=30))
    assert res.client_loop == client_loop() and res.statuses == {0: 2}  # type: ignore[attr-defined]


def test_connection_close_answer_counts_status_and_reconnects() -> None:
    async def answer_then_close(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b'HTTP/1.1 200 OK\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{"degraded":true}')
        await w.drain()

    res, conns = asyncio.run(_with_server(answer_then_close, max_requests=4, concurrency=1, duration=30))
    assert res.statuses == {200: 4} and res.errors == 0 and res.degraded == 4  # type: ignore[attr-defined]
    assert conns == 4  # a fresh connection after each "Connection: close"


def test_stalled_server_times_out_as_errors() -> None:
    async def never_answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        await asyncio.sleep(30)

    res, _ = asyncio.run(_with_server(never_answer, max_requests=2, concurrency=2, duration=30, timeout=0.3))
    assert res.statuses == {0: 2} and max(res.latencies_ms) < 5_000  # type: ignore[attr-defined]


def test_response_without_content_length_is_a_clear_error() -> None:
    async def chunked(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        await w.drain()
        await asyncio.sleep(1)

    res, _ = asyncio.run(_with_server(chunked, max_requests=3, concurrency=2, duration=30))
    assert isinstance(res, ResponseError) and "Content-Length" in str(res) and "chunked" in str(res)


def test_bad_client_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="raw, httpx"):
        asyncio.run(run_load("http://127.0.0.1:9", [[1]], client="curl"))
    from genrec.cli import app

    r = CliRunner().invoke(app, ["bench", "serve", str(tmp_path), "--client", "curl"])
    assert r.exit_code == 2 and "client must be one of raw, httpx" in r.output
