"""Shared test setup: one torch thread (CI has 2 cores), dataset root, GPU marker skip."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Callable

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


def load_benchmark(stem: str) -> ModuleType:
    """``benchmarks/<stem>.py`` (scripts, not a package) imported as a module."""
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).resolve().parents[1] / "benchmarks" / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """Import a script of ``benchmarks/`` by its file stem (each call runs it afresh)."""
    return load_benchmark
