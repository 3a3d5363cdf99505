"""The feature tests' shared setup: a dataset prepared in a fresh run directory, with its item features."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture
def featured(tmp_path: Path, data_root: Path) -> Callable[..., Path]:
    """``featured(dataset)`` -> a run directory with ``dataset`` prepared and small item features built
    (content 16, engagement 8); the real dataset where present, else its synthetic stand-in (conftest's data_root)."""
    from genrec.recipes.pipeline import build_item_features, prepare

    def make(dataset: str, name: str = "wd") -> Path:
        wd = tmp_path / name
        prepare(wd, dataset, data_dir=data_root)
        build_item_features(wd, content_dim=16, engagement_dim=8)
        return wd

    return make
