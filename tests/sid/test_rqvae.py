"""RQVAE: trains, codes are deterministic, state round-trips, deeper levels reconstruct better."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genrec.errors import ConfigError, DataError
from genrec.sid.rqkmeans import ResidualKMeans
from genrec.sid.rqvae import RQVAE


def _clustered(n: int = 400, d: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((10, d)) * 3
    return (centers[rng.integers(0, 10, n)] + rng.standard_normal((n, d))).astype(np.float32)


def test_train_encode_roundtrip(tmp_path) -> None:
    torch.set_num_threads(1)
    x = _clustered()
    m = RQVAE(3, 8, epochs=30, batch_size=64, seed=1)
    codes = m.fit_encode(x)
    assert codes.shape == (400, 3) and codes.dtype == np.int32 and codes.max() < 8
    assert m.stats["loss_last"] < m.stats["loss_first"]
    errs = [e["relative"] for e in m.level_errors(x, codes)]
    assert errs[-1] < errs[0] < 1.0, errs
    np.testing.assert_array_equal(m.encode(x), codes)
    again = RQVAE(3, 8, epochs=30, batch_size=64, seed=1).fit_encode(x)
    np.testing.assert_array_equal(again, codes)  # deterministic for a seed
    m.save(tmp_path / "q.safetensors")
    back = RQVAE.load(tmp_path / "q.safetensors")
    np.testing.assert_array_equal(back.encode(x), codes)
    np.testing.assert_allclose(back.reconstruct(codes), m.reconstruct(codes), atol=1e-6)
    with pytest.raises(DataError, match="rqkmeans"):
        ResidualKMeans.from_state(m.state_dict())
    with pytest.raises(DataError, match="not 'rqvae'"):
        RQVAE.from_state(ResidualKMeans(1, 2, niter=2).fit(x).state_dict())


def test_errors() -> None:
    with pytest.raises(ConfigError):
        RQVAE(2, [4])
    with pytest.raises(ConfigError, match="not fitted"):
        RQVAE(2, 4).encode(np.zeros((1, 3), np.float32))
    m = RQVAE(1, 4, epochs=1).fit(_clustered(50, 4))
    with pytest.raises(DataError, match="dimension"):
        m.encode(np.zeros((2, 5), np.float32))
