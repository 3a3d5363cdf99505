"""Disambiguation level: unique full codes, deterministic by item_id, extension for new items."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import DataError
from genrec.sid.disambiguate import collision_rate, disambiguate, extend_disambiguation


def _sem(seed: int, n: int, L: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, k, size=(n, L))
    ids = rng.choice(10 * n + 10, size=n, replace=False)
    return codes, ids


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 80), L=st.integers(0, 3), k=st.integers(1, 4))
def test_disambiguate_matches_reference(seed: int, n: int, L: int, k: int) -> None:
    codes, ids = _sem(seed, n, L, k)
    out = disambiguate(codes, ids)
    # reference: group by prefix tuple, number by ascending id
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in range(n):
        groups[tuple(codes[i])].append(i)
    expect = np.zeros(n, dtype=np.int64)
    for rows in groups.values():
        for r, i in enumerate(sorted(rows, key=lambda i: ids[i])):
            expect[i] = r
    np.testing.assert_array_equal(out.codes[:, :L], codes)
    np.testing.assert_array_equal(out.codes[:, L], expect)
    assert len({tuple(r) for r in out.codes.tolist()}) == n  # 100% unique
    assert out.max_group == max(len(v) for v in groups.values()) == out.final_size
    assert out.collision_rate == pytest.approx(1 - len(groups) / n)
    assert collision_rate(codes) == pytest.approx(out.collision_rate)
    assert collision_rate(out.codes) == 0.0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 60), m=st.integers(0, 40), L=st.integers(1, 3),
       k=st.integers(1, 3))
def test_extend_matches_reference(seed: int, n: int, m: int, L: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    codes, ids = _sem(seed, n + m, L, k)
    old = disambiguate(codes[:n], ids[:n]).codes if n else np.zeros((0, L + 1), np.int32)
    new = extend_disambiguation(old, codes[n:], ids[n:])
    next_free: dict[tuple, int] = defaultdict(int)
    for row in old.tolist():
        next_free[tuple(row[:-1])] = max(next_free[tuple(row[:-1])], row[-1] + 1)
    expect = np.zeros(m, dtype=np.int64)
    for i in sorted(range(m), key=lambda i: ids[n + i]):
        p = tuple(codes[n + i])
        expect[i] = next_free[p]
        next_free[p] += 1
    np.testing.assert_array_equal(new[:, :L], codes[n:])
    np.testing.assert_array_equal(new[:, L], expect)
    both = np.concatenate([old, new])
    assert len({tuple(r) for r in both.tolist()}) == n + m
    del rng


def test_errors_name_fields() -> None:
    with pytest.raises(DataError, match="item_ids.*appears more than once"):
        disambiguate(np.zeros((3, 2), int), [1, 2, 1])
    with pytest.raises(DataError, match="negative"):
        disambiguate(np.array([[0, -1]]), [1])
    with pytest.raises(DataError, match="levels"):
        extend_disambiguation(np.zeros((2, 3), int), np.zeros((1, 3), int), [5])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 80), L=st.integers(0, 3), k=st.integers(1, 4))
def test_popularity_order_matches_reference(seed: int, n: int, L: int, k: int) -> None:
    codes, ids = _sem(seed, n, L, k)
    pop = np.random.default_rng(seed + 1).integers(0, 4, size=n)  # few values: ties broken by id
    out = disambiguate(codes, ids, popularity=pop)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in range(n):
        groups[tuple(codes[i])].append(i)
    expect = np.zeros(n, dtype=np.int64)
    for rows in groups.values():
        for r, i in enumerate(sorted(rows, key=lambda i: (-pop[i], ids[i]))):
            expect[i] = r
    np.testing.assert_array_equal(out.codes[:, :L], codes)
    np.testing.assert_array_equal(out.codes[:, L], expect)
    assert out.final_size == max(len(v) for v in groups.values())


def test_popularity_must_be_one_finite_number_per_item() -> None:
    with pytest.raises(DataError, match="popularity"):
        disambiguate(np.zeros((3, 1), int), [1, 2, 3], popularity=[1.0, 2.0])
    with pytest.raises(DataError, match="popularity"):
        disambiguate(np.zeros((2, 1), int), [1, 2], popularity=[1.0, np.nan])
