"""The weight average (``train.ema_decay``): the update against a per-element loop, training
untouched by it, evaluation and checkpoints on the average, exact resume."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from genrec.errors import ConfigError
from genrec.train.checkpoint import TRAIN_WEIGHTS, load_checkpoint, resolve_checkpoint
from genrec.train.config import TrainConfig
from genrec.train.distributed import DistInfo
from genrec.train.ema import WeightAverage, ema_decay_at
from genrec.train.trainer import Trainer

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("genrec_test_standin", HERE / "test_standin_model.py")
standin = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(standin)


def test_update_equals_a_per_element_loop() -> None:
    """Fresh random weight trajectories; the reference walks every element with plain floats."""
    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    model[2].weight = nn.Parameter(torch.randn(2, 4, generator=g))
    avg = WeightAverage(model, 0.9)
    ref = [[float(x) for x in p.detach().flatten()] for p in model.parameters()]
    for n in range(25):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g))
        avg.update()
        d = 0.9 if n >= 80 else (1 + n) / (10 + n)  # the warm-up cap is below 0.9 until n = 80
        assert ema_decay_at(0.9, n) == d
        for r, p in zip(ref, model.parameters()):
            for i, x in enumerate(p.detach().flatten().tolist()):
                r[i] = d * r[i] + (1 - d) * x
    for r, s in zip(ref, avg.shadow):
        torch.testing.assert_close(s.flatten(), torch.tensor(r), atol=1e-5, rtol=1e-5)
    assert avg.updates == 25


def test_swapped_restores_the_live_weights_even_after_an_error() -> None:
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    avg = WeightAverage(model, 0.5)
    with torch.no_grad():
        model.weight.add_(1.0)
    live = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="boom"):
        with avg.swapped():
            assert torch.equal(model.weight, avg.shadow[0])
            assert not torch.equal(model.weight, live["weight"])
            raise RuntimeError("boom")
    for k, v in model.state_dict().items():
        assert torch.equal(v, live[k]), k


def test_tied_parameters_are_averaged_once() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

    assert WeightAverage(Tied(), 0.9).names == ["a.weight"]


def test_decay_out_of_range_is_a_config_error() -> None:
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ConfigError, match="ema_decay"):
            TrainConfig(ema_decay=bad)


def _trainer(workdir: Path, ema: float, *, total: int = 12, seed_init: int = 0, eval_fn=None,
             crash_at: int | None = None) -> tuple[nn.Module, Trainer]:
    torch.manual_seed(seed_init)
    model = standin.TinyNextItem(dropout=0.1)
    cfg = standin.tiny_config(total_steps=total, ckpt_every=4, log_every=1, eval_every=4 if eval_fn else 0,
                              ema_decay=ema)
    return model, Trainer(model, standin.make_factory(standin.make_sequences(), crash_at=crash_at), cfg, workdir,
                          eval_fn=eval_fn, dist_info=DistInfo())


def test_training_with_the_average_takes_the_same_steps(tmp_path: Path) -> None:
    """The average is evaluated and saved, never trained: losses and live weights equal a run without it."""
    seen: list[dict[str, torch.Tensor]] = []

    def eval_fn(m: nn.Module) -> dict[str, float]:
        seen.append({k: v.clone() for k, v in m.state_dict().items()})
        return {"recall@10": float(len(seen))}

    plain_model, plain = _trainer(tmp_path / "plain", 0.0, eval_fn=lambda m: {"recall@10": 0.0})
    ema_model, ema = _trainer(tmp_path / "ema", 0.9, eval_fn=eval_fn)
    a, b = plain.fit(), ema.fit()
    assert [r["loss"] for r in a.history] == [r["loss"] for r in b.history]
    for (k, x), (_, y) in zip(plain_model.state_dict().items(), ema_model.state_dict().items()):
        assert torch.equal(x, y), k
    # what the evaluation saw was the average, not the live weights
    assert ema.ema is not None and len(seen) == 3
    last = seen[-1]
    for name, s in zip(ema.ema.names, ema.ema.shadow):
        assert torch.equal(last[name], s), name
        assert not torch.equal(last[name], ema_model.state_dict()[name]), name
    # the checkpoint serves the average and keeps the live weights for resume
    ckpts = tmp_path / "ema" / "checkpoints"
    torch.manual_seed(7)
    probe = standin.TinyNextItem()
    load_checkpoint(ckpts, probe, restore_rng=False)
    for name, s in zip(ema.ema.names, ema.ema.shadow):
        assert torch.equal(probe.state_dict()[name], s), name
    assert (resolve_checkpoint(ckpts) / TRAIN_WEIGHTS).exists()
    assert not (resolve_checkpoint(tmp_path / "plain" / "checkpoints") / TRAIN_WEIGHTS).exists()
    logged = [json.loads(x)["recall@10"] for x in (tmp_path / "ema" / "eval_log.jsonl").read_text().splitlines()]
    assert logged == [1.0, 2.0, 3.0]


def test_resume_restores_the_live_weights_and_the_average(tmp_path: Path) -> None:
    model_a, full = _trainer(tmp_path / "a", 0.8)
    ref = full.fit()
    _, crashed = _trainer(tmp_path / "b", 0.8, crash_at=6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.fit()
    model_c, resumed = _trainer(tmp_path / "b", 0.8, seed_init=123)
    hist = resumed.fit().history
    assert [r["loss"] for r in hist] == pytest.approx([r["loss"] for r in ref.history[4:]], abs=1e-6)
    for (k, x), (_, y) in zip(model_a.state_dict().items(), model_c.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0, msg=lambda s, k=k: f"{k}: {s}")
    assert full.ema is not None and resumed.ema is not None and resumed.ema.updates == full.ema.updates == 12
    for x, y in zip(full.ema.shadow, resumed.ema.shadow):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)


def test_turning_the_average_off_on_resume_trains_on_from_the_live_weights(tmp_path: Path) -> None:
    """Guards the resume above: the served (averaged) weights must not leak into training."""
    model_a, full = _trainer(tmp_path / "a", 0.8)
    full.fit()
    _, crashed = _trainer(tmp_path / "b", 0.8, crash_at=6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.fit()
    model_c, off = _trainer(tmp_path / "b", 0.0, seed_init=123)
    off.fit()
    for (k, x), (_, y) in zip(model_a.state_dict().items(), model_c.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0, msg=lambda s, k=k: f"{k}: {s}")


def test_a_missing_live_weights_file_is_a_clear_error(tmp_path: Path) -> None:
    """A checkpoint saved with the average must not resume from its averaged weights if the live ones are gone."""
    from genrec.train.checkpoint import CheckpointError

    _, tr = _trainer(tmp_path, 0.8, total=4)
    tr.fit()
    (resolve_checkpoint(tmp_path / "checkpoints") / TRAIN_WEIGHTS).unlink()
    _, again = _trainer(tmp_path, 0.8, total=8)
    with pytest.raises(CheckpointError, match="train_model.safetensors is missing"):
        again.fit()
