"""A run without the datasets says, in its summary, which tests it could not run, and how many ran on the
synthetic stand-ins instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_summary_lists_tests_skipped_for_missing_datasets(tmp_path: Path) -> None:
    env = dict(os.environ, GENREC_DATA_DIR=str(tmp_path / "nowhere"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/data/test_ingest_datasets.py", "-k", "not synthetic"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    assert "NOT CHECKED: datasets missing" in r.stdout
    assert f"because the datasets are not at {tmp_path / 'nowhere'}" in r.stdout
    assert "tests/data/test_ingest_datasets.py (4)" in r.stdout  # the real files' counts and checksums
    # the ML-1M message, the slate size and the checksum ran on stand-ins (the registry test needs no data)
    assert "3 tests ran on small synthetic stand-ins (tests/synthetic_datasets.py) of movielens-100k," in r.stdout
    assert "4 skipped" in r.stdout and "4 passed" in r.stdout
