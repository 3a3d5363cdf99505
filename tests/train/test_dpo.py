"""DPO preference tuning (genrec.train.dpo): the pair rule against a slow twin, the sequence log-probability
against the serving beam's, the loss at the start and its direction, and the stage end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import ConfigError
from genrec.model import GenRecModel, ModelBatch, ModelConfig
from genrec.train.dpo import _keys, dpo_loss, preference_pairs, sid_sequence_logprob
from genrec.train.run import RunConfig


def _pairs_twin(rows, labels, valid, positive, negative, salt):
    """One slate at a time, in plain Python."""
    out = []
    for b in range(rows.shape[0]):
        keys = _keys(rows[b:b + 1], salt[b:b + 1])[0].tolist()
        pos, neg, other = [], [], []
        for j in range(rows.shape[1]):
            if not valid[b, j]:
                continue
            bits = [c for c in range(labels.shape[2]) if labels[b, j, c] > 0]
            if any(positive[c] for c in bits):
                pos.append(j)
            elif any(negative[c] for c in bits):
                neg.append(j)
            else:
                other.append(j)
        rej = neg or other
        if pos and rej:
            w = min(pos, key=lambda j: (keys[j], j))
            r = min(rej, key=lambda j: (keys[j], j))
            out.append((b, int(rows[b, w]), int(rows[b, r])))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 7))
def test_preference_pairs_equal_the_slow_twin(seed: int, B: int, k: int) -> None:
    g = torch.Generator().manual_seed(seed)
    C = 3
    rows = torch.randperm(500, generator=g)[:B * k].view(B, k)  # distinct rows: no key ties inside a slate
    labels = (torch.rand(B, k, C, generator=g) < 0.3).float()
    valid = torch.rand(B, k, generator=g) < 0.8
    positive = torch.tensor([True, True, False])
    salt = torch.randint(0, 1000, (B,), generator=g)
    idx, win, lose = preference_pairs(rows, labels, valid, positive, ~positive, salt)
    got = list(zip(idx.tolist(), win.tolist(), lose.tolist()))
    assert got == _pairs_twin(rows, labels, valid, positive, ~positive, salt)
    for b, w, r in got:  # a disliked item is rejected before a skipped one
        disliked = [int(rows[b, j]) for j in range(k) if valid[b, j] and labels[b, j, 2] > 0
                    and labels[b, j, :2].sum() == 0]
        if disliked:
            assert r in disliked


@pytest.mark.parametrize("over", [dict(sid_fusion=True, target_condition=False),
                                  dict(sid_fusion=True, target_condition=False, positions="end", pos_init_std=0.02,
                                       user_head="identity", item_dim=32, input_proj=False, normalize=False)])
def test_sequence_logprob_equals_the_serving_beams(over: dict) -> None:
    """log P(SID | history) by teacher forcing on the training layout == the sum of the serving path's
    per-level log-softmaxes (KV cache of the history, then one beam step per level)."""
    torch.manual_seed(0)
    model = GenRecModel(ModelConfig.from_name("tiny", dropout=0.0, **over)).eval()
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, 3, 1, 4])
    B, n = 4, 6  # room for the appended item
    codes = torch.stack([torch.randint(0, K, (B, n), generator=g) for K in cfg.sid_codebook_sizes], -1)
    feats = torch.randn(B, n, cfg.item_feat_dim, generator=g)
    acts = torch.randint(0, cfg.n_actions, (B, n), generator=g)
    surf = torch.randint(0, cfg.n_surfaces, (B, n), generator=g)
    full = ModelBatch(actions=acts, surfaces=surf, lengths=lengths + 1, sid_codes=codes, item_feats=feats,
                      action_mask=torch.zeros(B, n, dtype=torch.bool))
    full.pos_lengths = lengths
    ar = torch.arange(B)
    target = codes[ar, lengths]  # [B, L]: the appended item's SID
    with torch.no_grad():
        got = sid_sequence_logprob(model, full, target)
        hist = ModelBatch(actions=acts, surfaces=surf, lengths=lengths, sid_codes=codes, item_feats=feats,
                          action_mask=torch.zeros(B, n, dtype=torch.bool))
        cache, _, _ = model.encode_history(hist)
        want = torch.zeros(B)
        for d in range(cfg.sid_levels):
            lp = torch.log_softmax(model.sid_logits_next(cache, target[:, None, :d]).float(), -1)[:, 0]
            want += lp[ar, target[:, d]]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_dpo_loss_starts_at_log2_and_prefers_the_chosen() -> None:
    pi_w = torch.tensor([-3.0, -2.0], requires_grad=True)
    pi_l = torch.tensor([-2.5, -4.0], requires_grad=True)
    losses, right = dpo_loss(pi_w, pi_l, pi_w.detach(), pi_l.detach(), beta=0.1)
    assert torch.allclose(losses.detach(), torch.full((2,), float(np.log(2)))) and float(right.sum()) == 0.0
    losses.mean().backward()
    assert bool((pi_w.grad < 0).all()) and bool((pi_l.grad > 0).all())  # descent raises chosen, lowers rejected


def test_dpo_stage_needs_a_checkpoint_to_start_from() -> None:
    cfg = RunConfig.from_name("cpu-tiny", stage="dpo")
    assert cfg.objective.w_dpo == 1.0 and cfg.data.p_rank == 1.0 and cfg.train.ema_decay == 0.0
    assert cfg.data.rank_rows == "extra"
    with pytest.raises(ConfigError, match="training stage"):
        RunConfig.from_name("cpu-tiny", stage="rlhf")


def test_dpo_stage_end_to_end(tmp_path, data_root) -> None:
    """`--stage dpo` from a trained checkpoint: the first step's DPO loss is log 2 (policy == reference), pairs
    come from the slates, the policy moves, and the checkpoint serves (no reference weights in it)."""
    import json

    from genrec.infer.recommender import Recommender
    from genrec.recipes.training import train_run
    from tests.tiny_run import build_run

    root = build_run(tmp_path / "run", data_root, steps=4)
    init = root / "checkpoints" / "step-000004"
    with pytest.raises(ConfigError, match="init_from"):
        train_run(root, RunConfig.from_name("cpu-tiny", ["train.total_steps=2"], stage="dpo"), resume=False)
    over = ["train.total_steps=16", "train.ckpt_every=0", "data.valid_cases=16", "data.context_len=12",
            "train.log_every=1", "train.lr=0.01", "objective.dpo_beta=1", f"init_from={init}",
            "objective.w_sid=0", "objective.w_item=0", "objective.w_action=0"]
    res = train_run(root, RunConfig.from_name("cpu-tiny", over, stage="dpo"), resume=False)
    log = [json.loads(x) for x in (root / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "dpo" in r]
    assert len(steps) == 16 and all(0 <= r["dpo_acc"] <= 1 for r in steps)
    assert abs(steps[0]["dpo"] - float(np.log(2))) < 1e-4
    assert any(abs(r["dpo"] - float(np.log(2))) > 1e-3 for r in steps[1:])  # the policy moved off the reference
    rec = Recommender.from_checkpoint(root, res["checkpoint"])
    assert rec.step == 16


def test_dpo_steps_raise_the_chosen_over_the_rejected() -> None:
    """Gradient steps on DPO alone, one fixed batch: the loss falls below log 2 and the reference stays put."""
    import copy

    from genrec.catalog import ItemCatalog
    from genrec.train.batches import TrainBatch
    from genrec.train.objective import JointObjective, ObjectiveConfig

    torch.manual_seed(0)
    model = GenRecModel(ModelConfig.from_name("tiny", dropout=0.0))
    cfg = model.config
    N = 40
    g = torch.Generator().manual_seed(2)
    codes = torch.stack([torch.randint(0, K, (N,), generator=g) for K in cfg.sid_codebook_sizes], -1)
    cat = ItemCatalog(item_ids=np.arange(N, dtype=np.int64), feats=torch.randn(N, cfg.item_feat_dim, generator=g),
                      codes=codes)
    obj = JointObjective(model, cat, ObjectiveConfig(w_sid=0, w_item=0, w_action=0, w_dpo=1, dpo_beta=1.0), [0, 1])
    obj.set_reference(copy.deepcopy(model))
    B, n, k = 6, 5, 4
    lab = torch.zeros(B, k, cfg.n_actions)
    lab[:, 0, 1] = 1  # a like
    lab[:, 1, 2] = 1  # a dislike
    b = TrainBatch(torch.randint(0, N, (B, n), generator=g), torch.zeros(B, n, dtype=torch.long),
                   torch.zeros(B, n, dtype=torch.long), torch.arange(n).repeat(B, 1), torch.tensor([5, 4, 3, 2, 1, 5]),
                   torch.randint(0, N, (B, k), generator=g), lab, torch.ones(B, k, dtype=torch.bool),
                   torch.zeros(B, dtype=torch.long), torch.full((B,), 9))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ref_before = {k: v.clone() for k, v in obj.__dict__["_reference"].state_dict().items()}
    losses = []
    for _ in range(25):
        sums, pairs = obj.dpo_terms(b)
        assert int(pairs) == B
        loss = sums["dpo"] / pairs
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert abs(losses[0] - float(np.log(2))) < 1e-5 and losses[-1] < 0.5 * losses[0]
    ref = obj.__dict__["_reference"].state_dict()
    assert all(torch.equal(ref[k], v) for k, v in ref_before.items())
    assert not any(k.startswith("_reference") for k in obj.state_dict())
