"""Shared test setup: one torch thread (CI has 2 cores), dataset root, GPU marker skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GENREC_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    root = Path(os.environ["GENREC_DATA_DIR"])
    if not root.is_dir():
        pytest.skip(f"datasets not found at {root}")
    return root
