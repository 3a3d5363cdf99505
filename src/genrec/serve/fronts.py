"""Front processes (``genrec serve --fronts N``, issue 39): HTTP, JSON and validation in N processes, the model in one.

One Python process serves at most what one core can do for all its requests' HTTP handling, body parsing and
validation, and answers' serialisation, and the model's host work waits on the same interpreter lock. With
``--fronts N`` the main process (the *engine*) loads the bundle and runs the model, and N front processes share
the public socket:

* a front answers ``POST /v1/recommend`` and ``POST /v1/rank`` itself as far as HTTP goes: the body limit, the
  one-pass parse and validation (the same request models, the same 422s), then the validated request travels to
  the engine over a local socket (:class:`FrontLink`), the answer comes back as the engine's dict and the front
  serialises it through the same response model. In the engine a micro-batched recommend request joins the one
  micro-batcher from the link's reading thread, with no thread of its own (:meth:`Service.submit_nowait`), and its
  answer goes back from the thread that ran its batch; any other runs :meth:`Service.recommend` /
  :meth:`Service.rank` in a thread of :class:`EngineLink`'s pool. Requests from every front meet in the one
  micro-batcher and form the same batches as in one process: the answers are those of one process;
* every other path (``/readyz``, ``/metrics``, ``/admin/reload``, the explorer, ``/docs``) is passed on as it came
  to the engine's own app, served on a Unix socket: there is one bundle, one hot swap and one SIGHUP handler;
* ``/metrics``: the engine observes each request's stage timings; the fronts send what they counted (requests by
  endpoint and status, requests in flight) every half second, and the engine adds it to its registry.

Faults: a front that dies is started again by the engine; the engine gone, the fronts fail their pending
requests (503) and stop. Non-standard: the link's socket takes an authentication key (multiprocessing's), drawn
per server and handed to the fronts in their arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import uvicorn

from genrec.serve.middleware import Metrics

__all__ = ["EngineLink", "EngineServer", "FrontLink", "FrontStats", "front_main"]

log = logging.getLogger("genrec.serve")

OPS = ("recommend", "rank")
"""What a front asks the engine for: the two inference routes."""
RESTARTS_PER_WINDOW, RESTART_WINDOW_S = 5, 60.0
"""At most this many front restarts in this many seconds (a front that dies at once is not restarted in a loop)."""
STATS_EVERY_S = 0.5
"""How often a front sends the engine its request counts."""


class EngineGone(RuntimeError):
    """The engine process closed the link (it stopped or died): the front answers 503 and stops."""


def portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (the front then answers as one process would: a 422 naming the field, a 500
    naming the error's type), else a RuntimeError with its type and text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------------- engine side
Take = Callable[[str, Any, Callable[[bool, Any], None]], bool]
"""``take(op, req, done)``: True when it took the request without a thread and will call ``done(ok, value)`` once
(:meth:`genrec.serve.service.Service.submit_nowait`); False: the link runs ``serve`` in a thread."""


class EngineLink:
    """The engine's end: accepts the fronts' connections on ``path``; a request that ``take`` accepts joins the
    micro-batcher from the reading thread and its answer goes back from the thread that ran its batch; any other
    runs ``serve(op, req)`` in a thread of a pool of ``threads`` (so concurrent requests from every front reach the
    micro-batcher together); a front's ``stats`` message goes to ``metrics``."""

    def __init__(self, serve: Callable[[str, Any], dict[str, Any]], metrics: Metrics, path: str, authkey: bytes,
                 threads: int, take: Take | None = None) -> None:
        self.serve, self.metrics, self.take = serve, metrics, take
        self.listener = Listener(path, family="AF_UNIX", authkey=authkey)
        self.pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="genrec-link")
        self.connected = threading.Semaphore(0)  # released once per front that connected
        self._closed = False
        self._lock = threading.Lock()
        self._in_flight: dict[int, float] = {}  # per connection: the front's requests in flight, as last reported

    def start(self) -> EngineLink:
        threading.Thread(target=self._accept, name="genrec-link-accept", daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self.listener.accept()
            except Exception:  # noqa: BLE001 - closed, or a peer without the key: keep accepting until closed
                if self._closed:
                    return
                continue
            threading.Thread(target=self._read, args=(conn,), name="genrec-link-read", daemon=True).start()
            self.connected.release()

    def _read(self, conn: Connection) -> None:
        send_lock, cid = threading.Lock(), id(conn)
        try:
            while True:
                try:
                    rid, op, payload = conn.recv()
                except (EOFError, OSError):
                    return
                if op == "stats":
                    self._stats(cid, payload)
                elif op in OPS:
                    if not self._taken(conn, send_lock, rid, op, payload):
                        self.pool.submit(self._run, conn, send_lock, rid, op, payload)
                else:
                    self._reply(conn, send_lock, (rid, False, RuntimeError(f"unknown operation {op!r}")))
        finally:
            self._stats(cid, {"requests": {}, "in_flight": 0.0})  # a front gone has nothing in flight
            with contextlib.suppress(OSError):
                conn.close()

    def _taken(self, conn: Connection, send_lock: threading.Lock, rid: int, op: str, req: Any) -> bool:
        """Whether ``take`` took the request (its answer then goes back when its batch has run)."""
        if self.take is None:
            return False

        def done(ok: bool, val: Any) -> None:
            self._reply(conn, send_lock, (rid, True, val) if ok else (rid, False, portable(val)))

        try:
            return self.take(op, req, done)
        except BaseException as e:  # noqa: BLE001 - a fault in taking it: the request's error, the link reads on
            done(False, e)
            return True

    def _run(self, conn: Connection, send_lock: threading.Lock, rid: int, op: str, req: Any) -> None:
        try:
            out: Any = (rid, True, self.serve(op, req))
        except BaseException as e:  # noqa: BLE001 - the request's error goes back to its front
            out = (rid, False, portable(e))
        self._reply(conn, send_lock, out)

    @staticmethod
    def _reply(conn: Connection, send_lock: threading.Lock, msg: Any) -> None:
        with send_lock:
            try:
                conn.send(msg)
            except OSError:
                pass  # a front gone: its requests' answers have no reader
            except Exception as e:  # noqa: BLE001 - an answer that does not pickle: the request gets a 500, not a hang
                with contextlib.suppress(OSError):
                    conn.send((msg[0], False, RuntimeError(f"the answer could not be sent to the front: "
                                                           f"{type(e).__name__}: {e}")))

    def _stats(self, cid: int, st: dict[str, Any]) -> None:
        for (endpoint, status), n in st["requests"].items():
            self.metrics.requests.labels(endpoint=endpoint, status=status).inc(n)
        with self._lock:
            before = self._in_flight.pop(cid, 0.0)
            if st["in_flight"]:
                self._in_flight[cid] = st["in_flight"]
        self.metrics.in_flight.inc(st["in_flight"] - before)


class EngineServer(uvicorn.Server):
    """The engine's uvicorn server (its full app on a Unix socket) that, once the bundle is loaded, binds the
    public socket and starts the fronts, restarts a front that dies, and stops them when it stops."""

    def __init__(self, config: uvicorn.Config, *, service: Any, fronts: int, host: str, port: int,
                 front_args: dict[str, Any], link_dir: str, say: Callable[[str], None] | None) -> None:
        super().__init__(config)
        self.service, self.n, self.host, self.port = service, fronts, host, port
        self.front_args, self.link_dir, self.say = front_args, link_dir, say
        self.procs: list[Any] = []
        self.link: EngineLink | None = None
        self.public: socket.socket | None = None
        self.restarts = 0
        self._stopping = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit:
            return
        await asyncio.get_running_loop().run_in_executor(None, self._start_fronts)

    def _start_fronts(self) -> None:
        svc = self.service
        authkey = secrets.token_bytes(32)
        path = os.path.join(self.link_dir, "link.sock")

        # as many requests in the engine at once as one process lets run (the limiter's capacity)
        threads = int(svc.limiter.total_tokens)
        self.link = EngineLink(svc.infer, svc.metrics, path, authkey, threads, take=svc.submit_nowait).start()
        self.public = socket.create_server((self.host, self.port), family=socket.AF_INET6 if ":" in self.host
                                           else socket.AF_INET, backlog=2048)
        self.public.set_inheritable(True)
        self.front_args.update(link=path, authkey=authkey, engine_uds=self.config.uds)
        self.procs = [self._spawn() for _ in range(self.n)]
        # watched from the start: a front that dies before it connects (the first one already answers) is replaced,
        # and its replacement connects in its place
        threading.Thread(target=self._supervise, name="genrec-fronts", daemon=True).start()
        for _ in range(self.n):  # each front connects once its app is built
            if not self.link.connected.acquire(timeout=300):
                raise RuntimeError(f"the {self.n} front processes did not all connect within 300 s")
        if self.say is not None:
            self.say(f"ready on {_url(self.host, self.public.getsockname()[1])}: {self.n} front processes "
                     f"(pids {', '.join(str(p.pid) for p in self.procs)}) answer HTTP, this process ({os.getpid()}) "
                     f"runs the model (POST /v1/recommend, GET /readyz; Ctrl-C stops)")

    def _spawn(self) -> Any:
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=front_main, args=(self.public,), kwargs=self.front_args, name="genrec-front",
                        daemon=True)
        p.start()
        return p

    def _supervise(self) -> None:
        recent: list[float] = []  # when fronts were restarted lately: a front that keeps dying is restarted slower
        while not self._stopping.wait(0.5):
            for i, p in enumerate(self.procs):
                if not p.is_alive() and not self._stopping.is_set() and not self.should_exit:
                    now = time.monotonic()
                    recent = [t for t in recent if now - t < RESTART_WINDOW_S]
                    if len(recent) >= RESTARTS_PER_WINDOW:
                        continue  # (it is tried again once the window has room)
                    log.warning("front process %s exited with code %s: starting another", p.pid, p.exitcode)
                    recent.append(now)
                    self.restarts += 1
                    self.procs[i] = self._spawn()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._stopping.set()
        for p in self.procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: uvicorn's graceful stop in the front
        for p in self.procs:
            await asyncio.get_running_loop().run_in_executor(None, p.join, 15)
            if p.is_alive():
                p.kill()
        if self.link is not None:
            self.link.close()
        if self.public is not None:
            self.public.close()
        await super().shutdown(sockets=sockets)


def engine_link_dir() -> str:
    """A private directory for the engine's two Unix sockets (its app's and the link's)."""
    return tempfile.mkdtemp(prefix="genrec-fronts-")


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# ---------------------------------------------------------------------------------------------------- front side
class FrontLink:
    """A front's end of the link: ``await call(op, req)`` sends the validated request to the engine and returns its
    answer (or raises its error). One connection, one reader thread; ``on_gone`` is called once if the engine
    closes the link."""

    def __init__(self, path: str, authkey: bytes, on_gone: Callable[[], None] = lambda: None) -> None:
        self.conn = Client(path, family="AF_UNIX", authkey=authkey)
        self.on_gone = on_gone
        self._ids = itertools.count()
        self._send = threading.Lock()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.gone = False
        threading.Thread(target=self._read, name="genrec-front-read", daemon=True).start()

    def send(self, msg: Any) -> None:
        with self._send:
            self.conn.send(msg)

    async def call(self, op: str, req: Any) -> Any:
        if self.gone:
            raise EngineGone("the engine process is gone")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        rid = next(self._ids)
        self._pending[rid] = (loop, fut)
        try:
            self.send((rid, op, req))
        except (OSError, EOFError) as e:
            self._pending.pop(rid, None)
            raise EngineGone(f"the engine process is gone ({e})") from None
        return await fut

    def _read(self) -> None:
        while True:
            try:
                rid, ok, val = self.conn.recv()
            except (EOFError, OSError):
                break
            got = self._pending.pop(rid, None)
            if got is not None:
                got[0].call_soon_threadsafe(_settle, got[1], ok, val)
        self.gone = True
        for loop, fut in list(self._pending.values()):
            loop.call_soon_threadsafe(_settle, fut, False, EngineGone("the engine process is gone"))
        self._pending.clear()
        self.on_gone()


def _settle(fut: asyncio.Future, ok: bool, val: Any) -> None:
    if not fut.done():
        (fut.set_result if ok else fut.set_exception)(val)


class FrontStats(Metrics):
    """A front's own counts (its :class:`~genrec.serve.middleware.Track` writes them); :meth:`pending` gives what
    changed since the last call, for the engine."""

    def __init__(self) -> None:
        super().__init__()
        self._sent: dict[tuple[str, str], float] = {}

    def pending(self) -> dict[str, Any]:
        now: dict[tuple[str, str], float] = {}
        for fam in self.requests.collect():
            for s in fam.samples:
                if s.name.endswith("_total"):
                    now[(s.labels["endpoint"], s.labels["status"])] = s.value
        delta = {k: v - self._sent.get(k, 0.0) for k, v in now.items() if v != self._sent.get(k, 0.0)}
        self._sent = now
        in_flight = next(iter(self.in_flight.collect())).samples[0].value
        return {"requests": delta, "in_flight": float(in_flight)}


def freeze_front_heap(cfg: dict[str, Any]) -> bool:
    """A front's heap after its start (its imports: ~250k objects) out of the cyclic GC's sight, as the engine freezes
    its bundle (``gc_freeze``, on by default): unfrozen, each full collection walked them all and stalled the front
    75-136 ms, a few times in 15 s under load (CPU box, 64 clients, ``--fronts 2``); frozen, 2-4 ms. Whether it
    froze."""
    if not cfg.get("gc_freeze", True):
        return False
    from genrec.serve.service import freeze_heap  # (local: the service module loads the model's stack)

    freeze_heap()
    return True


def front_main(public: socket.socket, *, cfg: dict[str, Any], link: str, authkey: bytes, engine_uds: str,
               log_config: dict[str, Any], impl: dict[str, Any]) -> None:
    """A front process: serves ``public`` until SIGTERM, or until the engine closes the link."""
    from genrec.serve.front_app import create_front_app  # (local: front_app imports this module)

    server: uvicorn.Server | None = None

    def gone() -> None:
        if server is not None:
            server.should_exit = True

    flink = FrontLink(link, authkey, on_gone=gone)
    stats = FrontStats()
    app = create_front_app(cfg, flink, engine_uds, stats)
    freeze_front_heap(cfg)
    server = uvicorn.Server(uvicorn.Config(app, log_level=None, log_config=log_config, access_log=False,
                                           timeout_graceful_shutdown=10, **impl))

    def push() -> None:
        while not flink.gone:
            time.sleep(STATS_EVERY_S)
            with contextlib.suppress(OSError, EOFError):
                flink.send((-1, "stats", stats.pending()))

    threading.Thread(target=push, name="genrec-front-stats", daemon=True).start()
    server.run(sockets=[public])
    with contextlib.suppress(OSError, EOFError):
        flink.send((-1, "stats", {**stats.pending(), "in_flight": 0.0}))
