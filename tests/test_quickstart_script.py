"""The README's main command checks its data before it installs anything, and says what to do in CLI words."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_missing_data_fails_in_seconds_before_installing(tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(ROOT / "scripts/quickstart.sh"), "--data-dir", str(tmp_path / "nowhere")],
                       capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 30
    assert r.returncode == 2
    assert f"not at {tmp_path / 'nowhere' / 'movielens-100k'}" in r.stderr
    for words in ("--data-dir", "--download", "GENREC_DATA_DIR"):
        assert words in r.stderr
    assert "download=True" not in r.stderr and "[setup]" not in r.stderr  # nothing was installed
