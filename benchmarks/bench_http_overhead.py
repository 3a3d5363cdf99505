"""Per-request HTTP overhead of ``genrec serve``: client latency minus model time, piece by piece.

    python benchmarks/bench_http_overhead.py WORKDIR [--n 300] [--history-len 1000] [--out FILE]
        [--http h11|httptools --loop asyncio|uvloop] [--client-rounds 100]

Starts the real service (``create_app`` + uvicorn with the implementations ``genrec serve`` uses)
in a child process on a free loopback port, and sends ``--n`` sequential rounds of requests over
one keep-alive connection (stdlib ``http.client``, bodies encoded once up front, so the client
adds as little as possible). Every request carries the same ~``--history-len``-item history of
real item ids (the run's own sequences, concatenated: ``sample_histories(exact=True)``).

One round = one request to each of these, interleaved so drift hits them all alike:

* ``GET /healthz`` -- the HTTP floor: connection, uvicorn parser, middleware, routing, tiny JSON;
* ``POST /_probe/body`` -- + uploading the 1,000-item body (read, no JSON);
* ``POST /_probe/json`` -- + ``json.loads`` of it (what FastAPI's own body handling would do first);
* ``POST /_probe/validate`` -- the body read as the routes read it: JSON parse and ``RecommendRequest`` in one pass
  (:func:`genrec.serve.app.json_body`), in place of ``json.loads``;
* ``POST /_probe/hop`` -- + a no-op on the inference thread pool (the thread hop);
* ``POST /_probe/prepare`` -- + on that thread, what a recommend request does before the
  Recommender's timer starts: the validated history's one parse (``Engine._read``) and ``model_batch``;
* ``POST /v1/recommend`` -- the real thing: its ``timings_ms.total`` is the model time (the
  Recommender's own timer); ``overhead = client latency - timings_ms.total`` per request.

The ``/_probe/*`` routes exist only in this benchmark's child (added to the app it builds); they
share the real app's middleware stack. Also benchmark-only: an outermost ASGI wrapper reports the
time spent inside the ASGI app (``x-asgi-ms``: call -> response start), in the garbage collector
(``x-gc-ms``) and in ``Service.recommend`` (``x-engine-ms``, wall clock), so each recommend
request's overhead splits into uvicorn + socket + client (client - ASGI), the web layer (ASGI -
Service.recommend) and the engine's work outside the model timer (Service.recommend - model);
these rows are per-request differences. The probe pieces are differences of medians (approximate). Prints a table; JSON
to ``--out``. Bounded: probe rounds stop after ``--max-seconds`` (default 40 s).

Then ``--client-rounds`` rounds of recommend requests through the load generator's clients: per
round, each client in turn sends ``--client-block`` requests from a process of its own on one
keep-alive connection, on the load generator's event loop (uvloop when installed), the first
request of each block not counted (in one process, the httpx clients' garbage and cache footprint
landed on the raw client's clock: +0.3-0.5 ms); overhead = client latency - ``timings_ms.total``: ``raw`` (:class:`genrec.serve.loadgen.RawConnection`, pre-encoded
request bytes: ``genrec bench serve``'s default), ``httpx`` (``httpx.AsyncClient`` posting the
pre-encoded body: ``--client httpx``) and ``httpx-json`` (``json=`` encoded per request: the load
generator before bodies were pre-encoded). A client the tree lacks is skipped.

``--http`` / ``--loop``: uvicorn's HTTP parser and event loop in the server child (default: what
``genrec serve`` picks, httptools / uvloop when installed, else h11 / asyncio).
"""

# no `from __future__ import annotations`: the probe routes need their annotations evaluated (local imports)

import argparse
import asyncio
import gc
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PROBES = ("healthz", "body", "json", "validate", "hop", "prepare", "recommend")


# ----------------------------------------------------------------------------- server child
def _child(workdir: str, port: int, threads: int, gc_freeze: bool, http: str | None, loop: str | None) -> None:
    import anyio
    import uvicorn
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import Response

    from genrec.serve import app as appmod
    from genrec.serve.schemas import RecommendRequest

    extra = {} if gc_freeze else {"gc_freeze": False}  # (a tree from before the option ignores it)
    wrapped = appmod.create_app(appmod.ServeConfig(workdir=Path(workdir), threads=threads, **extra))
    inner: Any = wrapped
    while not isinstance(inner, FastAPI):  # the routes' app, under the ASGI middleware (Track, BodyLimit)
        inner = inner.app
    svc = wrapped.service  # type: ignore[attr-defined]
    small = b'{"ok":true}'

    @inner.post("/_probe/body")
    async def _body(request: Request) -> Response:
        await request.body()
        return Response(small, media_type="application/json")

    @inner.post("/_probe/json")
    async def _json(request: Request) -> Response:
        await request.json()
        return Response(small, media_type="application/json")

    read_body = Depends(appmod.json_body(RecommendRequest))  # the routes' body: JSON parse + validation in one pass

    @inner.post("/_probe/validate")
    async def _validate(req: RecommendRequest = read_body) -> Response:
        return Response(small, media_type="application/json")

    @inner.post("/_probe/hop")
    async def _hop(req: RecommendRequest = read_body) -> Response:
        await anyio.to_thread.run_sync(req.the_history, limiter=svc.limiter)
        return Response(small, media_type="application/json")

    def prepare(req: RecommendRequest) -> None:  # what Service.recommend does before the Recommender's timer
        eng = svc.holder.current.engine
        parsed, _ = eng._read(req.the_history())  # the engine's one parse (rows, or a cold start)
        if parsed is not None:
            eng.rec.model_batch([parsed])

    @inner.post("/_probe/prepare")
    async def _prepare(req: RecommendRequest = read_body) -> Response:
        await anyio.to_thread.run_sync(prepare, req, limiter=svc.limiter)
        return Response(small, media_type="application/json")

    engine_ms = [float("nan")]  # wall time of the last Service.recommend (requests are sequential)
    recommend = svc.recommend

    def timed_recommend(req: RecommendRequest) -> Any:
        t0 = time.perf_counter()
        try:
            return recommend(req)
        finally:
            engine_ms[0] = (time.perf_counter() - t0) * 1e3

    svc.recommend = timed_recommend  # the route looks it up per request

    gc_ms = [0.0]
    gc_t0 = [0.0]

    def _gc_cb(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            gc_ms[0] += (time.perf_counter() - gc_t0[0]) * 1e3

    gc.callbacks.append(_gc_cb)

    async def timed(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await wrapped(scope, receive, send)
        t0 = time.perf_counter()
        g0 = gc_ms[0]
        engine_ms[0] = float("nan")

        async def send2(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                extra = [(b"x-asgi-ms", f"{(time.perf_counter() - t0) * 1e3:.4f}".encode()),
                         (b"x-gc-ms", f"{gc_ms[0] - g0:.4f}".encode()),
                         (b"x-engine-ms", f"{engine_ms[0]:.4f}".encode())]
                msg = {**msg, "headers": list(msg.get("headers", [])) + extra}
            await send(msg)

        await wrapped(scope, receive, send2)

    impl = getattr(appmod, "uvicorn_impl", lambda: {})()
    impl.update({k: v for k, v in (("http", http), ("loop", loop)) if v})
    print(json.dumps({"child": "ready", "uvicorn": impl, "app_module": appmod.__file__}), flush=True)
    uvicorn.run(timed, host="127.0.0.1", port=port, log_level="warning", **impl)


# ----------------------------------------------------------------------------- client
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t_end = time.time() + timeout
    while time.time() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout}s")


def _pct(x: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(x), q)), 3) if x else float("nan")


async def _client_block(port: int, body: bytes, name: str, n: int) -> list[float]:
    """``n`` recommend requests through one load-generator client on one keep-alive connection;
    client latency - model time of each. The JSON answer is decoded after the clock stops except
    for ``httpx-json``, which times ``r.json()`` as the old load generator did."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    over = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        if name == "raw":
            from genrec.serve.loadgen import RawConnection, encode_request

            raw = RawConnection("127.0.0.1", port)
            wire = encode_request("127.0.0.1", port, "/v1/recommend", body)
        payload = json.loads(body)
        hdr = {"content-type": "application/json"}
        for _ in range(n):
            t0 = time.perf_counter()
            if name == "raw":
                status, data = await raw.request(wire)
                dt = (time.perf_counter() - t0) * 1e3
                out = json.loads(data)
            elif name == "httpx":
                r = await c.post("/v1/recommend", content=body, headers=hdr)
                status, data = r.status_code, r.content
                dt = (time.perf_counter() - t0) * 1e3
                out = json.loads(data)
            else:
                r = await c.post("/v1/recommend", json=payload)
                out = r.json()
                dt = (time.perf_counter() - t0) * 1e3
                status = r.status_code
            if status != 200:
                raise RuntimeError(f"/v1/recommend via {name}: HTTP {status}: {str(out)[:300]}")
            over.append(dt - float(out["timings_ms"]["total"]))
        if name == "raw":
            await raw.close()
    return over


def _client_child(port: int, name: str, n: int, body_file: str) -> None:
    try:
        from genrec.serve.loadgen import run_client
    except ImportError:
        run_client = asyncio.run  # noqa: N806
    print(json.dumps(run_client(_client_block(port, Path(body_file).read_bytes(), name, n))), flush=True)


def _client_overhead(port: int, body: bytes, a: argparse.Namespace) -> dict[str, list[float]]:
    """Per round, each load-generator client in turn sends ``--client-block`` requests from a
    process of its own (the first request of a block not counted): one client's allocations,
    garbage and caches never land on another's clock, and drift hits all alike."""
    try:
        from genrec.serve.loadgen import RawConnection  # noqa: F401
        names = ["raw", "httpx", "httpx-json"]
    except ImportError:  # a tree from before the raw client
        names = ["httpx", "httpx-json"]
    over: dict[str, list[float]] = {k: [] for k in names}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        for _ in range(a.client_rounds):
            for name in names:
                out = subprocess.run([sys.executable, __file__, a.workdir, "--client-child", name, "--child-port",
                                      str(port), "--client-block", str(a.client_block), "--body-file", f.name],
                                     capture_output=True, text=True, timeout=300, env=dict(os.environ))
                if out.returncode != 0:
                    raise RuntimeError(f"client {name}: {out.stderr[-2000:]}")
                over[name] += json.loads(out.stdout.strip().splitlines()[-1])[1:]
    return over


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    ap.add_argument("--n", type=int, default=300, help="rounds (one request to each probe per round)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--history-len", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--beam-width", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=40.0, help="stop sending probe rounds after this long")
    ap.add_argument("--client-rounds", type=int, default=6,
                    help="then this many rounds of recommend requests through the load generator's clients")
    ap.add_argument("--client-block", type=int, default=21,
                    help="requests per client per round, from a process of its own (the first not counted)")
    ap.add_argument("--http", choices=("h11", "httptools"), default=None, help="uvicorn HTTP parser (default: auto)")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default=None, help="uvicorn event loop (default: auto)")
    ap.add_argument("--no-gc-freeze", action="store_true", help="serve with ServeConfig(gc_freeze=False) (ablation)")
    ap.add_argument("--label", default="", help="a name for this run in the table / JSON")
    ap.add_argument("--columns", action="store_true", help="send the history as history_columns")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--child-port", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--client-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--body-file", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client_child is not None:
        return _client_child(a.child_port, a.client_child, a.client_block, a.body_file)
    if a.child_port is not None:
        return _child(a.workdir, a.child_port, a.threads, not a.no_gc_freeze, a.http, a.loop)

    from genrec.serve.loadgen import history_body, sample_histories

    hist = sample_histories(a.workdir, 1, a.history_len, seed=0, exact=True)[0]
    body = json.dumps({**history_body(hist, a.columns), "k": a.k, "beam_width": a.beam_width,
                       "rank": True}).encode()
    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, a.workdir, "--child-port", str(port), "--threads",
                             str(a.threads)] + (["--no-gc-freeze"] if a.no_gc_freeze else [])
                            + (["--http", a.http] if a.http else []) + (["--loop", a.loop] if a.loop else []),
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline() or "{}")
        _wait_ready(port, proc)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hdr = {"content-type": "application/json"}
        reqs = {"healthz": ("GET", "/healthz", None)} | {
            p: ("POST", f"/_probe/{p}", body) for p in PROBES[1:-1]} | {
            "recommend": ("POST", "/v1/recommend", body)}
        rows: dict[str, dict[str, list[float]]] = {p: {"client": [], "asgi": [], "gc": [], "engine": []}
                                                   for p in PROBES}
        model: list[float] = []
        t_stop = time.perf_counter() + a.max_seconds
        rounds = 0
        for i in range(a.warmup + a.n):
            if time.perf_counter() > t_stop:
                break
            for p in PROBES:
                method, path, b = reqs[p]
                t0 = time.perf_counter()
                conn.request(method, path, body=b, headers=hdr if b is not None else {})
                r = conn.getresponse()
                data = r.read()
                dt = (time.perf_counter() - t0) * 1e3
                if r.status != 200:
                    raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
                if i < a.warmup:
                    continue
                rows[p]["client"].append(dt)
                rows[p]["asgi"].append(float(r.getheader("x-asgi-ms") or "nan"))
                rows[p]["gc"].append(float(r.getheader("x-gc-ms") or "nan"))
                rows[p]["engine"].append(float(r.getheader("x-engine-ms") or "nan"))
                if p == "recommend":
                    out = json.loads(data)
                    model.append(float(out["timings_ms"]["total"]))
            if i >= a.warmup:
                rounds += 1
        conn.close()
        try:  # the load generator's own loop (uvloop when installed)
            from genrec.serve.loadgen import client_loop
        except ImportError:
            client_loop = lambda: "asyncio"  # noqa: E731
        cl_over = _client_overhead(port, body, a) if a.client_rounds > 0 else {}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()

    med = {p: float(np.median(rows[p]["client"])) for p in PROBES}
    rec = rows["recommend"]
    over = [c - m for c, m in zip(rec["client"], model)]
    outside = [c - s for c, s in zip(rec["client"], rec["asgi"])]
    in_app = [s - e for s, e in zip(rec["asgi"], rec["engine"])]
    untimed = [e - m for e, m in zip(rec["engine"], model)]
    pieces = [
        ("HTTP floor (GET /healthz)", med["healthz"]),
        ("upload 1,000-item body", med["body"] - med["healthz"]),
        ("(json.loads alone, not on the route's path)", med["json"] - med["body"]),
        ("JSON parse + request validation (pydantic, one pass)", med["validate"] - med["body"]),
        ("thread hop (to_thread.run_sync)", med["hop"] - med["validate"]),
        ("the history's parse, model batch", med["prepare"] - med["hop"]),
        ("rest: result objects, response, metrics", float(np.median(over)) - med["prepare"]),
    ]
    res: dict[str, Any] = {
        "label": a.label, "machine": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "server": info, "args": {k: v for k, v in vars(a).items() if k != "child_port"}, "rounds": rounds,
        "body_bytes": len(body),
        "probes": {p: {"client_p50": _pct(rows[p]["client"], 50), "client_p99": _pct(rows[p]["client"], 99),
                       "asgi_p50": _pct(rows[p]["asgi"], 50), "gc_mean": round(float(np.nanmean(rows[p]["gc"])), 4)}
                   for p in PROBES},
        "recommend": {"client_p50": _pct(rec["client"], 50), "client_p99": _pct(rec["client"], 99),
                      "client_mean": round(float(np.mean(rec["client"])), 3), "client_max": _pct(rec["client"], 100),
                      "model_p50": _pct(model, 50), "model_p99": _pct(model, 99),
                      "overhead_p50": _pct(over, 50), "overhead_p99": _pct(over, 99),
                      "outside_asgi_p50": _pct(outside, 50), "outside_asgi_p99": _pct(outside, 99),
                      "app_not_engine_p50": _pct(in_app, 50), "app_not_engine_p99": _pct(in_app, 99),
                      "engine_untimed_p50": _pct(untimed, 50), "engine_untimed_p99": _pct(untimed, 99),
                      "gc_mean": round(float(np.nanmean(rec["gc"])), 4)},
        "client_loop": client_loop(),
        "clients": {k: {"overhead_p50": _pct(v, 50), "overhead_p90": _pct(v, 90), "overhead_p99": _pct(v, 99),
                        "requests": len(v)} for k, v in cl_over.items()},
        "pieces_ms": {k: round(v, 3) for k, v in pieces},
    }
    print(f"# bench_http_overhead {a.label} -- {rounds} rounds, body {len(body)} bytes, history {a.history_len}, "
          f"uvicorn {info.get('uvicorn') or 'defaults'}")
    print("| request | client p50 | client p99 | in ASGI app p50 | GC mean |")
    print("|---|---|---|---|---|")
    for p in PROBES:
        s = res["probes"][p]
        print(f"| {p} | {s['client_p50']:.3f} | {s['client_p99']:.3f} | {s['asgi_p50']:.3f} | {s['gc_mean']:.3f} |")
    r = res["recommend"]
    print()
    print("| /v1/recommend (ms) | p50 | p99 |")
    print("|---|---|---|")
    print(f"| client latency (mean {r['client_mean']:.3f}, max {r['client_max']:.3f}) | {r['client_p50']:.3f} | "
          f"{r['client_p99']:.3f} |")
    print(f"| model (timings_ms.total) | {r['model_p50']:.3f} | {r['model_p99']:.3f} |")
    print(f"| **overhead** (client - model, per request) | {r['overhead_p50']:.3f} | {r['overhead_p99']:.3f} |")
    print(f"| = uvicorn + socket + client (client - ASGI app) | {r['outside_asgi_p50']:.3f} | "
          f"{r['outside_asgi_p99']:.3f} |")
    print(f"| + FastAPI, middleware, validation, thread hop, response (ASGI app - Service.recommend) | "
          f"{r['app_not_engine_p50']:.3f} | {r['app_not_engine_p99']:.3f} |")
    print(f"| + Service.recommend outside the model timer (parse, batch, results) | {r['engine_untimed_p50']:.3f} | "
          f"{r['engine_untimed_p99']:.3f} |")
    desc = {"raw": "raw client, pre-encoded bytes (`genrec bench serve` default)",
            "httpx": "httpx.AsyncClient, pre-encoded body (`--client httpx`)",
            "httpx-json": "httpx.AsyncClient, `json=` per request (the old load generator)"}
    for k, v in res["clients"].items():
        print(f"| overhead seen by {desc[k]}, {res['client_loop']} loop, {v['requests']} requests | "
              f"{v['overhead_p50']:.3f} | {v['overhead_p99']:.3f} |")
    print()
    print("| overhead piece (difference of medians) | ms |")
    print("|---|---|")
    for k, v in pieces:
        print(f"| {k} | {v:.3f} |")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
