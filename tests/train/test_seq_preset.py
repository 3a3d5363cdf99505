"""The seq-small preset is the configuration the quality ladders measured, frozen in configs/, and README's."""

from __future__ import annotations

import json
from pathlib import Path

from genrec.train.config import from_dict
from genrec.train.run import RunConfig

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
