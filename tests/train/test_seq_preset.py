"""The seq-small preset is the configuration the quality ladders measured, frozen in configs/, and README's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from genrec.errors import ConfigError
from genrec.train.config import from_dict
from genrec.train.run import RunConfig
from tests.tiny_run import build_run

ROOT = Path(__file__).resolve().parents[2]


def _ladder_rung(path: str, name: str) -> RunConfig:
    """A ladder rung's configuration as benchmarks/quality_ladder.py trains it (its base rungs' overrides first)."""
    ladder = json.loads((ROOT / path).read_text())
    by = {r["name"]: r for r in ladder["rungs"]}
    chain, r = [], by[name]
    while r is not None:
        chain.append(r)
        r = by.get(r.get("base", ""))
    overrides = [o for rung in reversed(chain) for o in rung.get("overrides", [])]
    return RunConfig.from_name(ladder["preset"], ladder["common"] + overrides)


def test_seq_small_is_frozen_in_configs() -> None:
    """The frozen file loads to the preset (a field added since takes its default in both)."""
    frozen = json.loads((ROOT / "configs/seq-small.json").read_text())
    assert RunConfig.from_name("seq-small").to_dict() == from_dict(RunConfig, frozen).to_dict()


def test_seq_small_model_and_objective_are_the_ladders_joint_rung() -> None:
    """What the preset trains (variant, model, objective, optimiser) is what the Beauty ladder's chosen rung
    measured; only the evaluation cadence and the checkpoints may differ."""
    preset = RunConfig.from_name("seq-small").to_dict()
    rung = _ladder_rung("configs/ladder-beauty-width.json", "d64").to_dict()
    for key in ("variant", "model_preset", "model", "objective"):
        assert preset[key] == rung[key], key
    for key in ("lr", "weight_decay", "betas", "decay", "warmup_steps", "grad_clip", "ema_decay", "batch_size",
                "max_minutes", "bf16", "compile"):
        assert preset["train"][key] == rung["train"][key], key
    assert preset["train"]["early_stopping"]["metric"] == rung["train"]["early_stopping"]["metric"]
    assert preset["data"]["context_len"] == rung["data"]["context_len"]


def test_readme_shows_the_preset() -> None:
    assert "--preset seq-small" in (ROOT / "README.md").read_text()


def test_the_action_weight_follows_the_datas_actions(tmp_path: Path, data_root: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """One action logged (engagement only): the preset's action loss weighs w_action (.2); several (like / view /
    dislike): w_action_feedback (5). A variant that trains no action loss (w_action 0) keeps none; no
    w_action_feedback keeps w_action everywhere."""
    obj = RunConfig.from_name("seq-small").objective
    assert (obj.w_action, obj.w_action_feedback) == (0.2, 5.0)
    assert obj.for_actions(1) is obj and obj.for_actions(3).w_action == 5.0
    assert dataclasses.replace(obj, w_action=0.0).for_actions(3).w_action == 0.0
    assert dataclasses.replace(obj, w_action_feedback=None).for_actions(3).w_action == 0.2
    with pytest.raises(ConfigError, match="w_action_feedback"):
        dataclasses.replace(obj, w_action_feedback=-1.0).validate()
    # training on MovieLens (three actions) says which weight it took
    build_run(tmp_path / "run", data_root, steps=1, overrides=("objective.w_action=0.5",
                                                               "objective.w_action_feedback=3",
                                                               "data.neg_sampling_feedback=mixed"))
    err = capsys.readouterr().err
    assert "the action loss weighs 3 (objective.w_action_feedback), not 0.5" in err, err
    assert "ranking candidates drawn mixed (data.neg_sampling_feedback), not uniform" in err, err


def test_the_ranking_candidates_follow_the_datas_actions(tmp_path: Path, data_root: Path) -> None:
    """One action logged: the preset draws ranking rows' impression-only candidates from the engagement neighbours;
    several: half of them uniformly (``data.neg_sampling_feedback``); unset, neg_sampling everywhere; a value
    outside the samplings is refused naming the key."""
    data = RunConfig.from_name("seq-small").data
    assert (data.sampling_for(1), data.sampling_for(3)) == ("neighbours", "mixed")
    assert dataclasses.replace(data, neg_sampling_feedback=None).sampling_for(3) == "neighbours"
    with pytest.raises(ConfigError, match="data.neg_sampling_feedback"):
        build_run(tmp_path / "bad", data_root, steps=1, overrides=("data.neg_sampling_feedback=nearby",))
