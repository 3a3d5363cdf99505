"""The busy policy's linger (MicroBatcher(linger_ms=...)): a batch smaller than the batch two before it waits, for
up to the linger, for a straggler of its cohort; without it the straggler waits for the next batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from genrec.errors import ConfigError
from genrec.serve.batcher import MicroBatcher

BATCH_S = 0.3  # each batch's call takes this long: arrivals inside it queue


def _run(linger_ms: float, straggler_after_s: float) -> tuple[list[list[int]], dict[int, int]]:
    """Batches of sizes 1, 4, 1, then 3 queued and one straggler ``straggler_after_s`` after the fourth batch's
    turn came: returns the batches (their items) and each item's answer."""
    batches: list[list[int]] = []
    answers: dict[int, int] = {}
    lock = threading.Lock()

    def fn(items: Sequence[int]) -> list[int]:
        with lock:
            batches.append(list(items))
        time.sleep(BATCH_S)
        return [10 * x for x in items]

    mb = MicroBatcher(max_batch=8, policy="busy", linger_ms=linger_ms)

    def ask(x: int) -> None:
        answers[x] = mb.submit("k", x, fn)

    def go(xs: Sequence[int]) -> list[threading.Thread]:
        ts = [threading.Thread(target=ask, args=(x,)) for x in xs]
        for t in ts:
            t.start()
        return ts

    ts = go([1])  # batch 1: [1], alone; 2-5 queue behind it -> batch 2 (size 4)
    time.sleep(0.1)
    ts += go([2, 3, 4, 5])
    time.sleep(BATCH_S)  # batch 2 runs; 6 queues behind it -> batch 3 (size 1)
    ts += go([6])
    time.sleep(BATCH_S)  # batch 3 runs; 7-9 queue behind it -> batch 4, whose cohort's last (batch 2) held 4
    ts += go([7, 8, 9])
    time.sleep(BATCH_S - 0.1 + straggler_after_s)  # batch 4's turn comes ~0.1 s before the sleep's end
    ts += go([10])
    for t in ts:
        t.join(10)
    return batches, answers


def test_a_straggler_joins_its_cohorts_batch_with_a_linger() -> None:
    batches, answers = _run(linger_ms=2000, straggler_after_s=0.1)
    assert answers == {x: 10 * x for x in range(1, 11)}
    assert [sorted(b) for b in batches] == [[1], [2, 3, 4, 5], [6], [7, 8, 9, 10]]


def test_without_a_linger_the_straggler_waits_for_the_next_batch() -> None:
    batches, answers = _run(linger_ms=0, straggler_after_s=0.1)
    assert answers == {x: 10 * x for x in range(1, 11)}
    assert [sorted(b) for b in batches] == [[1], [2, 3, 4, 5], [6], [7, 8, 9], [10]]


def test_the_linger_is_bounded() -> None:
    """No straggler within the linger: the short batch runs once it has waited its linger, not longer."""
    batches, answers = _run(linger_ms=100, straggler_after_s=1.0)
    assert answers == {x: 10 * x for x in range(1, 11)}
    assert [sorted(b) for b in batches] == [[1], [2, 3, 4, 5], [6], [7, 8, 9], [10]]


def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ConfigError, match="linger_ms >= 0"):
        MicroBatcher(linger_ms=-1.0)
