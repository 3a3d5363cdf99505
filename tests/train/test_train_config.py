"""TrainConfig presets, typed key=value overrides (nested), dict/JSON round trip."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from genrec.errors import ConfigError
from genrec.train.config import PRESETS, EarlyStoppingConfig, TrainConfig, apply_overrides, from_dict, to_dict


@dataclass
class _ModelCfg:  # stands in for the model helper's config: overrides must work on any dataclass
    d_model: int = 32
    dropout: float = 0.1
    attn: Literal["sdpa", "flex"] = "sdpa"
    levels: list[int] = field(default_factory=lambda: [256, 256])
    name: str | None = None


@dataclass
class _RunCfg:
    model: _ModelCfg = field(default_factory=_ModelCfg)
    train: TrainConfig = field(default_factory=TrainConfig)


def test_presets_exist_and_differ() -> None:
    for name in PRESETS:
        cfg = TrainConfig.from_name(name)
        assert isinstance(cfg, TrainConfig)
    assert TrainConfig.from_name("cpu-small").bf16 is False
    assert TrainConfig.from_name("gpu-base").bf16 is True
    assert TrainConfig.from_name("gpu-base").early_stopping.metric == "recall@10"
    # presets do not share mutable nested state
    a, b = TrainConfig.from_name("gpu-base"), TrainConfig.from_name("gpu-base")
    a.early_stopping.patience = 99
    assert b.early_stopping.patience == 5
    with pytest.raises(ConfigError, match="unknown train preset 'nope'"):
        TrainConfig.from_name("nope")


def test_overrides_are_typed() -> None:
    cfg = TrainConfig.from_name("cpu-small", ["lr=3e-4", "total_steps=1_000", "bf16=true", "betas=0.8,0.9",
                                              "decay=linear", "early_stopping.metric=ndcg@10",
                                              "early_stopping.patience=3"])
    assert cfg.lr == 3e-4 and isinstance(cfg.lr, float)
    assert cfg.total_steps == 1000 and isinstance(cfg.total_steps, int)
    assert cfg.bf16 is True and cfg.betas == (0.8, 0.9) and cfg.decay == "linear"
    assert cfg.early_stopping == EarlyStoppingConfig(metric="ndcg@10", mode="max", patience=3)
    assert apply_overrides(cfg, ["betas=(0.7, 0.75)"]).betas == (0.7, 0.75)
    assert apply_overrides(cfg, ["lr=1"]).lr == 1.0  # an int is a fine float


@pytest.mark.parametrize("override, key", [
    ("total_steps=1.5", "total_steps"),
    ("lr=fast", "lr"),
    ("bf16=maybe", "bf16"),
    ("decay=exp", "decay"),
    ("betas=0.9", "betas"),
    ("nonsense=1", "nonsense"),
    ("early_stopping.nope=1", "early_stopping.nope"),
    ("lr.x=1", "lr.x"),
    ("early_stopping=3", "early_stopping"),
    ("lr=-1", "lr"),
    ("early_stopping.mode=up", "early_stopping.mode"),
])
def test_bad_overrides_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        apply_overrides(TrainConfig(), [override])
    assert repr(key) in str(e.value)


def test_decay_by_deadline_needs_a_time_budget() -> None:
    assert TrainConfig().decay_by == "steps"
    cfg = apply_overrides(_RunCfg(), ["train.decay_by=deadline", "train.max_minutes=30"])
    assert cfg.train.decay_by == "deadline" and cfg.train.max_minutes == 30.0
    assert TrainConfig.from_dict(cfg.train.to_dict()) == cfg.train
    with pytest.raises(ConfigError, match="'max_minutes': must be > 0 when decay_by='deadline'"):
        TrainConfig(decay_by="deadline")
    with pytest.raises(ConfigError, match="'max_minutes'"):
        apply_overrides(_RunCfg(), ["train.decay_by=deadline"])
    with pytest.raises(ConfigError, match="'decay_by': must be steps|deadline"):
        TrainConfig(decay_by="time")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'train.decay_by'"):
        apply_overrides(_RunCfg(), ["train.decay_by=time"])


def test_missing_equals_sign() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(TrainConfig(), ["lr"])


def test_nested_run_config_overrides() -> None:
    run = apply_overrides(_RunCfg(), ["model.d_model=64", "model.levels=[128, 64, 32]", "model.name=none",
                                      "model.attn=flex", "train.lr=0.01", "train.early_stopping.patience=2"])
    assert run.model.d_model == 64 and run.model.levels == [128, 64, 32] and run.model.name is None
    assert run.model.attn == "flex" and run.train.lr == 0.01 and run.train.early_stopping.patience == 2
    assert apply_overrides(run, ["model.name=big"]).model.name == "big"
    with pytest.raises(ConfigError, match="'model.d_model'"):
        apply_overrides(_RunCfg(), ["model.d_model=wide"])
    original = _RunCfg()
    apply_overrides(original, ["model.d_model=8"])
    assert original.model.d_model == 32  # the input is not mutated


def test_dict_and_json_roundtrip(tmp_path) -> None:
    cfg = TrainConfig.from_name("gpu-base", ["betas=0.5,0.6"])
    d = cfg.to_dict()
    assert d["betas"] == [0.5, 0.6] and d["early_stopping"]["patience"] == 5
    assert TrainConfig.from_dict(d) == cfg
    cfg.save(tmp_path / "config.json")
    assert TrainConfig.load(tmp_path / "config.json") == cfg
    assert from_dict(_RunCfg, to_dict(_RunCfg())) == _RunCfg()
    with pytest.raises(ConfigError, match="train_steps"):
        TrainConfig.from_dict({**d, "train_steps": 3})
    with pytest.raises(ConfigError, match="'total_steps'"):
        TrainConfig.from_dict({**d, "total_steps": "many"})
    with pytest.raises(ConfigError, match="'bf16'"):
        TrainConfig.from_dict({**d, "bf16": 1})  # JSON ints are not bools


@pytest.mark.parametrize("override", ["model.d_model=0", "model.n_heads=-2", "model.n_layers=0", "model.d_ff=-1",
                                      "model.item_dim=0", "model.dropout=-0.5", "model.dropout=1.0"])
def test_model_sizes_that_mean_the_preset_default_are_refused_when_typed(override: str) -> None:
    """0 and -1 stand for "the preset's value" inside ModelOverrides: typed by a user they had been
    dropped without a word (model.d_model=0 trained the preset's 64)."""
    from genrec.train.run import RunConfig

    with pytest.raises(ConfigError, match=repr(override.split("=")[0])):
        RunConfig.from_name("cpu-small", [override])
    RunConfig.from_name("cpu-small", ["model.d_model=48", "model.dropout=0.0"])  # real values pass
