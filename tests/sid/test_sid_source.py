"""Collaborative SIDs: what a build quantises (content, or content beside engagement), and how
``sid assign`` codes new items (content only) against such a codebook."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from genrec.errors import ConfigError, DataError
from genrec.sid import assign_sids, build_sids, open_current
from genrec.sid.build import new_item_vectors, sid_input_vectors

faiss.omp_set_num_threads(1)


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(n > 0, x / np.where(n > 0, n, 1), 0)


def test_content_source_is_the_content_vectors() -> None:
    c = np.random.default_rng(0).standard_normal((20, 5)).astype(np.float32)
    np.testing.assert_array_equal(sid_input_vectors(c, None, "content"), c)
    np.testing.assert_array_equal(sid_input_vectors(c, np.ones((20, 3), np.float32), "content"), c)


@pytest.mark.parametrize("w", [0.5, 1.0, 3.0])
def test_content_plus_engagement_matches_a_plain_formula(w: float) -> None:
    rng = np.random.default_rng(1)
    c = rng.standard_normal((30, 6)).astype(np.float32) * rng.uniform(0.1, 9, (30, 1)).astype(np.float32)
    e = rng.standard_normal((30, 4)).astype(np.float32)
    e[[3, 7]] = 0  # items nobody engaged with: a zero block, not NaN
    got = sid_input_vectors(c, e, "content+engagement", w)
    want = np.concatenate([_unit(c.astype(np.float64)), w * _unit(e.astype(np.float64))], 1)
    assert got.dtype == np.float32 and got.shape == (30, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.isfinite(got).all() and not got[[3, 7], 6:].any()


def test_bad_source_weight_and_shapes_are_named() -> None:
    c = np.ones((4, 3), np.float32)
    with pytest.raises(ConfigError, match="SID source"):
        sid_input_vectors(c, None, "engagement-only")
    with pytest.raises(ConfigError, match="engagement_weight"):
        sid_input_vectors(c, np.ones((4, 2), np.float32), "content+engagement", 0.0)
    with pytest.raises(ConfigError, match="engagement_weight"):
        sid_input_vectors(c, np.ones((4, 2), np.float32), "content+engagement", float("nan"))
    with pytest.raises(DataError, match="5 rows"):
        sid_input_vectors(c, np.ones((5, 2), np.float32), "content+engagement")


def test_co_engaged_items_share_prefixes_only_with_engagement(tmp_path) -> None:
    """Two groups whose content says nothing (random) but whose engagement separates them: the
    collaborative build's first level follows the groups, the content build's does not."""
    rng = np.random.default_rng(2)
    n = 240
    group = np.repeat([0, 1], n // 2)
    c = rng.standard_normal((n, 8)).astype(np.float32)
    e = (np.where(group[:, None] == 0, 1.0, -1.0) * np.ones((n, 4)) + 0.1 * rng.standard_normal((n, 4)))
    ids = np.arange(n, dtype=np.int64) + 1000

    def purity(codes: np.ndarray) -> float:  # share of items whose first code's majority group is theirs
        first = codes[:, 0]
        return float(np.mean([np.mean(group[first == k] == np.bincount(group[first == k]).argmax())
                              for k in first]))

    collab = build_sids(sid_input_vectors(c, e.astype(np.float32), "content+engagement", 2.0), ids,
                        tmp_path / "collab", levels=2, codebook_size=4, niter=10)
    content = build_sids(sid_input_vectors(c, None, "content"), ids, tmp_path / "content", levels=2,
                         codebook_size=4, niter=10)
    assert purity(np.asarray(collab.codes)) > 0.95
    assert purity(np.asarray(content.codes)) < 0.8


def test_assign_codes_new_items_from_content_against_a_collaborative_build(tmp_path) -> None:
    rng = np.random.default_rng(3)
    c = rng.standard_normal((200, 6)).astype(np.float32)
    e = rng.standard_normal((200, 4)).astype(np.float32)
    ids = np.arange(200, dtype=np.int64)
    x = sid_input_vectors(c, e, "content+engagement", 1.5)
    b1 = build_sids(x[:150], ids[:150], tmp_path, levels=2, codebook_size=5, niter=5)
    # the recipe travels in the version's manifest (as pipeline.build_semantic_ids records it)
    import json
    man = json.loads((b1.path / "manifest.json").read_text())
    man["inputs"] = {"source": "content+engagement", "engagement_weight": 1.5}
    (b1.path / "manifest.json").write_text(json.dumps(man))
    new = new_item_vectors(b1.path, c[150:], b1.quantizer.dim)
    want = sid_input_vectors(c[150:], np.zeros((50, 4), np.float32), "content+engagement", 1.5)
    np.testing.assert_array_equal(new, want)
    b2 = assign_sids(tmp_path, new, ids[150:], publish_if_grown=True)
    np.testing.assert_array_equal(b2.index.codes_of(ids[150:])[:, :2], b1.quantizer.encode(want))
    assert open_current(tmp_path).version == "v0002"
    with pytest.raises(DataError, match="content \\+ engagement"):
        new_item_vectors(b1.path, np.ones((2, 10), np.float32), b1.quantizer.dim)


def test_content_build_assign_is_unchanged(tmp_path) -> None:
    c = np.random.default_rng(4).standard_normal((100, 6)).astype(np.float32)
    b = build_sids(c, np.arange(100, dtype=np.int64), tmp_path, levels=2, codebook_size=4, niter=5)
    np.testing.assert_array_equal(new_item_vectors(b.path, c[:5], b.quantizer.dim), c[:5])
