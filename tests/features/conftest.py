"""The feature tests' shared setup: a dataset prepared in a fresh run directory, with its item features."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture
def featured(tmp_path: Path, datasets_root: Path) -> Callable[..., Path]:
    """``featured(dataset, folder)`` -> a run directory with ``dataset`` prepared and small item features built
    (content 16, engagement 8); skips when the dataset's folder is absent."""
    from genrec.recipes.pipeline import build_item_features, prepare

    def make(dataset: str, folder: str, name: str = "wd") -> Path:
        if not (datasets_root / folder).is_dir():
            pytest.skip(f"{folder} not available")
        wd = tmp_path / name
        prepare(wd, dataset, data_dir=datasets_root)
        build_item_features(wd, content_dim=16, engagement_dim=8)
        return wd

    return make
