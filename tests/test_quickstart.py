"""The main job end to end (`genrec quickstart`), shortened to a few training steps."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from genrec.quickstart import run_quickstart
from genrec.retrieve.recommender import Recommender


def test_quickstart_runs_every_stage_and_stores_the_fusion_choice(tmp_path: Path, datasets_root: Path) -> None:
    if not (datasets_root / "movielens-100k").is_dir():
        import pytest

        pytest.skip("movielens-100k not available")
    con = Console(file=open(tmp_path / "out.txt", "w"), width=140)
    out = run_quickstart(tmp_path / "run", data_dir=datasets_root, steps=8, fusion_users=120, console=con)
    con.file.close()
    text = (tmp_path / "out.txt").read_text()
    for stage in ("data prepare movielens-100k", "features:", "sid build", "train 8 steps", "fusion tune:",
                  "genrec L0+L1", "popularity", "recommend for user", "quickstart done"):
        assert stage in text, stage
    assert out["fusion"]["chosen_on"] == {**out["fusion"]["chosen_on"], "split": "valid", "cases": 120}
    rec = Recommender.from_checkpoint(tmp_path / "run")
    assert rec.fusion_path is not None and str(rec.fusion_path) == out["fusion"]["path"]
    assert len(out["recommendations"]["items"]) == 10
