"""`genrec train WORKDIR --init-from RUN`: a new run warm-started from a run directory's checkpoint (or any
`--checkpoint` name); WORKDIR's run is set aside whole, the starting checkpoint followed to where it went; a
warm start that fails before its first checkpoint puts the previous run back; an interrupted one resumes without
`--init-from`, keeping the checkpoint it started from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genrec.cli import app
from genrec.errors import ConfigError
from genrec.model.checkpoint_io import CheckpointError
from genrec.recipes.warmstart import resolve_init_from, train_warm
from genrec.train.run import RunConfig
from genrec.workdir import read_json

TINY = ["train.ckpt_every=2", "data.valid_cases=8", "data.context_len=12"]


@pytest.fixture
def run(string_id_run: Path, tmp_path: Path) -> Path:
    wd = tmp_path / "run"
    shutil.copytree(string_id_run, wd)
    return wd


def test_resolving_init_from(run: Path, tmp_path: Path) -> None:
    last = run / "checkpoints" / "step-000004"
    assert resolve_init_from(run, run) == last.resolve()  # a run directory: the checkpoint it serves
    assert resolve_init_from(tmp_path, run) == last.resolve()
    assert resolve_init_from(run, "2") == (run / "checkpoints" / "step-000002").resolve()  # a name of WORKDIR's
    assert resolve_init_from(run, str(last)) == last.resolve()
    with pytest.raises(ConfigError, match="--checkpoint 'nowhere'"):
        resolve_init_from(run, "nowhere")


def test_a_failed_warm_start_puts_the_previous_run_back(run: Path) -> None:
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    wider = RunConfig.from_name("cpu-tiny", ["train.total_steps=2", *TINY, "model.d_model=48"])
    with pytest.raises(CheckpointError):
        train_warm(run, wider, run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    assert not any((run / "previous-runs").glob("*"))


def test_warm_start_then_resume_without_init_from(run: Path) -> None:
    out = train_warm(run, RunConfig.from_name("cpu-tiny", ["train.total_steps=2", *TINY]), run)
    start = Path(out["init_from"])
    assert start.parent.parent == Path(out["previous_run"]) and start.name == "step-000004"
    assert (start / "model.safetensors").exists()  # the previous run, whole, under previous-runs/
    new = run / "checkpoints" / "step-000002"
    assert read_json(new / "config.json")["run"]["init_from"] == str(start)
    assert read_json(new / "extra.json")["init_from"] == str(start)
    # an interrupted warm start (here: one to go on to 4 steps) resumes without --init-from
    r = CliRunner().invoke(app, ["train", str(run), "--preset", "cpu-tiny", "train.total_steps=4", *TINY])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):r.output.rindex("}") + 1])["step"] == 4
    assert read_json(run / "checkpoints" / "step-000004" / "config.json")["run"]["init_from"] == str(start)
    r = CliRunner().invoke(app, ["train", str(run), "--preset", "cpu-tiny", f"init_from={start}", "--init-from",
                                 str(start)])
    assert r.exit_code == 2 and "give one" in r.output
