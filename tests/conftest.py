"""Shared test setup: one torch thread (CI has 2 cores), dataset roots (the real datasets, and real-or-synthetic),
GPU marker skip, and the summary of what was not checked for want of the real datasets."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest

from tests.synthetic_datasets import WRITERS, is_synthetic, write_all

os.environ.setdefault("GENREC_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[_DATA_USERS] = [item.nodeid for item in items if "data_root" in getattr(item, "fixturenames", ())]
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


_DATA_USERS = pytest.StashKey[list[str]]()
_STAND_INS: list[str] = []  # dataset folders data_root filled with synthetic stand-ins this session


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
    if not skipped and not _STAND_INS:
        return
    tr = terminalreporter
    tr.section("NOT CHECKED: datasets missing", sep="!", red=True, bold=True)
    if skipped:
        files = sorted({r.nodeid.split("::")[0] for r in skipped})
        tr.write_line(f"{len(skipped)} tests did not run because the datasets are not at "
                      f"{os.environ['GENREC_DATA_DIR']} (set GENREC_DATA_DIR, or put ../shared/datasets beside the "
                      f"checkout). Files:")
        for f in files:
            tr.write_line(f"  {f} ({sum(r.nodeid.startswith(f + '::') for r in skipped)})")
    if _STAND_INS:
        ran = {r.nodeid for key in ("passed", "failed", "error") for r in tr.stats.get(key, [])}
        users = [n for n in tr.config.stash.get(_DATA_USERS, []) if n in ran]
        tr.write_line(f"{len(users)} tests ran on small synthetic stand-ins (tests/synthetic_datasets.py) of "
                      f"{', '.join(_STAND_INS)} instead: their checks of the real data's own figures did not run.")


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    """The real datasets (``GENREC_DATA_DIR``); skips the test when absent. For tests of the real data's own
    figures (counts, checksums, published results); others take :func:`data_root`."""
    root = Path(os.environ["GENREC_DATA_DIR"])
    if not root.is_dir():
        pytest.skip(f"datasets not found at {root}")
    return root


@pytest.fixture(scope="session")
def synthetic_datasets_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding a small synthetic stand-in of every shared dataset, in its real on-disk format
    (tests/synthetic_datasets.py), written once a session."""
    return write_all(tmp_path_factory.mktemp("synthetic-datasets"))


@pytest.fixture(scope="session")
def data_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root for tests that need *some* data of a dataset's shape: ``GENREC_DATA_DIR`` when it holds every
    dataset folder; otherwise a folder of links to the real folders present there and to synthetic stand-ins of
    the others (``tests.synthetic_datasets.is_synthetic(root / folder)`` tells which a test got)."""
    real = Path(os.environ["GENREC_DATA_DIR"])
    if all((real / f).is_dir() for f in WRITERS):
        return real
    synth: Path = request.getfixturevalue("synthetic_datasets_root")
    if not any((real / f).is_dir() for f in WRITERS):
        _STAND_INS.extend(WRITERS)
        return synth
    root = tmp_path_factory.mktemp("data-root")
    for f in WRITERS:
        (root / f).symlink_to(real / f if (real / f).is_dir() else synth / f, target_is_directory=True)
        if is_synthetic(root / f):
            _STAND_INS.append(f)
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
