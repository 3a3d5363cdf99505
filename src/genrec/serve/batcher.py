"""Micro-batching of concurrent requests (issue 6 item 2: "micro-batched where that pays — measure it").

Requests that can share one forward (same k, beam width, lambda, sources, rank flag, surface,
request time) are grouped: the first request of a group becomes the *leader*, waits up to
``max_wait_ms`` for followers (or until ``max_batch`` are queued), then runs ONE batched call
(``Recommender.recommend`` on a list of histories = one padded prefill, one batched beam search,
one ANN search, one ranking decode) and hands each follower its row. No extra thread: batching
happens in the request threads themselves. Non-standard: a failing batch is retried row by row,
so one bad request cannot fail its neighbours.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

from genrec.errors import ConfigError


class MicroBatcher:
    """Group ``submit(key, item)`` calls with equal ``key`` into calls of ``fn(items) -> results``."""

    def __init__(self, max_batch: int = 8, max_wait_ms: float = 2.0) -> None:
        if max_batch < 1 or max_wait_ms < 0:
            raise ConfigError(f"micro-batch: max_batch >= 1 and max_wait_ms >= 0, got {max_batch}, {max_wait_ms}")
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1e3
        self._cv = threading.Condition()
        self._queues: dict[Hashable, list[tuple[Any, Future]]] = {}
        self.batches = 0
        self.items = 0

    def submit(self, key: Hashable, item: Any, fn: Callable[[Sequence[Any]], Sequence[Any]]) -> Any:
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
            self._run(batch, fn)
        return fut.result()

    def _run(self, batch: list[tuple[Any, Future]], fn: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
        self.batches += 1
        self.items += len(batch)
        try:
            outs = fn([it for it, _ in batch])
            for (_, f), o in zip(batch, outs):
                f.set_result(o)
        except Exception:  # noqa: BLE001 - isolate the failing request(s)
            if len(batch) == 1:
                import sys

                batch[0][1].set_exception(sys.exc_info()[1])  # type: ignore[arg-type]
                return
            for it, f in batch:
                try:
                    f.set_result(fn([it])[0])
                except Exception as e:  # noqa: BLE001
                    f.set_exception(e)
