"""A retrieval warm-up inside one run (``objective.action_from_step``): before that step the action loss adds
nothing to the loss and the action heads get no gradient, from it on the loss is the full sum; the trainer tells
the objective each step (``at_step``), and early stopping chooses no best checkpoint before ``from_step``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from genrec.errors import ConfigError
import tests.train.test_standin_model as standin
from genrec.train.distributed import DistInfo
from genrec.train.objective import ObjectiveConfig
from genrec.train.trainer import Trainer
from tests.train.test_objective_sync_free import _batch, _setup


def _with_candidates(seed: int):  # noqa: ANN202
    b = _batch(seed)
    g = torch.Generator().manual_seed(seed)
    n, k = b.rows.shape[0], 5
    b.cand_rows = torch.randint(0, 60, (n, k), generator=g)
    b.cand_labels = (torch.rand(n, k, 3, generator=g) < 0.4).float()
    b.cand_valid = torch.rand(n, k, generator=g) < 0.7
    b.cand_surface = torch.randint(0, 2, (n,), generator=g)
    return b


@pytest.mark.parametrize("seed", [0, 1])
def test_the_action_loss_counts_from_its_step(seed: int) -> None:
    obj = _setup(seed)
    obj.cfg = ObjectiveConfig(w_sid=1.0, w_item=0.0, w_action=2.0, p_mask=0.5, action_from_step=3)
    b = _with_candidates(seed)
    heads = list(obj.model.action_head.parameters())
    for step, on in ((0, False), (2, False), (3, True), (7, True)):
        obj.zero_grad(set_to_none=True)
        obj.at_step(step)
        torch.manual_seed(11)
        out = obj.training_step(b)
        want = out["sid"] + (2.0 * out["action"] if on else 0.0)
        torch.testing.assert_close(out["loss"], want, atol=1e-6, rtol=1e-6)
        assert float(out["action"].detach()) > 0  # the term is computed (and logged) either way
        out["loss"].backward()
        got = sum(float(p.grad.abs().sum()) for p in heads if p.grad is not None)
        assert (got > 0) == on, (step, got)


def test_the_feedback_step_follows_the_datas_actions() -> None:
    obj = ObjectiveConfig(w_action=0.2, action_from_step_feedback=400)
    assert obj.for_actions(1) is obj and obj.for_actions(3).action_from_step == 400
    assert obj.for_actions(3).w_action == 0.2  # no w_action_feedback: the weight stays
    assert dataclasses.replace(obj, w_action=0.0).for_actions(3).action_from_step == 0
    for key, bad in (("action_from_step", -1), ("action_from_step", 1.5), ("action_from_step_feedback", True)):
        with pytest.raises(ConfigError, match=f"objective.{key}"):
            dataclasses.replace(obj, **{key: bad}).validate()


class _Recorder(standin.TinyNextItem):
    """The stand-in model, recording the step the trainer announces before each optimiser step."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def at_step(self, step: int) -> None:
        self.seen.append(step)


def test_the_trainer_announces_each_step_and_chooses_the_best_from_from_step(tmp_path: Path) -> None:
    scores = iter([0.9, 0.8, 0.3, 0.2, 0.4, 0.1, 0.1, 0.1])  # the best before from_step (0.9 at 2) must not count
    torch.manual_seed(0)
    model = _Recorder()

    def eval_fn(m: nn.Module) -> dict[str, float]:
        return {"recall@10": next(scores)}

    cfg = standin.tiny_config(total_steps=16, eval_every=2, ckpt_every=0, **{
        "early_stopping.metric": "recall@10", "early_stopping.patience": 2, "early_stopping.from_step": 6})
    res = Trainer(model, standin.make_factory(standin.make_sequences()), cfg, tmp_path, eval_fn=eval_fn,
                  dist_info=DistInfo()).fit()
    assert model.seen == list(range(res.step))
    assert res.best_step == 10 and res.best_metric == pytest.approx(0.4)  # 6: .3, 8: .2, 10: .4, then two worse
    assert res.stopped_early and res.step == 14
    with pytest.raises(ConfigError, match="early_stopping.from_step"):
        standin.tiny_config(**{"early_stopping.from_step": -1})
