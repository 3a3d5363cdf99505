"""Collaborative SIDs: what a build quantises (content, or content beside engagement), and how
``sid assign`` codes new items (content only; their engagement imputed from their content neighbours)
against such a codebook."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest

from genrec.errors import ConfigError, DataError, MissingDataError
from genrec.features.store import ItemVectors
from genrec.sid import assign_sids, build_sids, open_current
from genrec.sid.build import new_item_vectors, sid_input_vectors
from genrec.sid.source import impute_engagement

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


def _collab_build(tmp_path: Path, c: np.ndarray, e: np.ndarray, ids: np.ndarray, n_trained: int, w: float = 1.0,
                  **kw: Any):  # noqa: ANN202
    """A collaborative build of the first ``n_trained`` items, recording its item features folder as
    pipeline.build_semantic_ids does (the features hold every item: the others have zero engagement)."""
    feats = tmp_path / "features"
    e_all = e.copy()
    e_all[n_trained:] = 0
    ItemVectors(ids, c, e_all).save(feats)
    x = sid_input_vectors(c[:n_trained], e[:n_trained], "content+engagement", w)
    return build_sids(x, ids[:n_trained], tmp_path / "sid", inputs={"source": "content+engagement",
                                                                    "engagement_weight": w, "features": str(feats)},
                      **kw)


def _impute_slow(content: np.ndarray, known_c: np.ndarray, known_e: np.ndarray, k: int) -> np.ndarray:
    """impute_engagement item by item: cosine to every known item, the k best, weighted mean of unit engagement."""
    out = np.zeros((len(content), known_e.shape[1]))
    for i, x in enumerate(content.astype(np.float64)):
        sims = []
        for j, y in enumerate(known_c.astype(np.float64)):
            nx, ny = np.linalg.norm(x), np.linalg.norm(y)
            sims.append((x @ y / (nx * ny) if nx > 0 and ny > 0 else 0.0, j))
        best = sorted(sims, key=lambda t: -t[0])[:k]
        num, den = np.zeros(known_e.shape[1]), 0.0
        for sim, j in best:
            if sim > 0:
                ej = known_e[j].astype(np.float64)
                n = np.linalg.norm(ej)
                num += sim * (ej / n if n > 0 else ej)
                den += sim
        out[i] = num / den if den > 0 else 0.0
    return out


@pytest.mark.parametrize("k", [1, 3, 10, 500])
def test_impute_engagement_matches_a_brute_force_loop(k: int) -> None:
    rng = np.random.default_rng(10 + k)
    kc = rng.standard_normal((60, 7)).astype(np.float32)
    kc[5] = 0  # a trained item with no content
    ke = (rng.standard_normal((60, 4)) * rng.uniform(0.1, 5, (60, 1))).astype(np.float32)
    ke[[2, 9]] = 0  # trained items nobody engaged with
    c = rng.standard_normal((25, 7)).astype(np.float32)
    c[3] = 0  # a new item with no content: nothing to impute from
    c[4] = kc[9] * 3  # the direction of an item nobody engaged with
    got = impute_engagement(c, kc, ke, k)
    assert got.dtype == np.float32 and got.shape == (25, 4)
    np.testing.assert_allclose(got, _impute_slow(c, kc, ke, k), rtol=1e-4, atol=1e-5)
    assert not got[3].any()


def test_impute_engagement_bad_input_is_named() -> None:
    c = np.ones((3, 4), np.float32)
    with pytest.raises(ConfigError, match="k must be"):
        impute_engagement(c, c, c, 0)
    with pytest.raises(DataError, match="dimension 4, the trained items' 5"):
        impute_engagement(c, np.ones((3, 5), np.float32), c)
    with pytest.raises(DataError, match="3 content vectors for 2"):
        impute_engagement(c, c, np.ones((2, 4), np.float32))


def test_assign_codes_new_items_from_content_against_a_collaborative_build(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    c = rng.standard_normal((200, 6)).astype(np.float32)
    e = rng.standard_normal((200, 4)).astype(np.float32)
    ids = np.arange(200, dtype=np.int64)
    b1 = _collab_build(tmp_path, c, e, ids, 150, w=1.5, levels=2, codebook_size=5, niter=5)
    new = new_item_vectors(b1.path, c[150:], b1.quantizer.dim)
    # the engagement block: imputed from the 150 trained items only (the features' other rows are the new ones)
    want = sid_input_vectors(c[150:], impute_engagement(c[150:], c[:150], e[:150]), "content+engagement", 1.5)
    np.testing.assert_allclose(new, want, rtol=1e-5, atol=1e-6)
    assert (np.linalg.norm(new[:, 6:], axis=1) > 1.4).all()  # w * a unit vector, not the zero block
    b2 = assign_sids(tmp_path / "sid", new, ids[150:], publish_if_grown=True)
    np.testing.assert_array_equal(b2.index.codes_of(ids[150:])[:, :2], b1.quantizer.encode(new))
    assert open_current(tmp_path / "sid").version == "v0002"
    # the recipe (features folder included) travels to the assigned version: the next assign imputes alike
    np.testing.assert_allclose(new_item_vectors(b2.path, c[150:], b2.quantizer.dim), new, rtol=1e-6)
    with pytest.raises(DataError, match="content \\+ engagement"):
        new_item_vectors(b1.path, np.ones((2, 10), np.float32), b1.quantizer.dim)


def test_a_copy_of_a_trained_item_gets_its_semantic_codes(tmp_path: Path) -> None:
    """Items whose engagement follows their content (clusters of both): a new item whose content equals a
    trained item's is coded (nearly always) as that item at every semantic level -- as it is not with a zero
    engagement block, which no trained item has. (``capacity=None``: the training codes are the nearest
    centroids, as a new item's are; the default balanced codes move some items off them.)"""
    rng = np.random.default_rng(5)
    n, groups = 400, 16
    g = rng.integers(0, groups, n)
    c = (rng.standard_normal((groups, 12))[g] + 0.2 * rng.standard_normal((n, 12))).astype(np.float32)
    e = (rng.standard_normal((groups, 8))[g] + 0.2 * rng.standard_normal((n, 8))).astype(np.float32)
    ids = np.arange(n, dtype=np.int64)
    b = _collab_build(tmp_path, c, e, ids, n, levels=3, codebook_size=4, niter=10, capacity=None)
    sem = np.asarray(b.codes)[:, :-1]  # [n, 3] the trained items' semantic codes
    copies = b.quantizer.encode(new_item_vectors(b.path, c, b.quantizer.dim))  # each trained item's content, new
    zero = b.quantizer.encode(sid_input_vectors(c, np.zeros_like(e), "content+engagement"))
    same = [(copies[:, :d] == sem[:, :d]).all(axis=1).mean() for d in (1, 2, 3)]
    same_zero = [(zero[:, :d] == sem[:, :d]).all(axis=1).mean() for d in (1, 2, 3)]
    assert min(same) >= 0.97, (same, same_zero)
    assert same_zero[2] < 0.6, (same, same_zero)  # the zero block: most copies land elsewhere


def test_imputing_needs_the_features_the_version_was_built_from(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    c = rng.standard_normal((60, 5)).astype(np.float32)
    e = rng.standard_normal((60, 3)).astype(np.float32)
    ids = np.arange(60, dtype=np.int64)
    x = sid_input_vectors(c, e, "content+engagement")
    b = build_sids(x, ids, tmp_path / "bare", levels=2, codebook_size=3, niter=3,
                   inputs={"source": "content+engagement", "engagement_weight": 1.0})
    with pytest.raises(ConfigError, match="inputs.features"):
        new_item_vectors(b.path, c[:2], b.quantizer.dim)
    b2 = _collab_build(tmp_path / "run", c, e, ids, 60, levels=2, codebook_size=3, niter=3)
    shutil.rmtree(tmp_path / "run" / "features")
    with pytest.raises(MissingDataError, match="gone"):
        new_item_vectors(b2.path, c[:2], b2.quantizer.dim)
    # a run directory moved after the build: its own features folder is used
    shutil.move(str(tmp_path / "run" / "sid"), str(tmp_path / "sid"))
    (tmp_path / "features").mkdir()
    ItemVectors(ids, c, e).save(tmp_path / "features")
    got = new_item_vectors(tmp_path / "sid" / b2.version, c[:2], b2.quantizer.dim)
    np.testing.assert_allclose(got, sid_input_vectors(c[:2], impute_engagement(c[:2], c, e), "content+engagement"),
                               rtol=1e-5, atol=1e-6)


def test_content_build_assign_is_unchanged(tmp_path) -> None:
    c = np.random.default_rng(4).standard_normal((100, 6)).astype(np.float32)
    b = build_sids(c, np.arange(100, dtype=np.int64), tmp_path, levels=2, codebook_size=4, niter=5)
    np.testing.assert_array_equal(new_item_vectors(b.path, c[:5], b.quantizer.dim), c[:5])
