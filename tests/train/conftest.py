"""Fixtures shared by the training tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """MovieLens 100K prepared once for the session: tables in 2 buckets, 16-d content and 8-d engagement
    vectors, 2-level SIDs. Tests that write a run fork it (symlinked tables/features/sid)."""
    from genrec.recipes import pipeline

    wd = tmp_path_factory.mktemp("ml100k-prepared")
    pipeline.prepare(wd, "movielens-100k", data_dir=data_root, n_buckets=2)
    pipeline.build_item_features(wd, content_dim=16, engagement_dim=8)
    pipeline.build_semantic_ids(wd, levels=2)
    return wd


@pytest.fixture
def fork(prepared: Path) -> Callable[[str], Path]:
    """``fork(name)``: a run directory beside the prepared one, sharing its tables, features and SIDs (links)."""
    def make(name: str) -> Path:
        d = prepared.parent / f"{prepared.name}-{name}"
        d.mkdir(exist_ok=True)
        for part in ("tables", "features", "sid"):
            if not (d / part).exists():
                (d / part).symlink_to(prepared / part)
        return d

    return make
