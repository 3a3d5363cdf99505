"""The one-launch Triton trie step vs TorchTrie's torch ops and the set-of-prefixes reference.

Under the CPU interpreter (TRITON_INTERPRET set before triton is imported). Random code tables
of 1-4 levels, codebooks that are not powers of two, node ids of every depth including -1 (no
node) and codes outside the codebook; dense and CSR levels both; exact equality.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

from genrec.kernels import trie_step  # noqa: E402
from genrec.kernels.trie_step import advance_triton, valid_mask_triton  # noqa: E402
from tests.decode.test_decode_trie_torch import make_trie, prefix_nodes, random_table  # noqa: E402

_INTERPRETED = type(trie_step._valid_mask_kernel).__name__ == "InterpretedFunction"
pytestmark = pytest.mark.skipif(not _INTERPRETED,
                                reason="genrec.kernels.trie_step was imported before TRITON_INTERPRET=1 was set")


def _levels(trie):  # type: ignore[no-untyped-def]
    return [trie._level(d) for d in range(trie.n_levels)]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 80), st.integers(0, 2**31 - 1), st.booleans())
def test_trie_step_equals_the_torch_path_and_the_prefix_sets(n_levels: int, n: int, seed: int, force_csr: bool) -> None:
    rng = np.random.default_rng(seed)
    ks = [int(x) for x in rng.integers(2, 40, n_levels)]
    codes = random_table(rng, n_levels, ks, n)
    trie = make_trie(codes, ks, dense_max_entries=0 if force_csr else 1 << 20)
    for d, lv in enumerate(_levels(trie)):
        nodes = prefix_nodes(codes, d)  # reference numbering of depth-d nodes
        ids = torch.from_numpy(np.r_[rng.integers(-1, len(nodes), 40), [-1, 0, len(nodes) - 1]].astype(np.int64))
        got = valid_mask_triton(ids, lv.offsets, lv.codes, lv.has_child, lv.k)
        assert torch.equal(got, trie.valid_mask_reference(d, ids))
        assert torch.equal(valid_mask_triton(ids, lv.offsets, lv.codes, None, lv.k),
                           trie.valid_mask_reference(d, ids, force_csr=True))
        children = {tuple(int(x) for x in r[:d + 1]) for r in codes}
        for i, j in enumerate(ids.tolist()):  # the set-of-prefixes reference
            want = [j >= 0 and nodes[j] + (c,) in children for c in range(lv.k)]
            assert got[i].tolist() == want
        q = torch.from_numpy(rng.integers(-2, lv.k + 2, len(ids)).astype(np.int64))
        take = rng.random(len(ids)) < 0.6  # most queries along a real edge
        real = got.float().argmax(1)
        q = torch.where(torch.from_numpy(take) & got.any(1), real, q)
        adv = advance_triton(ids, q, lv.offsets, lv.codes, lv.children, lv.k, lv.max_fanout)
        assert torch.equal(adv, trie.advance_reference(d, ids, q))
        assert (adv >= 0).any() or not got.any()


def test_wide_fanout_and_chunking() -> None:
    """One node with every code of a 300-code level (several CHUNK_F chunks, BLOCK_K 512), and
    binary search over the full segment."""
    codes = np.stack([np.zeros(300, np.int64), np.arange(300)], 1)
    trie = make_trie(codes, [3, 300], dense_max_entries=0)
    lv = trie._level(1)
    ids = torch.tensor([0, -1, 0], dtype=torch.int64)
    m = valid_mask_triton(ids, lv.offsets, lv.codes, None, lv.k, chunk_f=16)
    assert m[0].all() and not m[1].any() and m[2].all()
    q = torch.tensor([0, 5, 299], dtype=torch.int64)
    assert advance_triton(ids, q, lv.offsets, lv.codes, lv.children, lv.k, lv.max_fanout).tolist() == [0, -1, 299]
    assert torch.equal(advance_triton(ids, q, lv.offsets, lv.codes, lv.children, lv.k, lv.max_fanout),
                       trie.advance_reference(1, ids, q))
