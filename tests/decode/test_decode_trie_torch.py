"""TorchTrie (dense and CSR paths) against a plain set-of-prefixes reference.

Also home of ``build_trie_arrays``, the tiny test-side builder of the SidTrie array layout
(other decode tests import it from here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.decode.trie_torch import TorchTrie
from genrec.errors import DataError


def build_trie_arrays(codes: np.ndarray) -> dict[str, list[np.ndarray] | np.ndarray]:
    """SidTrie arrays from a code table int[N, L]: per-depth offsets/codes/children, leaf_items."""
    codes = np.asarray(codes, dtype=np.int64)
    order = np.lexsort(codes.T[::-1])  # lexicographic by column 0, then 1, ...
    srt = codes[order]
    n, n_levels = srt.shape
    node = np.zeros(n, dtype=np.int64)  # node id at depth d of each sorted row
    n_d = 1
    offsets, level_codes, children = [], [], []
    for d in range(n_levels):
        new = np.ones(n, dtype=bool)
        new[1:] = np.any(srt[1:, : d + 1] != srt[:-1, : d + 1], axis=1)  # first row of each depth-(d+1) prefix
        parent = node[new]
        offsets.append(np.concatenate([[0], np.cumsum(np.bincount(parent, minlength=n_d))]).astype(np.int64))
        level_codes.append(srt[new, d].astype(np.int32))
        children.append(np.arange(int(new.sum()), dtype=np.int64))
        node = np.cumsum(new) - 1
        n_d = int(new.sum())
    return {"offsets": offsets, "codes": level_codes, "children": children, "leaf_items": order[np.r_[True, np.any(srt[1:] != srt[:-1], axis=1)]]}


def make_trie(codes: np.ndarray, codebook_sizes: list[int], **kw: object) -> TorchTrie:
    a = build_trie_arrays(codes)
    return TorchTrie.from_arrays(a["offsets"], a["codes"], a["children"], codebook_sizes, "cpu", **kw)


def prefix_nodes(codes: np.ndarray, depth: int) -> list[tuple[int, ...]]:
    """Reference numbering: sorted distinct prefixes of length ``depth``."""
    return sorted({tuple(int(x) for x in row[:depth]) for row in codes})


def random_table(rng: np.random.Generator, n_levels: int, ks: list[int], n: int) -> np.ndarray:
    return np.stack([rng.integers(0, k, size=n) for k in ks], axis=1).reshape(n, n_levels)


tables = st.tuples(
    st.integers(1, 4),  # L
    st.integers(1, 60),  # N items (before dedupe)
    st.integers(0, 2**31 - 1),  # seed
)


@settings(max_examples=60, deadline=None)
@given(tables, st.booleans())
def test_valid_mask_and_advance_match_set_reference(spec: tuple[int, int, int], force_csr: bool) -> None:
    n_levels, n, seed = spec
    rng = np.random.default_rng(seed)
    ks = [int(k) for k in rng.integers(1, 7, size=n_levels)]
    codes = random_table(rng, n_levels, ks, n)
    prefixes = {tuple(int(x) for x in row[:d]) for row in codes for d in range(n_levels + 1)}
    trie = make_trie(codes, ks, dense_max_entries=0 if force_csr else 10**9)
    # node counts (the leaves' a host int, also for a cut trie) against the prefixes themselves
    assert [trie.n_nodes(d) for d in range(n_levels + 1)] == [len(prefix_nodes(codes, d)) for d in range(n_levels + 1)]
    for d in range(1, n_levels + 1):
        assert trie.cut(d).n_nodes(d) == len(prefix_nodes(codes, d))
    for d in range(n_levels):
        nodes_ref = prefix_nodes(codes, d)
        nodes_next = {p: i for i, p in enumerate(prefix_nodes(codes, d + 1))}
        assert trie.n_nodes(d) == len(nodes_ref)
        q = rng.integers(-1, len(nodes_ref), size=12)  # includes -1 (dead beams) and repeats
        mask = trie.valid_mask(d, torch.from_numpy(q)).numpy()
        qc = rng.integers(-1, ks[d] + 1, size=12)  # includes out-of-range codes
        adv = trie.advance(d, torch.from_numpy(q), torch.from_numpy(qc)).numpy()
        for i, j in enumerate(q):
            for c in range(ks[d]):
                want = j >= 0 and nodes_ref[j] + (c,) in prefixes
                assert mask[i, c] == want, (d, j, c)
            want_child = -1
            if j >= 0 and 0 <= qc[i] < ks[d]:
                want_child = nodes_next.get(nodes_ref[j] + (int(qc[i]),), -1)
            assert adv[i] == want_child, (d, j, qc[i])
    # walk / contains / valid_prefix_depth on random SIDs, half of them real
    probe = np.concatenate([codes[: max(1, n // 2)], random_table(rng, n_levels, ks, 20)])
    got_contains = trie.contains(torch.from_numpy(probe)).numpy()
    got_depth = trie.valid_prefix_depth(torch.from_numpy(probe)).numpy()
    for row, ok, dep in zip(probe, got_contains, got_depth):
        t = tuple(int(x) for x in row)
        assert ok == (t in prefixes)
        assert dep == max(dd for dd in range(n_levels + 1) if t[:dd] in prefixes)


def test_dense_and_csr_paths_agree_on_one_trie() -> None:
    rng = np.random.default_rng(0)
    ks = [8, 8, 8]
    codes = random_table(rng, 3, ks, 300)
    dense = make_trie(codes, ks)
    csr = make_trie(codes, ks, dense_max_entries=0)
    assert all(dense.is_dense(d) for d in range(3)) and not any(csr.is_dense(d) for d in range(3))
    for d in range(3):
        q = torch.from_numpy(rng.integers(-1, dense.n_nodes(d), size=200))
        c = torch.from_numpy(rng.integers(0, ks[d], size=200))
        assert torch.equal(dense.valid_mask(d, q), csr.valid_mask(d, q))
        assert torch.equal(dense.valid_mask(d, q), dense.valid_mask(d, q, force_csr=True))
        assert torch.equal(dense.advance(d, q, c), csr.advance(d, q, c))


def test_builder_matches_format_on_known_table() -> None:
    codes = np.array([[1, 0], [0, 2], [1, 1], [0, 0]])
    a = build_trie_arrays(codes)
    assert [o.tolist() for o in a["offsets"]] == [[0, 2], [0, 2, 4]]
    assert [c.tolist() for c in a["codes"]] == [[0, 1], [0, 2, 0, 1]]
    assert a["leaf_items"].tolist() == [3, 1, 0, 2]


def test_bad_arrays_name_the_field() -> None:
    a = build_trie_arrays(np.array([[0, 1], [1, 0]]))
    with pytest.raises(DataError, match=r"codes\[1\].*outside codebook"):
        TorchTrie.from_arrays(a["offsets"], a["codes"], a["children"], [2, 1])
    bad_off = [a["offsets"][0], np.array([0, 2, 1])]
    with pytest.raises(DataError, match=r"offsets\[1\]"):
        TorchTrie.from_arrays(bad_off, a["codes"], a["children"], [2, 2])
    unsorted = [a["codes"][0][::-1].copy(), a["codes"][1]]
    with pytest.raises(DataError, match=r"codes\[0\].*ascend"):
        TorchTrie.from_arrays(a["offsets"], unsorted, a["children"], [2, 2])
    with pytest.raises(DataError, match="one per level"):
        TorchTrie.from_arrays(a["offsets"][:1], a["codes"], a["children"], [2, 2])


@pytest.mark.gpu
def test_cuda_queries_take_the_triton_step_and_equal_the_torch_ops() -> None:
    """On CUDA valid_mask/advance run genrec.kernels.trie_step (compiled, not interpreted);
    they equal the torch reference ops on the same device, dense and CSR levels."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(5)
    ks = [256, 256, 256]
    codes = random_table(rng, 3, ks, 50_000)
    for dense_max in (0, 1 << 26):
        a = build_trie_arrays(codes)
        trie = TorchTrie.from_arrays(a["offsets"], a["codes"], a["children"], ks, "cuda", dense_max_entries=dense_max)
        for d in range(3):
            ids = torch.from_numpy(rng.integers(-1, trie.n_nodes(d), 300)).cuda()
            m = trie.valid_mask(d, ids)
            assert torch.equal(m, trie.valid_mask_reference(d, ids))
            q = torch.where(torch.from_numpy(rng.random(300) < 0.7).cuda() & m.any(1), m.float().argmax(1),
                            torch.from_numpy(rng.integers(-1, 258, 300)).cuda())
            assert torch.equal(trie.advance(d, ids, q), trie.advance_reference(d, ids, q))
