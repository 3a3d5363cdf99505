"""Client threads for load tests that account for every request they send (tests only).

Each client thread sends ``POST path`` in a loop and records one :class:`Reply` per request -- its HTTP status,
or the type of the exception the request raised (a timeout, a reset) -- so a client that fails is counted, not
lost with its thread. :meth:`Load.check` then asserts on the totals: every thread ended, none died outside a
request, one reply per request sent, and every outcome among those allowed."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Reply:
    client: int
    n: int
    """The client's ``n``-th request (from 0)."""
    outcome: str
    """The HTTP status ("200", "503"), or the name of the exception the request raised ("ReadTimeout")."""
    body: Any
    """The answer's JSON (None: an exception, or a body that is not JSON)."""
    seconds: float
    error: str = ""
    """The exception's text, for an exception."""


class Load:
    """``clients`` threads, client ``i`` sending ``request(i, n)`` (the JSON body of its ``n``-th request) to
    ``path``: ``per_client`` requests each, or (``per_client=None``) until the ``with`` block ends."""

    def __init__(self, url: str, clients: int, request: Callable[[int, int], Any], *, path: str = "/v1/recommend",
                 per_client: int | None = None, timeout: float = 30.0) -> None:
        self.url, self.path, self.request, self.per_client, self.timeout = url, path, request, per_client, timeout
        self.replies: list[Reply] = []
        self.sent = 0
        self.crashed: list[str] = []
        """Exceptions that ended a client thread outside a request (each one a client gone silent)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self, timeout: float = 60.0) -> None:
        """Tell the clients to stop after their current request and wait for them (at most ``timeout`` s)."""
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float = 120.0) -> None:
        t_end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, t_end - time.monotonic()))

    def _client(self, i: int) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=self.timeout) as c:
                n = 0
                while not self._stop.is_set() and (self.per_client is None or n < self.per_client):
                    with self._lock:
                        self.sent += 1
                    self._record(self._send(c, i, n))
                    n += 1
        except BaseException as e:  # noqa: BLE001 - a thread that dies is reported by check(), never lost
            with self._lock:
                self.crashed.append(f"client {i}: {type(e).__name__}: {e}")

    def _send(self, c: httpx.Client, i: int, n: int) -> Reply:
        t0 = time.perf_counter()
        try:
            r = c.post(self.path, json=self.request(i, n))
        except Exception as e:  # noqa: BLE001 - every outcome is recorded: timeouts, resets, a bad request
            return Reply(i, n, type(e).__name__, None, time.perf_counter() - t0, str(e)[:300])
        seconds = time.perf_counter() - t0
        try:
            body = r.json()
        except ValueError:
            body = None
        return Reply(i, n, str(r.status_code), body, seconds)

    def _record(self, reply: Reply) -> None:
        with self._lock:
            self.replies.append(reply)

    def outcomes(self) -> Counter[str]:
        with self._lock:
            return Counter(r.outcome for r in self.replies)

    def check(self, allowed: Collection[str] = ("200",)) -> list[Reply]:
        """Assert that the load is fully accounted for and every outcome is allowed; returns the replies."""
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"client threads still running (hung): {alive}"
        assert not self.crashed, f"client threads died outside a request: {self.crashed}"
        got = self.outcomes()
        assert self.sent == len(self.replies) == sum(got.values()), (self.sent, len(self.replies), dict(got))
        if self.per_client is not None:
            assert self.sent == self.per_client * len(self._threads), (self.sent, dict(got))
        assert self.sent > 0, "no request was sent"
        bad = {k: v for k, v in got.items() if k not in allowed}
        examples = [f"{r.outcome}: {r.error or r.body}" for r in self.replies if r.outcome not in allowed][:3]
        assert not bad, f"outcomes of {self.sent} requests: {dict(got)}; not allowed: {bad}; e.g. {examples}"
        return list(self.replies)
