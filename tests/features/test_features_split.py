"""Item features follow the run's split (audit): a temporal run on leave-one-out features would have its test
targets -- events after the cut -- inside every item's engagement vector. `genrec features build --split` picks
the split, its manifest records it, and `genrec train` refuses features of another split, naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.cli import app
from genrec.errors import ConfigError


def test_features_follow_the_split_and_train_refuses_a_mismatch(tmp_path: Path, data_root: Path) -> None:
    from genrec.data.splits import SplitSpec, compute_cutoffs, train_events
    from genrec.recipes.pipeline import open_store, prepare
    from genrec.recipes.training import train_run
    from genrec.train.run import RunConfig, check_features_split
    from genrec.workdir import WorkDir

    wd = tmp_path / "ml"
    prepare(wd, "movielens-100k", data_dir=data_root)
    runner = CliRunner()
    r = runner.invoke(app, ["features", "build", str(wd), "--content-dim", "8", "--engagement-dim", "8"])
    assert r.exit_code == 0, r.output
    man = json.loads((wd / "features" / "manifest.json").read_text())
    assert man["inputs"]["split"] == "loo"
    with pytest.raises(ConfigError, match=r"features build .* --split temporal"):
        train_run(wd, RunConfig.from_name("cpu-tiny", ["data.split=temporal", "train.total_steps=1"]))
    check_features_split(WorkDir(wd), "loo")  # the matching split passes

    r = runner.invoke(app, ["features", "build", str(wd), "--split", "temporal", "--content-dim", "8",
                            "--engagement-dim", "8"])
    assert r.exit_code == 0, r.output
    man = json.loads((wd / "features" / "manifest.json").read_text())
    assert man["inputs"]["split"] == "temporal"
    check_features_split(WorkDir(wd), "temporal")
    # the engagement vectors saw exactly the temporal split's training events: no test target among them
    events = open_store(wd).read_events()
    spec = SplitSpec("temporal").resolve(events.column("timestamp"))
    tr = train_events(events, spec)
    assert man["inputs"]["train_events"]["rows"] == tr.num_rows
    cut = compute_cutoffs(events, spec)
    assert (np.asarray(cut.test_seq) >= 0).any()
    ts = tr.column("timestamp").to_numpy()
    assert (ts < spec.cut_ts).all()  # nothing from after the cut (where the temporal test targets are)
    r = runner.invoke(app, ["features", "build", str(wd), "--split", "random"])
    assert r.exit_code != 0 and "split" in r.output
