"""The training step checks the batch with one host sync and weights the SID loss instead of
selecting rows: its loss and gradients equal the row-selecting twin's on fresh random batches,
and bad indices still fail with the field named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from genrec.catalog import ItemCatalog
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.train.batches import TrainBatch
from genrec.train.objective import JointObjective, ObjectiveConfig

KS = [8, 6, 5]


def _setup(seed: int, layout: str = "pinger", smoothing: float = 0.0) -> JointObjective:
    torch.manual_seed(seed)
    n = 60
    g = torch.Generator().manual_seed(seed)
    codes = torch.stack([torch.randint(0, k, (n,), generator=g) for k in KS], 1)
    cat = ItemCatalog(item_ids=np.arange(n, dtype=np.int64) + 1000, feats=torch.rand(n, 12, generator=g), codes=codes,
                      n_engagement=0)
    cfg = ModelConfig.from_name("tiny", layout=layout, sid_levels=3, sid_codebook_sizes=KS, n_actions=3, n_surfaces=2,
                                dropout=0.0)
    return JointObjective(GenRecModel(cfg), cat, ObjectiveConfig(w_item=0.0, w_action=0.0,
                                                                 sid_label_smoothing=smoothing), [0, 1])


def _batch(seed: int, b: int = 4, n: int = 7) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    return TrainBatch(rows=torch.randint(0, 60, (b, n), generator=g), actions=torch.randint(0, 3, (b, n), generator=g),
                      surfaces=torch.randint(0, 2, (b, n), generator=g), timestamps=torch.zeros(b, n, dtype=torch.int64),
                      lengths=lengths, cand_rows=None, cand_labels=None, cand_valid=None, cand_surface=None,
                      request_ts=None)


def _selected_sid_levels(obj: JointObjective, b: TrainBatch, eps: float = 0.0) -> list[tuple[torch.Tensor, int]]:
    """Twin: per SID level, the summed CE over rows picked by boolean selection (the former
    implementation) and their count; with label smoothing written out: (1 - ε) · (-log p_target)
    + ε · mean over codes of (-log p)."""
    mb, valid = obj.model_batch(b, mask_actions=False)
    out = obj.model(mb)
    positive = obj.pos_action[b.actions] & valid
    tgt = obj.codes[b.rows]
    levels = []
    for lvl, (lg, ok) in enumerate(zip(out.sid_logits, out.sid_valid or [])):
        m = ok & positive
        logp = F.log_softmax(lg[m].float(), -1)
        ce = (1 - eps) * -logp.gather(1, tgt[..., lvl][m][:, None])[:, 0] + eps * -logp.mean(-1)
        levels.append((ce.sum(), int(m.sum())))
    return levels


def _selected_sid_loss(obj: JointObjective, b: TrainBatch, eps: float = 0.0) -> torch.Tensor:
    """Twin: the mean CE over every level's selected rows."""
    levels = _selected_sid_levels(obj, b, eps)
    return sum(ce for ce, _ in levels) / max(sum(n for _, n in levels), 1)  # type: ignore[return-value]


@pytest.mark.parametrize("seed,eps", [(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.1), (4, 0.3)])
@pytest.mark.parametrize("layout", ["pinger", "tiger"])
def test_weighted_sid_loss_equals_row_selection(seed: int, eps: float, layout: str) -> None:
    obj = _setup(seed, layout, eps)
    b = _batch(seed)
    torch.manual_seed(7)
    out = obj.training_step(b)
    out["sid"].backward()
    got = {n: p.grad.clone() for n, p in obj.named_parameters() if p.grad is not None}
    obj.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    want = _selected_sid_loss(obj, b, eps)
    want.backward()
    torch.testing.assert_close(out["sid"], want, atol=1e-6, rtol=1e-6)
    for n, p in obj.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got[n], p.grad, atol=1e-6, rtol=1e-5)
    assert out["n_items"] == int(b.lengths.sum())


@pytest.mark.parametrize("layout", ["pinger", "tiger"])
def test_per_level_sid_terms(layout: str) -> None:
    """``sid_l1..sid_lL``: each level's mean CE over its selected rows (the twin), logged detached;
    weighted by their row counts they give back ``sid``."""
    obj = _setup(5, layout, 0.0)
    b = _batch(5)
    torch.manual_seed(7)
    out = obj.training_step(b)
    torch.manual_seed(7)
    levels = _selected_sid_levels(obj, b)
    for lvl, (ce, n) in enumerate(levels):
        torch.testing.assert_close(out[f"sid_l{lvl + 1}"], ce / max(n, 1), atol=1e-6, rtol=1e-6)
        assert not out[f"sid_l{lvl + 1}"].requires_grad
    sums, counts = [ce for ce, _ in levels], [n for _, n in levels]
    assert f"sid_l{len(sums) + 1}" not in out and len(sums) == obj.model.config.sid_levels
    torch.testing.assert_close(out["sid"], sum(sums) / sum(counts), atol=1e-6, rtol=1e-6)


def _selected_action_loss(obj: JointObjective, b: TrainBatch) -> torch.Tensor:
    """Twin: the action loss over boolean-selected rows (the former implementation)."""
    from genrec.model.losses import action_loss

    mb, valid = obj.model_batch(b, mask_actions=True)
    out = obj.model(mb)
    C = obj.model.config.n_actions
    m_past = mb.action_mask & valid
    lab = F.one_hot(b.actions.clamp(max=C - 1), C).float()
    lc, yc = out.cand_action_logits[b.cand_valid], b.cand_labels[b.cand_valid]
    return action_loss(out.action_logits[m_past].float(), lab[m_past], None, lc.float(), yc, None, obj.action_w)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_action_loss_equals_row_selection(seed: int) -> None:
    obj = _setup(seed)
    obj.cfg = ObjectiveConfig(w_sid=0.0, w_item=0.0, w_action=1.0, p_mask=0.5)
    b = _batch(seed)
    g = torch.Generator().manual_seed(seed)
    k = 5
    b.cand_rows = torch.randint(0, 60, (b.rows.shape[0], k), generator=g)
    b.cand_labels = (torch.rand(b.rows.shape[0], k, 3, generator=g) < 0.4).float()
    b.cand_valid = torch.rand(b.rows.shape[0], k, generator=g) < 0.7
    b.cand_surface = torch.randint(0, 2, (b.rows.shape[0],), generator=g)
    torch.manual_seed(11)
    got = obj.training_step(b)["action"]
    torch.manual_seed(11)
    want = _selected_action_loss(obj, b)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_bad_indices_name_the_field() -> None:
    obj = _setup(0)
    for field, value in (("actions", 4), ("surfaces", 2), ("rows", 60), ("lengths", 8)):
        b = _batch(1)
        t = getattr(b, field)
        t.view(-1)[0] = value
        with pytest.raises(ValueError, match=f"batch.{field}: values must lie in"):
            obj.training_step(b)
