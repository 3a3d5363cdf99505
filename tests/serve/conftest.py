"""Session fixture: a tiny trained run directory (MovieLens-100K or, without the datasets, its synthetic stand-in;
cpu-tiny preset: ~40 s on 2 cores)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    from genrec.recipes.pipeline import build_item_features, build_semantic_ids, prepare
    from genrec.recipes.training import train_run
    from genrec.train.run import RunConfig

    wd = tmp_path_factory.mktemp("serve") / "run"
    prepare(wd, "movielens-100k", data_dir=data_root)
    build_item_features(wd)
    build_semantic_ids(wd)
    train_run(wd, RunConfig.from_name("cpu-tiny"))
    return wd


@pytest.fixture
def run_copy(run_dir: Path, tmp_path: Path) -> Path:
    """A private copy (for tests that add SID versions or checkpoints)."""
    dst = tmp_path / "run"
    shutil.copytree(run_dir, dst)
    return dst
