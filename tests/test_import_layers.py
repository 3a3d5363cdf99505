"""The import layers hold: import-linter's contracts in pyproject.toml ([tool.importlinter]) -- genrec's layers,
lowest to highest, and inference and serving never importing training (nor serving evaluation) -- are kept
by this checkout's src/genrec. A broken contract fails with lint-imports' report, which names each import
(and chain of imports) at fault."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter")
    exe = Path(sys.executable).with_name("lint-imports")  # the venv's, beside this Python
    assert exe.exists(), f"{exe}: import-linter is installed without its lint-imports command"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([str(exe), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout, r.stdout[-8000:]
