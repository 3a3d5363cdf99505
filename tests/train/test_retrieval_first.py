"""``retrieval_first``: one `genrec train` trains the retrieval model (no action loss), then the joint model from
its last checkpoint -- the same weights as the two commands it replaces (a run with ``objective.w_action=0``,
then ``--init-from last``); it resumes whichever phase stopped, and runs as one phase where it does not apply."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from genrec.cli import app
from genrec.errors import ConfigError
from genrec.recipes.retrieval_first import DONE_FILE, RETRIEVAL_PHASE, retrieval_first_applies, train
from genrec.recipes.training import train_run
from genrec.recipes.warmstart import train_warm
from genrec.train.run import RunConfig
from genrec.workdir import read_json

# the string-id log logs two actions (like, view): feedback beyond engagement
TINY = ["train.total_steps=4", "train.ckpt_every=2", "train.eval_every=2", "data.valid_cases=8",
        "data.context_len=12", "train.early_stopping.metric=valid/ann/recall@10"]


def _cfg(*more: str) -> RunConfig:
    return RunConfig.from_name("cpu-tiny", [*TINY, *more])


@pytest.fixture
def run(string_id_run: Path, tmp_path: Path) -> Path:
    wd = tmp_path / "run"
    shutil.copytree(string_id_run, wd)
    shutil.rmtree(wd / "checkpoints")  # the prepared tables, features and SIDs; no run yet
    return wd


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def _same(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)


def test_when_it_applies() -> None:
    feedback, on = _cfg("retrieval_first=feedback"), _cfg("retrieval_first=on")
    assert retrieval_first_applies(feedback, 2) and retrieval_first_applies(on, 1)
    assert not retrieval_first_applies(feedback, 1)  # engagement only: no ranking to order
    assert not retrieval_first_applies(_cfg(), 3)  # off
    with pytest.raises(ConfigError, match="joint_metric"):
        _cfg("joint_metric=rank/hit@3")
    for why in (["variant=ranking-only"], ["objective.w_action=0"], ["variant=tiger"], ["init_from=/x"]):
        assert not retrieval_first_applies(_cfg("retrieval_first=feedback", *why), 3), why
        with pytest.raises(ConfigError, match="retrieval_first"):
            retrieval_first_applies(_cfg("retrieval_first=on", *why), 3)
    with pytest.raises(ConfigError, match="'retrieval_first': must be one of off, feedback, on"):
        _cfg("retrieval_first=yes")
    assert RunConfig.from_name("seq-small").retrieval_first == "feedback"


def test_one_command_is_the_two_commands(run: Path, tmp_path: Path) -> None:
    """Phase one is the run with w_action 0, phase two the warm start from its last checkpoint: weights equal bit
    for bit."""
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    r = CliRunner().invoke(app, ["train", str(run), "--preset", "cpu-tiny", "retrieval_first=feedback", *TINY])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):r.output.rindex("}") + 1])
    first = out["retrieval_first"]
    assert first["step"] == 4 and first["best_step"] in (2, 4), first

    retr = train_run(twin, _cfg("objective.w_action=0"))  # the two commands, by hand
    joint = train_warm(twin, _cfg(), "last")
    assert retr["best_step"] == first["best_step"]
    start = Path(out["init_from"])
    assert start.name == "step-000004" and start.parent.parent == Path(out["previous_run"])  # its last, not its best
    _same(start, Path(joint["init_from"]))  # the retrieval phase == a run with w_action 0
    saved = read_json(start.parent / "config.json")
    assert saved["phase"] == RETRIEVAL_PHASE and saved["run"]["objective"]["w_action"] == 0
    assert read_json(start.parent / DONE_FILE)["best_step"] == first["best_step"]
    now = read_json(run / "checkpoints" / "step-000004" / "config.json")
    assert "phase" not in now and now["run"]["init_from"] == str(start) and now["run"]["objective"]["w_action"] > 0
    _same(run / "checkpoints" / "step-000004", twin / "checkpoints" / "step-000004")

    # the same command again: the joint phase is resumed (at its last step: nothing to train), not phase one again
    r = CliRunner().invoke(app, ["train", str(run), "--preset", "cpu-tiny", "retrieval_first=feedback", *TINY])
    assert r.exit_code == 0, r.output
    assert "retrieval_first" not in r.output[r.output.index("{"):] and len(list((run / "previous-runs").iterdir())) == 1


def test_an_interrupted_retrieval_phase_resumes_then_the_joint_phase_runs(run: Path, tmp_path: Path) -> None:
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    # the retrieval phase stopped at step 2 of 4 (as an interrupt leaves it: a checkpoint, no summary file)
    train_run(run, _cfg("retrieval_first=on", "objective.w_action=0", "train.total_steps=2"), phase=RETRIEVAL_PHASE)
    out = train(run, _cfg("retrieval_first=on"))
    assert out["retrieval_first"]["step"] == 4 and out["step"] == 4
    whole = train(twin, _cfg("retrieval_first=on"))  # uninterrupted
    _same(Path(out["init_from"]), Path(whole["init_from"]))
    _same(run / "checkpoints" / "step-000004", twin / "checkpoints" / "step-000004")


def test_a_finished_retrieval_phase_is_not_trained_again(run: Path) -> None:
    """The joint phase failed before its first checkpoint (so the retrieval phase was put back): the next command
    goes straight to the joint phase."""
    first = train_run(run, _cfg("retrieval_first=on", "objective.w_action=0"), phase=RETRIEVAL_PHASE)
    (run / "checkpoints" / DONE_FILE).write_text(json.dumps({"step": first["step"], "best_step": first["best_step"]}))
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(Exception):  # noqa: B017 - any failure of the joint phase's start
        train(run, _cfg("retrieval_first=on", "model.d_model=48"))  # does not fit the retrieval phase's weights
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # put back, summary and all
    (run / "checkpoints" / "BEST").write_text("step-000002")  # a best before the last
    out = train(run, _cfg("retrieval_first=on"))
    assert out["retrieval_first"]["step"] == first["step"]
    start = Path(out["init_from"])
    assert start.name == "step-000004"  # the joint phase starts at the retrieval phase's last checkpoint
    assert read_json(start.parent / "config.json")["phase"] == RETRIEVAL_PHASE


def test_one_phase_where_it_does_not_apply_and_a_clear_refusal(run: Path) -> None:
    out = train(run, _cfg("retrieval_first=feedback", "variant=ranking-only"))
    assert "retrieval_first" not in out and not (run / "previous-runs").exists()
    train_run(run, _cfg("objective.w_action=0", "train.total_steps=2"), resume=False, phase=RETRIEVAL_PHASE)
    with pytest.raises(ConfigError, match="holds the retrieval phase of a two-phase run"):
        train(run, _cfg())


def test_the_joint_phase_picks_its_checkpoint_by_joint_metric(run: Path) -> None:
    """``joint_metric=valid/rank/auc``: the retrieval phase early-stops on the run's metric (no heads trained, no
    ``valid/rank/*``), the joint phase on the heads' validation AUC -- which is what ``genrec eval`` reports for
    the same weights and cases (the served scoring path)."""
    from genrec.eval.evaluate import EvalConfig, load_eval_data
    from genrec.eval.ranking import collect_slates, ranking_metrics
    from genrec.infer.recommender import Recommender

    out = train(run, _cfg("retrieval_first=on", "joint_metric=valid/rank/auc"))
    first = [json.loads(x) for x in (Path(out["previous_run"]) / "eval_log.jsonl").read_text().splitlines()]
    joint = [json.loads(x) for x in (run / "eval_log.jsonl").read_text().splitlines()]
    assert first and not any(k.startswith("valid/rank/") for e in first for k in e)
    assert all({"valid/rank/auc", "valid/rank/hit@3", "valid/rank/auc/like"} <= set(e) for e in joint)
    saved = read_json(run / "checkpoints" / "config.json")
    assert saved["run"]["joint_metric"] == "valid/rank/auc"
    best = max(joint, key=lambda e: (e["valid/rank/auc"], -e["step"]))  # the first of equals
    assert (run / "checkpoints" / "BEST").read_text().strip() == f"step-{best['step']:06d}"
    assert out["best_step"] == best["step"]
    # the summary's metrics are the last checkpoint's weights: the served path scores them the same
    rec = Recommender.from_checkpoint(run, "last")
    data = load_eval_data(rec, run, EvalConfig(split="valid", max_users=8))
    slates, _ = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len, negatives=8)
    ref = ranking_metrics(rec, slates, utility=rec.action_utility())
    assert out["valid"]["valid/rank/hit@3"] == pytest.approx(ref["hit@3"], abs=1e-6)
    for a, v in ref["auc"].items():
        assert out["valid"][f"valid/rank/auc/{a}"] == pytest.approx(v, abs=1e-6, nan_ok=True), a
