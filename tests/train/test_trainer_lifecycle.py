"""Trainer lifecycle (audit, 2026-12-03): a fresh start moves the previous run aside instead of mixing its BEST
and LATEST with the new run's; SIGINT / SIGTERM stop after the step in progress with a checkpoint, and the run
resumes exactly; a resume refuses settings that would change the model or its data mid-run, and names every
other changed key."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from genrec.errors import ConfigError, GenrecError
from genrec.train.checkpoint import BEST, resolve_checkpoint
from genrec.train.distributed import DistInfo
from genrec.train.trainer import Trainer

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("genrec_test_standin_life", HERE / "test_standin_model.py")
standin = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(standin)


def _trainer(wd: Path, *, total: int = 12, kill_at: int | None = None, sig: int = signal.SIGINT,
             config_extra: dict | None = None, **kw) -> Trainer:  # noqa: ANN003
    torch.manual_seed(0)
    model = standin.TinyNextItem(dropout=0.1)
    cfg = standin.tiny_config(total_steps=total, ckpt_every=4, log_every=1, **kw)
    base = standin.make_factory(standin.make_sequences())

    def factory(spec):  # noqa: ANN001, ANN202 - the real batches; a real signal to this process at one step
        for step, batch in enumerate(base(spec), start=spec.start_step):
            if kill_at is not None and step == kill_at:
                os.kill(os.getpid(), sig)
            yield batch

    return Trainer(model, factory, cfg, wd, dist_info=DistInfo(), config_extra=config_extra)


def test_fresh_start_moves_the_previous_run_aside(tmp_path: Path) -> None:
    wd = tmp_path / "run"
    old = _trainer(wd, total=8).fit()
    (wd / "checkpoints" / BEST).write_text("step-000008\n")  # as early stopping would have marked it
    (wd / "reports").mkdir()
    (wd / "reports" / "eval-test-step8.json").write_text("{}")
    assert old.step == 8
    new = _trainer(wd, total=3).fit(resume=False)
    assert new.archived is not None and new.archived.parent == wd / "previous-runs"
    moved = new.archived
    assert (moved / "checkpoints" / BEST).exists() and (moved / "checkpoints" / "step-000008").is_dir()
    assert (moved / "reports" / "eval-test-step8.json").exists() and (moved / "train_log.jsonl").exists()
    ck = wd / "checkpoints"
    assert not (ck / BEST).exists() and sorted(p.name for p in ck.glob("step-*")) == ["step-000003"]
    assert resolve_checkpoint(ck).name == "step-000003" and not (wd / "reports").exists()
    steps = [json.loads(x)["step"] for x in (wd / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    # a plain resume now continues the new run, never the old one
    again = _trainer(wd, total=5).fit()
    assert [r["step"] for r in again.history] == [4, 5]
    # a finished run asked again: says so, and names the checkpoint it stands at
    done = _trainer(wd, total=5).fit()
    assert done.history == [] and done.last_checkpoint is not None and done.last_checkpoint.name == "step-000005"
    # nothing to archive: a fresh start in an empty run dir moves nothing
    assert _trainer(tmp_path / "empty", total=1).fit(resume=False).archived is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_the_step_in_progress_and_the_run_resumes_exactly(tmp_path: Path, sig: int) -> None:
    full = _trainer(tmp_path / "full").fit()
    cut = _trainer(tmp_path / "cut", kill_at=6, sig=sig)
    before = signal.getsignal(sig)  # SIG_IGN for SIGINT when the suite runs as a background job
    res = cut.fit()
    assert res.interrupted == signal.Signals(sig).name and res.step == 7  # the step being fetched ran, then stop
    assert resolve_checkpoint(tmp_path / "cut" / "checkpoints").name == "step-000007"  # not ckpt_every's step 4
    assert signal.getsignal(sig) == before  # the handler restored
    rest = _trainer(tmp_path / "cut").fit()
    assert [r["step"] for r in rest.history] == list(range(8, 13))
    for got, ref in zip(rest.history, full.history[7:]):
        assert got["loss"] == pytest.approx(ref["loss"], abs=1e-6)


def test_resume_refuses_model_and_data_changes_and_names_the_rest(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    wd = tmp_path / "run"
    run = {"variant": "pinger", "data": {"split": "loo", "neg_cands": 8}, "objective": {"w_sid": 1.0}}
    model = {"d_model": 64, "dropout": 0.0}
    _trainer(wd, total=4, config_extra={"run": run, "model": model}).fit()
    for bad_run, bad_model, key in ((run, {**model, "d_model": 32}, "model.d_model"),
                                    ({**run, "data": {**run["data"], "split": "temporal"}}, model, "run.data.split"),
                                    ({**run, "variant": "tiger"}, model, "run.variant")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
            _trainer(wd, total=6, config_extra={"run": bad_run, "model": bad_model}).fit()
        assert "--no-resume" in str(e.value)
    capsys.readouterr()
    ok_run = {**run, "data": {**run["data"], "neg_cands": 2}, "objective": {"w_sid": 4.0}}
    res = _trainer(wd, total=6, config_extra={"run": ok_run, "model": {**model, "dropout": 0.3}}).fit()
    assert res.step == 6
    err = capsys.readouterr().err
    for key in ("model.dropout", "run.data.neg_cands", "run.objective.w_sid", "train.total_steps"):
        assert key in err, err


def _damage(path: Path, how: str) -> None:
    """What a disk error or a torn copy leaves: a file cut short, or overwritten with other bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncate" else b"\x00garbage" * 8)


@pytest.mark.parametrize("name,how", [("model.safetensors", "truncate"), ("state.safetensors", "garbage"),
                                      ("state.json", "truncate"), ("extra.json", "garbage"),
                                      ("config.json", "truncate"), ("train_model.safetensors", "truncate")])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, capsys, name: str,
                                                                    how: str) -> None:  # noqa: ANN001
    """LATEST's checkpoint damaged after it was written (any of its files): the resume names the file, resumes from
    the older checkpoint, trains the lost steps again exactly as the uninterrupted run did, keeps the damaged folder
    (renamed, every byte kept) and points LATEST at what it saves next."""
    ema = {"ema_decay": 0.9} if name == "train_model.safetensors" else {}  # the live weights exist with an average
    full = _trainer(tmp_path / "full", **ema).fit()
    wd = tmp_path / "run"
    assert _trainer(wd, kill_at=9, **ema).fit().step == 10  # checkpoints at 4, 8 and the signal's 10
    ck = wd / "checkpoints"
    assert resolve_checkpoint(ck).name == "step-000010"
    (ck / BEST).write_text("step-000010\n")  # as if the last evaluation had marked it
    _damage(ck / "step-000010" / name, how)
    damaged_bytes = (ck / "step-000010" / name).read_bytes()
    capsys.readouterr()
    resumed = _trainer(wd, **ema).fit()
    err = capsys.readouterr().err
    assert f"cannot resume from {ck / 'step-000010'}" in err and name in err
    assert "resumed from the older step-000008" in err
    assert [r["step"] for r in resumed.history] == list(range(9, 13))
    for got, ref in zip(resumed.history, full.history[8:]):
        assert got["loss"] == pytest.approx(ref["loss"], abs=1e-6), got["step"]
    kept = ck / "step-000010.damaged"
    assert (kept / name).read_bytes() == damaged_bytes and not (ck / "step-000010").exists()
    assert resolve_checkpoint(ck).name == "step-000012" and not (ck / BEST).exists()
    logged = [json.loads(x)["step"] for x in (wd / "train_log.jsonl").read_text().splitlines()]
    assert logged == list(range(1, 13))  # the lines past step 8 were dropped, then written once


def test_every_checkpoint_damaged_is_a_clear_error_naming_each(tmp_path: Path) -> None:
    wd = tmp_path / "run"
    _trainer(wd, total=8).fit()  # checkpoints 4 and 8
    ck = wd / "checkpoints"
    for step in ("step-000004", "step-000008"):
        _damage(ck / step / "model.safetensors", "truncate")
    with pytest.raises(GenrecError, match="step-000008: .*step-000004: .*--no-resume") as e:
        _trainer(wd, total=12).fit()
    assert "model.safetensors" in str(e.value)
    assert (ck / "step-000004").is_dir() and (ck / "step-000008").is_dir()  # nothing renamed or deleted


def test_a_latest_naming_a_missing_folder_falls_back_to_the_newest_complete_one(tmp_path: Path) -> None:
    wd = tmp_path / "run"
    _trainer(wd, total=8).fit()
    ck = wd / "checkpoints"
    (ck / "LATEST").write_text("step-000010\n")  # a folder that was never written, or was removed by hand
    assert [r["step"] for r in _trainer(wd, total=10).fit().history] == [9, 10]


def test_a_config_change_is_still_refused_not_fallen_back_from(tmp_path: Path) -> None:
    wd = tmp_path / "run"
    _trainer(wd, total=8, config_extra={"model": {"d_model": 8}}).fit()
    with pytest.raises(ConfigError, match="model.d_model"):
        _trainer(wd, total=12, config_extra={"model": {"d_model": 16}}).fit()
    assert sorted(p.name for p in (wd / "checkpoints").iterdir() if p.name.startswith("step-")) == \
        ["step-000004", "step-000008"]
