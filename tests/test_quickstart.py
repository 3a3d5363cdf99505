"""The main job end to end (`genrec quickstart`), shortened to a few training steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from genrec.infer.recommender import Recommender
from genrec.recipes.quickstart import run_quickstart


def test_quickstart_runs_every_stage_and_stores_the_fusion_choice(tmp_path: Path, data_root: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage runs; the summary's rows are all measured on one set of reporting users, disjoint from the
    tuning users the fusion weights were chosen on (issue 38: L0+L1 was scored on its own 500 tuning users,
    beside rows on 300 sampled users and popularity on all 943)."""
    import genrec.eval.fusion_tune as ev
    import genrec.recipes.quickstart as qs
    import genrec.recipes.training as tr

    given: dict[str, list[list[int]]] = {}  # per function, the users of each call's cases

    def spy(mod: Any, name: str) -> None:
        real = getattr(mod, name)

        def wrapped(*a: Any, **kw: Any) -> Any:
            es = kw["eval_set"] if name == "tune_fusion" else a[1]
            given.setdefault(name, []).append([int(ex.user_id) for ex in es.examples])
            return real(*a, **kw)

        monkeypatch.setattr(mod, name, wrapped)

    # where each caller looks the function up: the recipes import them at the top of their modules
    spy(qs, "tune_fusion")
    spy(ev, "l0l1_pass")  # tune_fusion's pass
    spy(qs, "l0l1_pass")  # then the L0+L1 row's
    spy(tr, "evaluate_retrieval")  # the trainer's validation
    spy(qs, "evaluate_retrieval")  # then the ann and sid rows'
    con = Console(file=open(tmp_path / "out.txt", "w"), width=160)
    out = run_quickstart(tmp_path / "run", data_dir=data_root, steps=8, fusion_users=120, report_users=100,
                         console=con)
    con.file.close()
    text = (tmp_path / "out.txt").read_text()
    for stage in ("data prepare movielens-100k", "features:", "sid build", "train 8 steps", "fusion tune:",
                  "genrec L0+L1", "popularity", "recommend for user", "quickstart done"):
        assert stage in text, stage
    assert out["fusion"]["chosen_on"] == {**out["fusion"]["chosen_on"], "split": "valid", "cases": 120}
    rec = Recommender.from_checkpoint(tmp_path / "run")
    assert rec.fusion_path is not None and str(rec.fusion_path) == out["fusion"]["path"]
    assert len(out["recommendations"]["items"]) == 10

    users = out["users"]
    tuning, reporting = users["tuning"], users["reporting"]
    assert len(set(tuning)) == 120 and len(set(reporting)) == 100 and not set(tuning) & set(reporting)
    assert users["validation"] == 943  # MovieLens-100K (and its stand-in): every user has a validation case
    assert given["tune_fusion"] == [tuning]  # the fusion weights were chosen on exactly these users
    assert given["l0l1_pass"] == [tuning, reporting]
    assert given["evaluate_retrieval"][-1] == reporting
    assert set(out["report"]) == {"genrec ann", "genrec sid", "genrec L0+L1", "popularity"}
    assert {m["n"] for m in out["report"].values()} == {100.0}  # every row on the same 100 users
    assert out["popularity"] == out["report"]["popularity"]
    assert "943, split once (seed 0): 120 tuning users" in text and "100 other users report every row" in text
