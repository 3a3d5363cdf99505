"""Micro-batching of concurrent requests (issue 6 item 2: "micro-batched where that pays — measure it").

Requests that can share one forward (same k, beam width, lambda, sources, rank flag, surface,
request time: the *key*) are grouped into ONE batched call (``Recommender.recommend`` on a list of
histories = one padded prefill, one batched beam search, one ANN search, one ranking decode), and
each request gets its own row back. No extra thread: batching happens in the request threads
themselves. Two policies:

``busy`` (dynamic batching without a timer): a request that finds the batcher idle
runs at once, alone, with no wait. Requests that arrive while a batch is running queue up. When
the running batch finishes, its leader hands over to ONE queued thread, which becomes the next
leader and runs up to ``max_batch`` queued requests of one key in one call; the other requests of
that batch get their rows; leadership passes on while requests remain queued, and the batcher
goes idle when the queue is empty. Batches form only under load, and exactly as large as the load
made them. At most one batch runs at a time per batcher, whatever its key: requests of other
keys queue too rather than start a second forward beside the running one (the GPU serialises the
two anyway, on the CPU torch's intra-op threads already use every core, and a second concurrent
forward would only slow the first down and keep the queue from forming). The next batch takes the
key of the OLDEST queued request (first come, first served across keys: no key starves) and, of
that key, up to ``max_batch`` requests in arrival order.

On the CPU (``python benchmarks/bench_serve.py RUN --modes one,batch8busy,batch8timed --clients 1,4,8``):
with one client ``busy`` costs nothing over no batching, where ``timed`` added 3-5 ms to the p50. Under a
CLOSED loop of N clients ``busy`` phase-locks: the request that queued behind a batch runs alone while the batch's N-1
clients come back, and then they run together; batches alternate 1, N-1 (rows per forward 2.0 at
4 clients, 4.0 at 8), where the timed wait gathers ~3.3 at 4 clients. So ``timed`` gave more QPS
at 4 clients; at 8 the two were close, ``busy`` with the lower p99. Breaking the lock needs a
wait, i.e. a timer: that is the ``timed`` policy. Under heavy load ``busy`` wins by far (``--modes
one,default,batch32 --clients 1,16,64``, :data:`genrec.serve.config.DEFAULT_MICRO_BATCH_POLICY`): its batches
fill, one forward at a time, where timed groups run side by side and contend; ``busy`` is the server's default.

``timed`` (the earlier default): the first request of a key (the leader) waits up to
``max_wait_ms`` for followers (or until ``max_batch`` are queued), then runs the group. Groups of
different keys, and a new group of the same key, can run side by side. Every request pays up to
``max_wait_ms`` even alone.

``busy`` with a linger (``linger_ms`` > 0; ``genrec serve`` sets 3 ms on a CUDA server with front processes, else
off, :func:`genrec.serve.config.default_linger_ms`): under a closed loop the clients fall into cohorts whose
batches alternate, and a request that reaches the batcher just after its cohort's batch started waits a whole batch
more (at 64 clients on one H100: two cohorts of ~32, the p99 three batch periods where the p50 is two). A batch
smaller than the batch two before it (its cohort's last) therefore waits up to ``linger_ms`` for more requests of its
key before it runs; one as large runs at once, and at one client every batch does.

A request may also join with no thread waiting for it (:meth:`MicroBatcher.submit_async`, busy policy: what the
engine of ``--fronts`` does with a front's request): a batch whose first request came so is led by one of the
batcher's two runner threads. Every batch settles its answers after handing over, so the next batch starts first.

A batch may hand the leadership on before it ends (:meth:`MicroBatcher.handover`): in two-process mode a batch
whose rows wait on the ranking process lets the next batch encode and retrieve meanwhile. (``--host-overlap``, off by
default, keeps host work out of the batch instead: a request parses its history before it queues and formats its
answer after, :class:`genrec.serve.service.Service`.)

Non-standard, both policies: a failing batch is retried row by row, so one bad request cannot
fail its neighbours; a batch whose call returns the wrong number of rows is retried the same way.
If a leader dies of something that is not an ``Exception``, every request of its batch still gets
an error and the leadership still passes on: no thread waits forever.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from genrec.errors import ConfigError
from genrec.serve.config import DEFAULT_MICRO_BATCH_POLICY

POLICIES = ("busy", "timed")

Fn = Callable[[Sequence[Any]], Sequence[Any]]


class _Entry:
    """One queued request (busy policy): its key, item, call, and where its answer goes."""

    __slots__ = ("key", "item", "fn", "fut", "wake", "batch", "t0")

    def __init__(self, key: Hashable, item: Any, fn: Fn, waits: bool = True) -> None:
        self.key, self.item, self.fn = key, item, fn
        self.t0 = time.perf_counter()  # when it was submitted (its wait: until its batch starts)
        self.fut: Future = Future()
        # set when answered, or when made the next leader; None: no thread waits (submit_async), a runner leads
        self.wake = threading.Event() if waits else None
        self.batch: list[_Entry] | None = None  # set (on the batch's first entry) to hand over leadership


def _rows(items: Sequence[Any], fn: Fn) -> list[tuple[bool, Any]]:
    """One call for the whole batch; if it fails (or returns the wrong number of rows), row by row: each item's
    (ok, result or error)."""
    try:
        outs = fn(list(items))
        if len(outs) != len(items):
            raise RuntimeError(f"micro-batch: {len(items)} items gave {len(outs)} results")
        return [(True, o) for o in outs]
    except Exception:  # noqa: BLE001 - isolate the failing request(s)
        if len(items) == 1:
            return [(False, sys.exc_info()[1])]
        got: list[tuple[bool, Any]] = []
        for it in items:
            try:
                got.append((True, fn([it])[0]))
            except Exception as e:  # noqa: BLE001
                got.append((False, e))
        return got


def _settle(futs: Sequence[Future], got: Sequence[tuple[bool, Any]]) -> None:
    for f, (ok, v) in zip(futs, got):
        f.set_result(v) if ok else f.set_exception(v)


def _run_rows(batch: Sequence[tuple[Any, Future]], fn: Fn) -> None:
    """:func:`_rows` of the batch, into its futures."""
    _settle([f for _, f in batch], _rows([it for it, _ in batch], fn))


class MicroBatcher:
    """Group ``submit(key, item, fn)`` calls with equal ``key`` into calls of ``fn(items) -> results``.

    ``policy="busy"`` (default, as the server's): batch only while a batch is running, no timer (``max_wait_ms``
    is not used); ``on_wait`` gets each request's wait (ms) until its batch started. ``policy="timed"``: a group's
    first request waits up to ``max_wait_ms`` for more. ``linger_ms`` (busy policy): a batch smaller than the batch
    two before it waits up to this long for more (see the module's docstring).
    ``batches`` / ``items`` count the calls made and the requests they served."""

    def __init__(self, max_batch: int = 8, max_wait_ms: float = 2.0, policy: str = DEFAULT_MICRO_BATCH_POLICY,
                 on_wait: Callable[[float], None] | None = None, linger_ms: float = 0.0) -> None:
        if max_batch < 1 or max_wait_ms < 0 or not linger_ms >= 0:
            raise ConfigError(f"micro-batch: max_batch >= 1, max_wait_ms >= 0 and linger_ms >= 0, got {max_batch}, "
                              f"{max_wait_ms}, {linger_ms}")
        if policy not in POLICIES:
            raise ConfigError(f"micro-batch policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1e3
        self.on_wait = on_wait  # busy policy: each request's wait (ms) from submit to its batch's start
        self.policy = policy
        self.batches = 0
        self.items = 0
        # timed
        self._cv = threading.Condition()
        self._queues: dict[Hashable, list[tuple[Any, Future]]] = {}
        # busy
        self._lock = threading.Lock()
        self._busy = False  # a batch is running (or being handed over)
        self._pending: deque[_Entry] = deque()
        self.linger = linger_ms / 1e3  # busy policy: how long a batch smaller than its cohort's last waits for more
        self._arrived = threading.Condition(self._lock)  # notified when a request queues (a lingering batch waits)
        self._recent = (0, 0)  # the sizes of the last two batches (the older one: the next batch's cohort's last)
        self._local = threading.local()  # the running batch's handover, in its leader's thread
        self._runner: ThreadPoolExecutor | None = None  # leads the batches of submit_async (made on first use)

    def submit(self, key: Hashable, item: Any, fn: Fn) -> Any:
        """``fn([item])[0]``, possibly computed in one call together with other requests of ``key``."""
        if self.policy == "busy":
            return self._submit_busy(key, item, fn)
        return self._submit_timed(key, item, fn)

    # ------------------------------------------------------------------ busy
    def _submit_busy(self, key: Hashable, item: Any, fn: Fn) -> Any:
        e = _Entry(key, item, fn)
        with self._lock:
            if self._busy:
                self._pending.append(e)
                self._arrived.notify()
                batch = None
            else:
                self._busy = True
                batch = [e]
        if batch is None:
            assert e.wake is not None  # (a waiting entry)
            e.wake.wait()
            if e.batch is None:  # answered by another leader
                return e.fut.result()
            batch = e.batch
        self._lead(batch)
        return e.fut.result()

    def handover(self, ready_only: bool = False) -> None:
        """Called by a busy-policy batch's ``fn`` in its leader's thread once the next batch may start beside it
        (two-process mode: its rows are in the KV pool and wait on the ranking process; ``ServeConfig.pipeline``: it
        holds the model, so the next batch forms and parses meanwhile): the next batch starts now. A no-op anywhere
        else, and after the first call. ``ready_only``: only if the requests queued of the oldest key already make a
        batch as large as the one two before this one (the next batch's cohort's last): else the batch hands over
        when it ends, as without the call, and the next batch is not cut short."""
        hand = getattr(self._local, "handover", None)
        if hand is not None and ready_only:
            with self._lock:
                key = self._pending[0].key if self._pending else None
                if sum(1 for x in self._pending if x.key == key) < self._cohort():
                    return
        if hand is not None:
            self._local.handover = None
            hand()

    def submit_async(self, key: Hashable, item: Any, fn: Fn) -> Future:
        """``fn([item])[0]`` as a future, computed like :meth:`submit`'s (busy policy) but with no thread waiting for
        it: a batch whose first request was submitted so runs in the batcher's runner threads, and the future is
        settled (its callbacks run) once the next batch has started. What ``genrec serve --fronts`` does with the
        requests the fronts send, so a request costs the engine no thread of its own."""
        if self.policy != "busy":
            raise ConfigError(f"micro-batch: submit_async needs the busy policy, not {self.policy!r}")
        e = _Entry(key, item, fn, waits=False)
        with self._lock:
            if self._busy:
                self._pending.append(e)
                self._arrived.notify()
                return e.fut
            self._busy = True
        self._run_elsewhere([e])
        return e.fut

    def _run_elsewhere(self, batch: list[_Entry]) -> None:
        """Lead ``batch`` in a runner thread (three: one batch runs while the last one's answers are settled and,
        where a batch hands over early (:meth:`handover`), the next one forms)."""
        with self._lock:
            if self._runner is None:
                self._runner = ThreadPoolExecutor(3, thread_name_prefix="genrec-batch")
            runner = self._runner
        runner.submit(self._lead, batch)

    def _lead(self, batch: list[_Entry]) -> None:
        """Run ``batch`` (a waiting thread's own request is its first entry), then hand over (unless ``fn`` called
        :meth:`handover`) or go idle, then settle its answers: the next batch starts before they go out."""
        handed = threading.Event()
        # its leader holds the list now: the first entry's reference to it (which hands leadership over) would make
        # the whole batch -- entries, futures, histories, answers -- one reference cycle, left for the cyclic GC,
        # whose collections of them stalled the engine ~25 ms at a time under load
        batch[0].batch = None
        self._gather(batch)
        if self.on_wait is not None:
            now = time.perf_counter()
            for x in batch:
                self.on_wait((now - x.t0) * 1e3)

        def hand() -> None:
            if not handed.is_set():
                handed.set()
                self._pass_on()

        self._local.handover = hand
        got: list[tuple[bool, Any]] | None = None
        try:
            got = _rows([x.item for x in batch], batch[0].fn)
        finally:
            self._local.handover = None
            with self._lock:
                self.batches += 1
                self.items += len(batch)
            hand()
            if got is not None:
                _settle([x.fut for x in batch], got)
            for x in batch:
                if not x.fut.done():  # the leader died of a BaseException: fail its batch, do not hang it
                    x.fut.set_exception(RuntimeError("micro-batch: the batch's leader was interrupted"))
            for x in batch[1:]:
                if x.wake is not None:
                    x.wake.set()

    def _gather(self, batch: list[_Entry]) -> None:
        """Linger (``linger_ms``): while ``batch`` is smaller than the batch two before it, take queued requests of
        its key into it as they come, for up to ``linger_ms``; then note its size (without a linger: only that)."""
        with self._lock:
            want = self._cohort() if self.linger > 0 else 0
            deadline = time.perf_counter() + self.linger
            while len(batch) < want:
                key, rest = batch[0].key, deque[_Entry]()
                for x in self._pending:
                    (batch if x.key == key and len(batch) < want else rest).append(x)
                self._pending = rest
                left = deadline - time.perf_counter()
                if len(batch) >= want or left <= 0:
                    break
                self._arrived.wait(left)
            self._recent = (self._recent[1], len(batch))

    def _cohort(self) -> int:
        """The older of the last two batches noted, at most ``max_batch``: the size a batch's cohort had last time
        (for a batch gathering: two before it; for the next one, while one runs: the one before that). What a
        lingering batch waits for and a ready-only hand-over needs queued. Under ``_lock``."""
        return min(self.max_batch, self._recent[0])

    def _pass_on(self) -> None:
        """Make the oldest queued request's key's batch the next one and wake its leader, or go idle."""
        nxt: list[_Entry] | None = None
        with self._lock:
            if self._pending:
                key = self._pending[0].key  # the oldest queued request's key goes next
                nxt, rest = [], deque[_Entry]()
                for x in self._pending:
                    (nxt if x.key == key and len(nxt) < self.max_batch else rest).append(x)
                self._pending = rest
                nxt[0].batch = nxt
            else:
                self._busy = False
        if nxt is None:
            return
        lead = nxt[0].wake
        if lead is not None:
            lead.set()  # the next leader first: the device gets its next batch at once
        else:
            self._run_elsewhere(nxt)  # no thread waits on its first request

    # ------------------------------------------------------------------ timed
    def _submit_timed(self, key: Hashable, item: Any, fn: Fn) -> Any:
        fut: Future = Future()
        with self._cv:
            existing = self._queues.get(key)
            leader = existing is None
            q: list[tuple[Any, Future]] = [] if existing is None else existing
            if leader:
                self._queues[key] = q
            q.append((item, fut))
            if len(q) >= self.max_batch:
                self._cv.notify_all()
            if leader:
                t_end = time.monotonic() + self.max_wait
                while len(q) < self.max_batch:
                    left = t_end - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                batch = self._queues.pop(key)  # later arrivals start a new group
        if leader:
            with self._cv:
                self.batches += 1
                self.items += len(batch)
            _run_rows(batch, fn)
        return fut.result()
