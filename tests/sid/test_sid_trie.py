"""SidTrie CSR arrays against a plain set-of-prefixes reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import DataError
from genrec.sid.trie import SidTrie


def _table(seed: int, n: int, sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Unique random full codes int32[<=n, L] and distinct item ids."""
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, k, n) for k in sizes], axis=1) if sizes else np.zeros((n, 0), int)
    codes = np.unique(codes, axis=0)
    codes = codes[rng.permutation(len(codes))].astype(np.int32)
    ids = rng.choice(1000 * n + 10, size=len(codes), replace=False).astype(np.int64)
    return codes, ids


def _reference(codes: np.ndarray) -> list[list[tuple]]:
    """Sorted distinct prefixes per depth 0..L."""
    L = codes.shape[1]
    return [sorted({tuple(r[:d]) for r in codes.tolist()}) for d in range(L + 1)]


tables = st.tuples(st.integers(0, 2**31), st.integers(1, 60), st.lists(st.integers(1, 5), min_size=1, max_size=4))


@settings(max_examples=60, deadline=None)
@given(tables)
def test_arrays_match_reference(t) -> None:
    seed, n, sizes = t
    codes, ids = _table(seed, n, sizes)
    trie = SidTrie.build(codes, ids, sizes)
    ref = _reference(codes)
    L = len(sizes)
    assert trie.nodes_per_depth == [len(r) for r in ref]
    lex = sorted(range(len(codes)), key=lambda i: tuple(codes[i]))
    np.testing.assert_array_equal(trie.leaf_items, ids[lex])
    for d in range(L + 1):
        for j, p in enumerate(ref[d]):
            covered = [i for i in lex if tuple(codes[i][:d]) == p]
            assert list(trie.items_of_node(d, j)) == [ids[i] for i in covered]
    for d in range(L):
        node = {p: j for j, p in enumerate(ref[d + 1])}
        for j, p in enumerate(ref[d]):
            kids = [q for q in ref[d + 1] if q[:d] == p]
            lo, hi = trie.offsets[d][j], trie.offsets[d][j + 1]
            assert list(trie.codes[d][lo:hi]) == [q[d] for q in kids]  # ascending
            assert list(trie.children[d][lo:hi]) == [node[q] for q in kids]


@settings(max_examples=60, deadline=None)
@given(tables, st.integers(0, 2**31))
def test_child_valid_mask_node_of_prefix(t, qseed) -> None:
    seed, n, sizes = t
    codes, ids = _table(seed, n, sizes)
    trie = SidTrie.build(codes, ids, sizes)
    ref = _reference(codes)
    rng = np.random.default_rng(qseed)
    for d in range(len(sizes)):
        index_of = {p: j for j, p in enumerate(ref[d + 1])}
        nodes = np.append(rng.integers(-1, len(ref[d]), 40), [0, len(ref[d]) - 1])
        want = rng.integers(-1, sizes[d] + 2, nodes.shape[0])  # includes invalid codes
        got = trie.child(d, nodes, want)
        for b, (j, c) in enumerate(zip(nodes, want)):
            exp = -1 if j < 0 else index_of.get(ref[d][j] + (int(c),), -1)
            assert got[b] == exp
        mask = trie.valid_mask(d, nodes)
        assert mask.shape == (nodes.shape[0], sizes[d])
        for b, j in enumerate(nodes):
            exp = np.zeros(sizes[d], bool)
            if j >= 0:
                for q in ref[d + 1]:
                    if q[:d] == ref[d][j]:
                        exp[q[d]] = True
            np.testing.assert_array_equal(mask[b], exp)
        # node_of_prefix on real and random prefixes of depth d+1
        real = codes[rng.integers(0, len(codes), 10), : d + 1]
        rand = np.stack([rng.integers(0, k, 10) for k in sizes[: d + 1]], axis=1)
        pref = np.concatenate([real, rand])
        got = trie.node_of_prefix(pref)
        assert [index_of.get(tuple(r), -1) for r in pref.tolist()] == got.tolist()
    assert trie.node_of_prefix(np.zeros((3, 0), int)).tolist() == [0, 0, 0]


def test_save_load_mmap(tmp_path) -> None:
    codes, ids = _table(3, 200, [4, 3, 5])
    trie = SidTrie.build(codes, ids, [4, 3, 5])
    trie.save(tmp_path / "t")
    back = SidTrie.load(tmp_path / "t", mmap=True)
    assert isinstance(back.offsets[0], np.memmap)
    for a, b in zip(trie.offsets + trie.codes + trie.leaf_start, back.offsets + back.codes + back.leaf_start):
        np.testing.assert_array_equal(a, b)
    q = codes[:50, :2]
    np.testing.assert_array_equal(back.node_of_prefix(q), trie.node_of_prefix(q))
    np.testing.assert_array_equal(back.valid_mask(1, np.arange(4)), trie.valid_mask(1, np.arange(4)))


def test_errors() -> None:
    with pytest.raises(DataError, match="share the full code"):
        SidTrie.build(np.array([[0, 1], [0, 1]]), [1, 2], [2, 2])
    with pytest.raises(DataError, match="codebook size"):
        SidTrie.build(np.array([[0, 2]]), [1], [2, 2])
    with pytest.raises(DataError, match="codebook sizes"):
        SidTrie.build(np.array([[0, 1]]), [1], [2])
    trie = SidTrie.build(np.array([[0, 1]]), [1], [2, 2])
    with pytest.raises(ValueError, match="node_ids"):
        trie.child(0, [5], [0])
    with pytest.raises(ValueError, match="depth"):
        trie.valid_mask(2, [0])
