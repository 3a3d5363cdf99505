"""Fixtures shared by the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, datasets_root: Path) -> Path:
    """MovieLens 100K prepared once for the session: tables in 2 buckets, 16-d content and 8-d engagement
    vectors, 2-level SIDs. Tests that write a run fork it (symlinked tables/features/sid)."""
    from genrec import pipeline

    wd = tmp_path_factory.mktemp("ml100k-prepared")
    pipeline.prepare(wd, "movielens-100k", data_dir=datasets_root, n_buckets=2)
    pipeline.build_item_features(wd, content_dim=16, engagement_dim=8)
    pipeline.build_semantic_ids(wd, levels=2)
    return wd
