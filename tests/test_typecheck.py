"""The package type-checks (STYLE: a type checker in CI). mypy is pinned in the test extras so a
new mypy release cannot turn CI red on its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_reports_no_errors(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", str(ROOT / "src" / "genrec"), "--ignore-missing-imports",
                        "--cache-dir", str(tmp_path / "mypy-cache")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
