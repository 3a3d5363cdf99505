import numpy as np
import pytest
import torch

from genrec.errors import ConfigError, DataError
from genrec.infer.ann import AnnConfig, AnnIndex, DeviceFlatSearch, device_search


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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_device_search_answers_as_the_faiss_flat_index(seed):
    """DeviceFlatSearch (here on the CPU device; on a GPU in serving) against its twin, faiss's flat search: the same
    ids in the same order, the same scores and stored vectors, and past the index's end faiss's padding."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    x = _unit(rng, n, 16)
    ids = rng.permutation(10_000)[:n].astype(np.int64)
    idx = AnnIndex.build(x, ids)
    dev = DeviceFlatSearch(idx, "cpu")
    q = _unit(rng, int(rng.integers(1, 33)), 16)
    for k in (1, 10, n, n + 7):
        want = idx.search_and_reconstruct(q, k)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # a bf16 server searches under autocast: still float32
            got = dev.search_and_reconstruct(torch.from_numpy(q), k)
        assert got[1].dtype == want[1].dtype == np.float32 and got[2].dtype == np.float32
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.isnan(got[2]), np.isnan(want[2]))
        np.testing.assert_allclose(np.nan_to_num(got[2]), np.nan_to_num(want[2]), atol=1e-6)
        s_ids, s_sc = dev.search(q, k)  # numpy queries too
        np.testing.assert_array_equal(s_ids, want[0])
        np.testing.assert_allclose(s_sc, want[1], rtol=1e-5, atol=1e-5)
    assert len(dev) == n and dev.dim == 16 and dev.item_ids is idx.item_ids  # the rest is the index's


def test_device_search_chooses_and_refuses(monkeypatch):
    rng = np.random.default_rng(0)
    flat = AnnIndex.build(_unit(rng, 50, 8), np.arange(50))
    hnsw = AnnIndex.build(_unit(rng, 50, 8), np.arange(50), AnnConfig(kind="hnsw", m=8))
    monkeypatch.delenv("GENREC_ANN_SEARCH", raising=False)
    assert device_search(flat, "cpu") is flat  # auto: faiss on a CPU device
    assert isinstance(device_search(flat, "cpu", "device"), DeviceFlatSearch)
    monkeypatch.setenv("GENREC_ANN_SEARCH", "device")
    assert isinstance(device_search(flat, "cpu"), DeviceFlatSearch)
    assert device_search(flat, "cpu", "faiss") is flat
    with pytest.raises(ConfigError, match="flat index exactly; this one is 'hnsw'"):
        device_search(hnsw, "cpu")
    monkeypatch.setenv("GENREC_ANN_SEARCH", "gpu")
    with pytest.raises(ConfigError, match="GENREC_ANN_SEARCH"):
        device_search(flat, "cpu")
