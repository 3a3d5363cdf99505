import numpy as np
import pytest

from genrec.errors import DataError
from genrec.infer.ann import AnnConfig, AnnIndex


def _unit(rng, n, d):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_index_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    x = _unit(rng, 500, 16)
    ids = rng.permutation(10_000)[:500].astype(np.int64)
    q = _unit(rng, 20, 16)
    idx = AnnIndex.build(x, ids)
    got_ids, got_s, got_v = idx.search_and_reconstruct(q, 10)
    s = q @ x.T
    want_rows = np.argsort(-s, axis=1, kind="stable")[:, :10]
    np.testing.assert_allclose(got_s, np.take_along_axis(s, want_rows, 1), atol=1e-5)
    # ids equal except where scores tie (measure-zero for continuous data)
    np.testing.assert_array_equal(got_ids, ids[want_rows])
    np.testing.assert_allclose(got_v, x[want_rows], atol=1e-6)


def test_ivf_and_hnsw_recall_and_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    x = _unit(rng, 4000, 16)
    ids = np.arange(4000, dtype=np.int64) + 7
    q = _unit(rng, 50, 16)
    exact, _ = AnnIndex.build(x, ids).search(q, 10)
    for cfg in (AnnConfig(kind="ivf", nlist=32, nprobe=32), AnnConfig(kind="hnsw", m=16, ef_search=200)):
        idx = AnnIndex.build(x, ids, cfg)
        got, _ = idx.search(q, 10)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, exact)])
        assert recall > 0.95, (cfg.kind, recall)
        idx.save(tmp_path / cfg.kind)
        again = AnnIndex.load(tmp_path / cfg.kind)
        got2, _, vecs = again.search_and_reconstruct(q, 10)
        np.testing.assert_array_equal(got2, got)
        np.testing.assert_allclose(vecs, x[got2 - 7], atol=1e-6)


def test_bad_vectors_named():
    x = np.ones((3, 4), dtype=np.float32)
    x[1, 2] = np.nan
    with pytest.raises(DataError, match="vectors"):
        AnnIndex.build(x, np.arange(3))
    with pytest.raises(DataError, match="duplicate"):
        AnnIndex.build(np.ones((2, 4), np.float32), np.array([1, 1]))
