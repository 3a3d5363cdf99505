"""A run without the datasets says, in its summary, which tests it could not run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_summary_lists_tests_skipped_for_missing_datasets(tmp_path: Path) -> None:
    env = dict(os.environ, GENREC_DATA_DIR=str(tmp_path / "nowhere"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/data/test_export_p5.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    assert "NOT CHECKED: datasets missing" in r.stdout
    assert f"because the datasets are not at {tmp_path / 'nowhere'}" in r.stdout
    assert "tests/data/test_export_p5.py (" in r.stdout
