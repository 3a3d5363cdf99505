"""Two-process mode: retrieval in the server process, ranking in a supervised ranking process (UniPinRec §4).

The server process prefills the history once, runs SID beams + ANN, writes the history KV into
the shared :class:`genrec.serve.kv_pool.KVPool` under a lease ``(slot, gen)`` and sends the ranking
process ``(slot, gen, candidate vectors + SID codes, surface)`` over a local pipe. The ranking
process reads the KV from the pool (seqlock: never another request's KV), runs ``model.rank``
over it (on a GPU as the one-process server does: replayed CUDA graphs, the server's
``--precision``) and answers the action probabilities. Candidates travel as the exact vectors the ANN
index holds, so both processes score identical inputs and the results equal one-process mode.

Faults: every call has a timeout; a dead ranking process fails its pending calls at once
(:class:`RankerUnavailable`, the server answers retrieval-only results flagged ``degraded``),
and a supervisor thread restarts it. Non-standard: the ranker loads only the model (by checkpoint
path, safetensors) and keeps the served one and the one before it, so a hot swap needs no ranker
restart; the server has it load a model ahead of use (at start, after a restart, before a swap).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.errors import GenrecError
from genrec.infer.load import graph_mode
from genrec.model.graphs import GraphedRanker
from genrec.serve.engine import load_model
from genrec.serve.kv_pool import KVPool, Lease, StaleSlotError
from genrec.validation import trusted_inputs

__all__ = ["RankerClient", "RankerUnavailable", "ranker_main"]

log = logging.getLogger("genrec.serve")


class RankerUnavailable(GenrecError):
    """The ranking process is down, restarting, or did not answer in time."""


def ranker_main(conn: Connection, threads: int = 1) -> None:
    """Ranking process loop. ``{"op": "rank", "id", "pool", "slots", "gens", "ckpt", "digest", "vecs",
    "sid", "surface", "ts"}`` (B rows: lists of B, arrays ``[B, ...]``) -> ``{"id", "ok", "logits" | "error",
    "stale"}``; ``{"op": "warm", "ckpt",
    "digest", "pool"}`` loads the model and attaches the pool ahead of the first request (at start and
    before a hot swap); ``{"op": "status"}`` -> the loaded (checkpoint, digest, device) triples. Exits
    when the pipe closes. A model is held by its weights' sha256 (``digest``, the served bundle's), not
    by its path alone: weights replaced in place are never paired with a cache the old ones wrote."""
    torch.set_num_threads(max(1, threads))
    # the served checkpoint and the one before it: a hot swap warms the new model while requests
    # that started on the old bundle still rank on the old one
    models: OrderedDict[tuple[str, str, str], tuple[Any, GraphedRanker | None]] = OrderedDict()
    bf16 = os.environ.get("GENREC_PRECISION", "float32") == "bf16"  # the server's --precision (inherited)
    pools: dict[str, KVPool] = {}

    def pool_of(path: str) -> KVPool:
        if path not in pools:
            pools[path] = KVPool.attach(path)
        return pools[path]

    def model_of(ck: str, digest: str | None, dev: str) -> tuple[Any, GraphedRanker | None]:
        key = (ck, digest or "", dev)
        if key not in models:
            m = load_model(ck, dev, digest)  # refuses weights whose sha256 is not the served one
            # as the one-process ranker: replayed CUDA graphs on a GPU
            models[key] = (m, GraphedRanker(m) if graph_mode(torch.device(dev)) == "all" else None)
            while len(models) > 2:
                models.popitem(last=False)
        models.move_to_end(key)
        return models[key]

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        op = msg.get("op", "rank")
        if op == "ping":
            if msg.get("delay"):
                time.sleep(float(msg["delay"]))  # test hook: a process that answers late
            conn.send({"id": msg["id"], "ok": True, "pid": os.getpid()})
            continue
        try:
            if op == "status":
                conn.send({"id": msg["id"], "ok": True, "models": [list(k) for k in models]})
                continue
            pool = pool_of(msg["pool"])
            dev = pool.spec.device  # a CUDA pool (IPC handles): rank on that GPU; else on the CPU
            model, grank = model_of(msg["ckpt"], msg.get("digest"), dev)
            if op == "warm":
                conn.send({"id": msg["id"], "ok": True, "models": [list(k) for k in models]})
                continue
            if msg.get("delay"):
                time.sleep(float(msg["delay"]))  # test hook: a slow reader
            # the B rows of one batched forward of the server, one slot each, ranked as one batch again
            cache = pool.read_rows([int(x) for x in msg["slots"]], [int(g) for g in msg["gens"]],
                                   layout=model.config.layout)
            amp = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and dev.startswith("cuda")
                   else contextlib.nullcontext())
            with torch.no_grad(), amp:
                vecs = torch.from_numpy(msg["vecs"]).to(dev)  # [B, m, Di]
                sid = None if msg["sid"] is None else torch.from_numpy(msg["sid"]).to(dev)  # [B, m, L]
                ts = None if msg["ts"] is None else torch.tensor([int(t) for t in msg["ts"]], device=dev)
                surf = torch.tensor([int(x) for x in msg["surface"]], device=dev)
                if grank is not None and grank.supports(cache, vecs):
                    logits = grank(cache, vecs, sid, surf, ts)  # [B, m, C]
                else:
                    with trusted_inputs():  # SID codes come from the server's catalogue
                        logits = model.rank(cache, vecs, sid, surf, ts)
            conn.send({"id": msg["id"], "ok": True, "logits": logits.float().cpu().numpy()})
        except StaleSlotError as e:
            conn.send({"id": msg["id"], "ok": False, "stale": True, "error": str(e)})
        except Exception as e:  # noqa: BLE001 - report, keep serving
            conn.send({"id": msg["id"], "ok": False, "stale": False, "error": f"{type(e).__name__}: {e}"})


class RankerClient:
    """Owns the ranking process: sends requests, matches answers, restarts the process when it dies --
    or when it stops answering: ``hang_after`` calls in a row that time out (a process stopped, stuck
    or thrashing) and it is killed, so the supervisor restarts it. Until then each call waits out its
    timeout; ``responsive`` is False from the first timeout to the next answer."""

    def __init__(self, *, timeout_s: float = 2.0, restart_delay_s: float = 0.2, threads: int = 1,
                 hang_after: int = 3) -> None:
        self.timeout_s = timeout_s
        self.rank_calls = 0  # ranking calls sent, and the history rows they carried (a micro-batch's, in parts)
        self.rows_ranked = 0
        self.hang_after = max(1, hang_after)
        self.timeouts_in_a_row = 0
        self.hang_kills = 0
        self.restart_delay_s = restart_delay_s
        self.threads = threads
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._proc: Any = None
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self.restarts = 0
        self._supervisor: threading.Thread | None = None
        # called (on the supervisor thread) once a restarted ranking process answers: e.g. warm it
        self.after_restart: Callable[[], None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "RankerClient":
        self._spawn()
        self._supervisor = threading.Thread(target=self._supervise, name="genrec-ranker-supervisor", daemon=True)
        self._supervisor.start()
        return self

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=ranker_main, args=(child, self.threads), name="genrec-ranker", daemon=True)
        proc.start()
        child.close()
        with self._state_lock:
            self._proc, self._conn = proc, parent
        threading.Thread(target=self._read_loop, args=(parent,), name="genrec-ranker-reader", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def responsive(self) -> bool:
        """Alive, and its last call did not time out."""
        return self.alive and self.timeouts_in_a_row == 0

    def _timed_out(self) -> None:
        with self._state_lock:
            self.timeouts_in_a_row += 1
            proc = self._proc if self.timeouts_in_a_row >= self.hang_after else None
            if proc is not None:
                self.timeouts_in_a_row = 0
                self.hang_kills += 1
        if proc is not None and proc.is_alive():
            log.warning("ranking process %s did not answer %d calls in a row: killing it (the supervisor restarts it)",
                        proc.pid, self.hang_after)
            proc.kill()  # also ends a stopped (SIGSTOP) process; the supervisor sees it exit

    def stop(self) -> None:
        self._stop.set()
        with self._state_lock:
            proc, conn = self._proc, self._conn
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        self._fail_all("ranking process stopped")

    def _supervise(self) -> None:
        while not self._stop.wait(0.05):
            proc = self._proc
            if proc is not None and not proc.is_alive():
                self._fail_all(f"ranking process {proc.pid} exited (code {proc.exitcode})")
                time.sleep(self.restart_delay_s)
                if self._stop.is_set():
                    return
                self.restarts += 1
                self._spawn()
                if self.after_restart is not None:
                    try:
                        self.wait_ready(60.0)
                        self.after_restart()
                    except Exception as e:  # noqa: BLE001 - requests load the model lazily instead
                        log.warning("warming the restarted ranking process failed: %s", e)

    def _read_loop(self, conn: Connection) -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError, TypeError) as e:
                if isinstance(e, TypeError) and not conn.closed:
                    raise
                # TypeError: stop() closed the pipe between recv()'s closed check and its read (CPython reads a
                # None handle then), the same end as a closed pipe
                if conn is self._conn:  # an old pipe closing must not fail the restarted process's calls
                    self._fail_all("ranking process pipe closed")
                return
            fut = self._pending.pop(int(msg["id"]), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def _fail_all(self, why: str) -> None:
        pend, self._pending = self._pending, {}
        for fut in pend.values():
            if not fut.done():
                fut.set_exception(RankerUnavailable(why))

    # ------------------------------------------------------------------ calls
    def _call(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        if not self.alive or self._conn is None:
            raise RankerUnavailable("ranking process is not running (restarting)")
        rid = next(self._ids)
        msg["id"] = rid
        fut: Future = Future()
        self._pending[rid] = fut
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, ValueError, BrokenPipeError) as e:
            self._pending.pop(rid, None)
            raise RankerUnavailable(f"cannot reach the ranking process: {e}") from e
        wait = self.timeout_s if timeout is None else timeout
        try:
            out = fut.result(timeout=wait)
        except FutureTimeout:
            self._pending.pop(rid, None)
            self._timed_out()
            raise RankerUnavailable(f"ranking process did not answer within {wait}s") from None
        self.timeouts_in_a_row = 0
        return out

    def ping(self, timeout: float = 30.0) -> int:
        return int(self._call({"op": "ping"}, timeout)["pid"])

    def wait_ready(self, timeout: float = 60.0) -> None:
        t_end = time.time() + timeout
        while True:
            try:
                self.ping(timeout=max(0.1, t_end - time.time()))
                return
            except RankerUnavailable:
                if time.time() > t_end:
                    raise
                time.sleep(0.05)

    def warm(self, pool: KVPool, ckpt: Path, timeout: float = 300.0, digest: str | None = None) -> list[list[str]]:
        """Have the ranking process load ``ckpt`` (on the pool's device; its weights must have sha256
        ``digest`` when given) and attach ``pool`` now, not on its first request; returns the
        (checkpoint, digest, device) triples it holds."""
        out = self._call({"op": "warm", "pool": str(pool.path), "ckpt": str(ckpt), "digest": digest}, timeout)
        if not out["ok"]:
            raise RankerUnavailable(f"ranking process could not load {ckpt}: {out['error']}")
        return list(out["models"])

    def status(self, timeout: float = 10.0) -> list[list[str]]:
        """The (checkpoint, digest, device) triples the ranking process holds (most recently used last)."""
        return list(self._call({"op": "status"}, timeout)["models"])

    def rank(self, pool: KVPool, leases: list[Lease], ckpt: Path, vecs: np.ndarray, sid: np.ndarray | None,
             surfaces: list[int], request_ts: list[int] | None, delay: float = 0.0,
             digest: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Action logits ``[B, m, C]`` of the B histories written to ``leases`` (one slot each, one token count:
        the rows of one batched forward) for their candidates ``vecs`` ``[B, m, Di]`` (SID codes ``[B, m, L]``),
        ranked as one batch; raises StaleSlotError (retry / re-encode) or RankerUnavailable. ``timeout``: seconds
        to wait instead of the client's (the warm-up's first calls compile and capture)."""
        self.rank_calls += 1
        self.rows_ranked += len(leases)
        msg = {"op": "rank", "pool": str(pool.path), "slots": [le.slot for le in leases],
               "gens": [le.gen for le in leases], "ckpt": str(ckpt), "digest": digest,
               "vecs": np.ascontiguousarray(vecs, np.float32), "sid": None if sid is None else np.ascontiguousarray(sid),
               "surface": [int(x) for x in surfaces], "ts": None if request_ts is None else [int(t) for t in request_ts],
               "delay": delay}
        out = self._call(msg, timeout)
        if out["ok"]:
            return out["logits"]
        if out.get("stale"):
            raise StaleSlotError(out["error"])
        raise RankerUnavailable(f"ranking process failed: {out['error']}")
