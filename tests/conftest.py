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


def _missing_data(report: pytest.TestReport) -> bool:
    """A test skipped because the datasets folder (or one dataset in it) is absent."""
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return "datasets not found" in reason or " not found at " in reason


def _missing_browser(report: pytest.TestReport) -> bool:
    """A test skipped because no headless browser (chromium + chromedriver, selenium) is installed."""
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return "NOT CHECKED" in reason and "browser" in reason


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly what was not checked for want of data (a clone without ../shared/datasets still passes) or of
    a headless browser (the explorer page's test)."""
    no_browser = [r for r in terminalreporter.stats.get("skipped", []) if _missing_browser(r)]
    if no_browser:
        terminalreporter.section("NOT CHECKED: no headless browser", sep="!", red=True, bold=True)
        for r in no_browser:
            reason = r.longrepr[2] if isinstance(r.longrepr, tuple) else r.longrepr
            terminalreporter.write_line(f"  {r.nodeid}: {reason}")
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if _missing_data(r)]
    if not skipped:
        return
    files = sorted({r.nodeid.split("::")[0] for r in skipped})
    tr = terminalreporter
    tr.section("NOT CHECKED: datasets missing", sep="!", red=True, bold=True)
    tr.write_line(f"{len(skipped)} tests did not run because the datasets are not at {os.environ['GENREC_DATA_DIR']} "
                  f"(set GENREC_DATA_DIR, or put ../shared/datasets beside the checkout). Files:")
    for f in files:
        tr.write_line(f"  {f} ({sum(r.nodeid.startswith(f + '::') for r in skipped)})")


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


@pytest.fixture(scope="session")
def string_id_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained run of a log with string ids (``u7``, ``m52``: remapped by ``data prepare generic``), built
    from a generated CSV (no dataset needed; ~10 s): checkpoints step-000002 and step-000004 (LATEST), no BEST.
    The CSV is beside it (``<run>.csv``). Tests must not change it (copy it first)."""
    from tests.tiny_run import build_string_id_run

    return build_string_id_run(tmp_path_factory.mktemp("strids") / "run")
