"""Issue-2 acceptance on the real Amazon Beauty catalogue, through the real pipeline:
ingest -> Iceberg tables -> TF-IDF content vectors -> residual k-means SIDs. Every item gets a
unique full code; the CSR trie and the memory-mapped index agree with the SID table for
every item; a random prefix of each depth returns exactly the items with that prefix.
Without the datasets, the same on the synthetic stand-in (tests/synthetic_datasets.py), whose counts it checks."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from genrec.features.store import ItemVectors
from genrec.recipes import pipeline
from genrec.sid.build import open_current
from tests.synthetic_datasets import is_synthetic, stats

REAL = {"users": 22363, "items": 12101, "events": 198502}


@pytest.fixture(scope="module")
def beauty_sids(tmp_path_factory: pytest.TempPathFactory, data_root):  # noqa: ANN001
    wd = tmp_path_factory.mktemp("beauty")
    folder = data_root / "amazon-beauty-2014"
    want = stats(folder) if is_synthetic(folder) else REAL
    man = pipeline.prepare(wd, "amazon-beauty-2014", data_dir=data_root, n_buckets=4)
    assert man["counts"]["users"] == want["users"] and man["counts"]["items"] == want["items"]
    assert man["counts"]["events"] == want["events"]
    pipeline.build_item_features(wd, content_dim=32, engagement_dim=8)
    pipeline.build_semantic_ids(wd, levels=3)
    return wd, open_current(wd / "sid"), ItemVectors.load(wd / "features"), want["items"]


def test_beauty_every_item_has_a_unique_full_code(beauty_sids) -> None:  # noqa: ANN001
    _, sb, vecs, n_items = beauty_sids
    assert len(sb.item_ids) == n_items
    assert set(sb.item_ids.tolist()) == set(np.asarray(vecs.item_ids).tolist())
    assert len({tuple(c) for c in sb.codes.tolist()}) == n_items  # 100% unique
    assert sb.stats["unique_rate"] == 1.0


def test_beauty_trie_and_index_agree_with_the_sid_table(beauty_sids) -> None:  # noqa: ANN001
    _, sb, _, _ = beauty_sids
    codes = np.asarray(sb.codes)
    ids = np.asarray(sb.item_ids)
    # index: codes_of every item equals the table
    np.testing.assert_array_equal(np.asarray(sb.index.codes_of(ids)), codes)
    # trie: walking every full code reaches a leaf whose item is that item
    node = np.zeros(len(ids), dtype=np.int64)
    for d in range(codes.shape[1]):
        node = sb.trie.child(d, node, codes[:, d].astype(np.int64))
        assert (node >= 0).all()
    np.testing.assert_array_equal(np.asarray(sb.trie.leaf_items)[node], ids)


def test_beauty_prefix_lookup_equals_a_plain_dict(beauty_sids) -> None:  # noqa: ANN001
    _, sb, _, _ = beauty_sids
    codes = np.asarray(sb.codes)
    ids = np.asarray(sb.item_ids)
    rng = np.random.default_rng(0)
    for depth in range(codes.shape[1] + 1):
        ref: dict[tuple[int, ...], set[int]] = defaultdict(set)
        for c, i in zip(codes[:, :depth].tolist(), ids.tolist()):
            ref[tuple(c)].add(i)
        keys = list(ref)
        for j in rng.choice(len(keys), min(50, len(keys)), replace=False):
            prefix = keys[j]
            assert set(np.asarray(sb.index.lookup(list(prefix))).tolist()) == ref[prefix]
        # a prefix no item has returns nothing
        if depth:
            absent = tuple([max(sb.codebook_sizes[d] for d in range(depth))] * depth)
            assert absent not in ref and len(sb.index.lookup(list(absent))) == 0
