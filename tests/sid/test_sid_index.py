"""SidIndex: prefix look-ups at every depth against a dict from prefix tuple to item set."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import ConfigError, DataError
from genrec.sid.index import SidIndex, level_bits
from genrec.sid.trie import SidTrie


def _table(seed: int, n: int, sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = np.unique(np.stack([rng.integers(0, k, n) for k in sizes], axis=1), axis=0)
    codes = codes[rng.permutation(len(codes))].astype(np.int32)
    ids = rng.choice(1000 * n + 10, size=len(codes), replace=False).astype(np.int64)
    return codes, ids


def _prefix_map(codes: np.ndarray, ids: np.ndarray) -> dict[tuple, set[int]]:
    m: dict[tuple, set[int]] = defaultdict(set)
    for row, i in zip(codes.tolist(), ids.tolist()):
        for d in range(len(row) + 1):
            m[tuple(row[:d])].add(i)
    return m


tables = st.tuples(st.integers(0, 2**31), st.integers(1, 80),
                   st.lists(st.sampled_from([1, 2, 3, 5, 8, 17, 256]), min_size=1, max_size=4))


@settings(max_examples=80, deadline=None)
@given(tables, st.integers(0, 2**31))
def test_lookup_matches_dict(t, qseed) -> None:
    seed, n, sizes = t
    codes, ids = _table(seed, n, sizes)
    idx = SidIndex.build(codes, ids, sizes, version="v0001")
    ref = _prefix_map(codes, ids)
    rng = np.random.default_rng(qseed)
    L = len(sizes)
    for d in range(L + 1):
        real = codes[rng.integers(0, len(codes), 8), :d]
        rand = np.stack([rng.integers(-1, k + 1, 8) for k in sizes[:d]], axis=1) if d else np.zeros((8, 0), int)
        pref = np.concatenate([real, rand]).astype(np.int64)
        for p in pref.tolist():
            got = idx.lookup(p)
            assert set(got.tolist()) == ref.get(tuple(p), set())
            assert len(got) == len(set(got.tolist()))
        for limit in (None, 2):
            off, items = idx.lookup_batch(pref, limit=limit)
            assert off.shape == (len(pref) + 1,) and off[0] == 0 and off[-1] == len(items)
            for b, p in enumerate(pref.tolist()):
                got = items[off[b]:off[b + 1]]
                exp = ref.get(tuple(p), set())
                if limit is None:
                    assert set(got.tolist()) == exp
                else:
                    assert len(got) == min(limit, len(exp)) and set(got.tolist()) <= exp
    # the index and the trie agree on lexicographic order and coverage
    trie = SidTrie.build(codes, ids, sizes)
    np.testing.assert_array_equal(np.asarray(idx.items), trie.leaf_items)
    np.testing.assert_array_equal(idx.codes_of(ids), codes)


@settings(max_examples=40, deadline=None)
@given(tables, st.integers(0, 2**31), st.integers(1, 4))
def test_fallback(t, qseed, min_items) -> None:
    seed, n, sizes = t
    codes, ids = _table(seed, n, sizes)
    idx = SidIndex.build(codes, ids, sizes)
    ref = _prefix_map(codes, ids)
    rng = np.random.default_rng(qseed)
    L = len(sizes)
    pref = np.concatenate([codes[rng.integers(0, len(codes), 8)],
                           np.stack([rng.integers(0, k + 1, 8) for k in sizes], axis=1)]).astype(np.int64)
    off, items, depth = idx.lookup_fallback(pref, min_items=min_items)
    for b, p in enumerate(pref.tolist()):
        exp_d = next((d for d in range(L, 0, -1) if len(ref.get(tuple(p[:d]), ())) >= min_items), 0)
        assert depth[b] == exp_d
        assert set(items[off[b]:off[b + 1]].tolist()) == ref[tuple(p[:exp_d])]


def test_save_load_mmap_and_64_bits(tmp_path) -> None:
    sizes = [2**16] * 4  # exactly 64 bits
    rng = np.random.default_rng(0)
    codes = np.unique(rng.integers(0, 2**16, (300, 4)), axis=0)
    codes[0] = [2**16 - 1] * 4  # the all-ones key must not overflow
    codes = np.unique(codes, axis=0)
    ids = np.arange(len(codes)) * 3
    idx = SidIndex.build(codes, ids, sizes, version="v0007")
    idx.save(tmp_path / "i")
    back = SidIndex.load(tmp_path / "i")
    assert isinstance(back.keys, np.memmap) and back.version == "v0007"
    assert not back.keys.flags.writeable
    np.testing.assert_array_equal(back.codes_of(ids[::-1]), codes[::-1])
    top = back.lookup([2**16 - 1])
    assert set(top.tolist()) == {int(i) for i, c in zip(ids, codes) if c[0] == 2**16 - 1}
    assert back.lookup([2**16 - 1] * 4).tolist() == [ids[codes.tolist().index([2**16 - 1] * 4)]]
    assert len(back.lookup([])) == len(codes)


def test_errors() -> None:
    with pytest.raises(ConfigError, match="65 bits"):
        level_bits([2**16, 2**16, 2**16, 2**16 + 1])
    codes = np.array([[0, 1], [1, 0]])
    idx = SidIndex.build(codes, [10, 11], [2, 2])
    with pytest.raises(KeyError, match=r"\[12\]"):
        idx.codes_of([10, 12])
    with pytest.raises(DataError, match="share one full code"):
        SidIndex.build(np.array([[0, 1], [0, 1]]), [1, 2], [2, 2])
    with pytest.raises(DataError, match="codebook size"):
        SidIndex.build(np.array([[0, 2]]), [1], [2, 2])
    with pytest.raises(ValueError, match="prefixes"):
        idx.lookup_batch(np.zeros((1, 3), int))
