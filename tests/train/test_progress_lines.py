"""Progress when stderr is not a terminal (issue 38 item 1): a training run whose output goes to a log file
prints plain progress lines there (train.progress=auto), and none with train.progress=off."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from genrec.recipes.training import train_run
from genrec.train.run import RunConfig
from genrec.train.progress import ProgressLines

STEP_LINE = re.compile(r"^\[genrec\.train\] step (\d+)/(\d+) \(\d+%\)  elapsed \S+  .*loss \d+\.\d+  items/s \d+",
                       re.M)


def _train(wd: Path, *over: str) -> None:
    train_run(wd, RunConfig.from_name("cpu-tiny", ["train.total_steps=8", "train.log_every=4", "train.eval_every=4",
                                                   "data.valid_cases=16", *over]), resume=False)


def test_a_run_logging_to_a_file_prints_progress_lines(fork: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    _train(fork("progress-auto"), "train.progress=auto", "train.progress_every_s=0")
    err = capsys.readouterr().err  # captured: not a terminal, as a log file or a pipe
    steps = [(int(a), int(b)) for a, b in STEP_LINE.findall(err)]
    assert steps == [(4, 8), (8, 8)], err
    assert "training from step 0 to 8" in err
    assert re.search(r"step 4/8 validation: valid/\S+ \d+\.\d+", err), err
    # the step-8 line carries the step-4 validation metric (the last one known when it was printed)
    assert re.search(r"step 8/8 .*items/s \d+  valid/\S+ \d+\.\d+ \(step 4\)", err), err
    assert "\r" not in err  # lines, not a redrawn bar


def test_progress_off_prints_no_progress_line(fork: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    _train(fork("progress-off"), "train.progress=off", "train.progress_every_s=0")
    err = capsys.readouterr().err
    assert not STEP_LINE.search(err) and "validation:" not in err and "training from step" not in err, err


def test_lines_come_every_log_step_or_every_n_seconds_whichever_is_rarer(capsys: pytest.CaptureFixture[str]) -> None:
    p = ProgressLines(total=100, start=0, every_s=3600.0, metric="")
    for step in (10, 20, 30):
        p.step(step, 1.0, 100.0, last=False)  # log steps inside the hour: no line
    assert capsys.readouterr().err == ""
    p.step(40, 1.0, 100.0, last=True)  # the last step always says where the run ended
    assert [int(a) for a, _ in STEP_LINE.findall(capsys.readouterr().err)] == [40]
    p.every_s = 0.0
    p.evaluated(40, {"valid/ann/recall@10": 0.25, "valid/ann/ndcg@10": 0.1}, improved=True)
    p.step(50, 1.0, 100.0, last=False)
    err = capsys.readouterr().err
    assert "validation: valid/ann/recall@10 0.2500  (best so far)" in err
    assert "step 50/100 (50%)" in err and "eta" in err and "valid/ann/recall@10 0.2500 (step 40)" in err


def test_progress_every_s_must_not_be_negative() -> None:
    from genrec.errors import ConfigError

    with pytest.raises(ConfigError, match="progress_every_s"):
        RunConfig.from_name("cpu-tiny", ["train.progress_every_s=-1"])
