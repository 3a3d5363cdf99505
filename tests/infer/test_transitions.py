"""The L1 transition term's table: ``log P(candidate | last item)`` from add-one smoothed pair counts, against a
slow twin that counts pairs in a dict one by one, on fresh random sequences; its file round trip and errors."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import DataError
from genrec.infer.transitions import TransitionTable


def _twin(seqs: list[list[int]], n: int, last: list[int], rows: list[list[int]]) -> np.ndarray:
    pairs: Counter = Counter()
    out_deg: Counter = Counter()
    for s in seqs:
        for a, b in zip(s, s[1:]):
            if 0 <= a < n and 0 <= b < n:
                pairs[(a, b)] += 1
                out_deg[a] += 1
    want = np.zeros((len(last), len(rows[0]) if rows else 0))
    for i, (l, rs) in enumerate(zip(last, rows)):
        for j, r in enumerate(rs):
            if 0 <= l < n and 0 <= r < n:
                want[i, j] = math.log((pairs[(l, r)] + 1) / (out_deg[l] + n))
    return want


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.lists(st.integers(-1, n - 1), max_size=9), max_size=8),
    st.lists(st.tuples(st.integers(-1, n - 1), st.lists(st.integers(-1, n - 1), min_size=3, max_size=3)),
             min_size=1, max_size=5))))
def test_log_prob_equals_the_pair_counting_twin(case: tuple) -> None:
    n, seqs, queries = case
    t = TransitionTable.from_sequences([np.array(s, dtype=np.int64) for s in seqs], n)
    last = [q[0] for q in queries]
    rows = [q[1] for q in queries]
    got = t.log_prob(np.array(last), np.array(rows))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _twin(seqs, n, last, rows), rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.lists(st.integers(-1, n - 1), max_size=12), max_size=8),
    st.lists(st.integers(-2, n), min_size=1, max_size=6), st.integers(0, 5))))
def test_successors_are_the_most_frequent_next_rows(case: tuple) -> None:
    """The L0 transition source against a twin that counts each last row's next rows and sorts them: count
    first, then the lower row; -1 past them and for a last row outside the catalogue."""
    n, seqs, last, k = case
    t = TransitionTable.from_sequences([np.array(s, dtype=np.int64) for s in seqs], n)
    pairs: Counter = Counter((a, b) for s in seqs for a, b in zip(s, s[1:]) if 0 <= a < n and 0 <= b < n)
    got = t.successors(np.array(last), k)
    assert got.shape == (len(last), k) and got.dtype == np.int64
    for i, l in enumerate(last):
        nxt = sorted((b for (a, b) in pairs if a == l), key=lambda b: (-pairs[(l, b)], b))[:k]
        assert got[i].tolist() == nxt + [-1] * (k - len(nxt)), (l, got[i])


@pytest.mark.parametrize("seed", [0, 1])
def test_from_events_equals_from_sequences(seed: int) -> None:
    """Events sorted by user then order give the same table as each user's sequence."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(-1, 30, rng.integers(0, 12)) for _ in range(20)]
    users = np.concatenate([np.full(len(s), u) for u, s in enumerate(seqs)])
    a = TransitionTable.from_events(users, np.concatenate(seqs), 30)
    b = TransitionTable.from_sequences(seqs, 30)
    for x, y in zip((a.keys, a.counts, a.out_degree), (b.keys, b.counts, b.out_degree)):
        np.testing.assert_array_equal(x, y)


def test_file_round_trip_and_damaged_files_name_themselves(tmp_path: Path) -> None:
    t = TransitionTable.from_sequences([np.array([0, 1, 2, 1, 2]), np.array([2, 0])], 3)
    p = t.save(tmp_path / "sub" / "t.transitions.npz")
    u = TransitionTable.load(p)
    np.testing.assert_array_equal(u.log_prob(np.array([1, 2]), np.array([[2, 0], [0, 1]])),
                                  t.log_prob(np.array([1, 2]), np.array([[2, 0], [0, 1]])))
    assert [x.name for x in p.parent.iterdir()] == [p.name]  # no temporary file left
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    with pytest.raises(DataError, match="bad.npz"):
        TransitionTable.load(bad)
    other = tmp_path / "other.npz"
    np.savez(other, format=np.array("something/1"), keys=t.keys, counts=t.counts, out_degree=t.out_degree,
             n_items=np.array(3))
    with pytest.raises(DataError, match="format"):
        TransitionTable.load(other)
