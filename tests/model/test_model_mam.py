"""UniPinRec claims (no action leakage, candidate independence), layout variants, config and input errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from genrec.errors import ConfigError
from genrec.model import GenRecModel, ModelBatch, ModelConfig

TOL = dict(atol=1e-5, rtol=0.0)
RANKING_LAYOUTS = [("pinger", True), ("dense", False), ("hstu", False)]


def make_model(seed: int, **over) -> GenRecModel:
    torch.manual_seed(seed)
    return GenRecModel(ModelConfig.from_name("tiny", dropout=0.0, **over)).eval()


def make_batch(cfg: ModelConfig, lengths: list[int], n: int, k: int, seed: int) -> ModelBatch:
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ri = lambda hi, *shape: torch.randint(0, hi, shape, generator=g)  # noqa: E731
    return ModelBatch(
        actions=ri(cfg.n_actions, b, n), surfaces=ri(cfg.n_surfaces, b, n), lengths=torch.tensor(lengths),
        sid_codes=torch.stack([ri(K, b, n) for K in cfg.sid_codebook_sizes], -1),
        item_feats=torch.randn(b, n, cfg.item_feat_dim, generator=g),
        action_mask=torch.rand(b, n, generator=g) < 0.5,
        cand_feats=torch.randn(b, k, cfg.item_feat_dim, generator=g) if k else None,
        cand_sid_codes=torch.stack([ri(K, b, k) for K in cfg.sid_codebook_sizes], -1) if k else None,
        cand_surface=ri(cfg.n_surfaces, b) if k else None,
    )


def run(model: GenRecModel, batch: ModelBatch):
    with torch.no_grad():
        return model(batch)


@pytest.mark.parametrize("layout,fusion", RANKING_LAYOUTS)
def test_masked_action_never_reaches_any_output(layout: str, fusion: bool) -> None:
    model = make_model(0, layout=layout, sid_fusion=fusion)
    batch = make_batch(model.config, [6, 5], 6, 3, 0)
    batch.action_mask[:, 2] = True
    base = run(model, batch)
    for new in range(model.config.n_actions):
        batch.actions[:, 2] = new
        out = run(model, batch)
        torch.testing.assert_close(out.action_logits, base.action_logits, **TOL)
        torch.testing.assert_close(out.user_vecs, base.user_vecs, **TOL)
        torch.testing.assert_close(out.cand_action_logits, base.cand_action_logits, **TOL)
    # and masking == feeding the [MASK] class directly
    direct = dataclasses.replace(batch, action_mask=None, actions=batch.actions.clone())
    direct.actions[batch.action_mask] = model.config.mask_action
    torch.testing.assert_close(run(model, direct).action_logits, base.action_logits, **TOL)


@pytest.mark.parametrize("layout,fusion", RANKING_LAYOUTS)
def test_an_action_only_reaches_later_positions(layout: str, fusion: bool) -> None:
    model = make_model(1, layout=layout, sid_fusion=fusion)
    batch = make_batch(model.config, [6, 6], 6, 0, 1)
    batch.action_mask[:] = False
    j = 3
    base = run(model, batch)
    batch.actions[:, j] = (batch.actions[:, j] + 1) % model.config.n_actions
    out = run(model, batch)
    torch.testing.assert_close(out.action_logits[:, :j], base.action_logits[:, :j], **TOL)
    own = (out.action_logits[:, j] - base.action_logits[:, j]).abs().max()
    later = (out.action_logits[:, j + 1:] - base.action_logits[:, j + 1:]).abs().max()
    assert later > 1e-5  # the test can see a change where one is allowed
    if layout == "hstu":
        torch.testing.assert_close(out.action_logits[:, j], base.action_logits[:, j], **TOL)  # item token precedes its action
    else:
        assert own > 1e-5  # unmasked: MAM input carries it (the loss only uses masked positions)


@pytest.mark.parametrize("layout,fusion", RANKING_LAYOUTS)
def test_candidate_scores_do_not_depend_on_other_candidates_or_rows(layout: str, fusion: bool) -> None:
    model = make_model(2, layout=layout, sid_fusion=fusion)
    batch = make_batch(model.config, [5, 3, 1], 5, 4, 2)
    base = run(model, batch).cand_action_logits  # [B, 4, C]

    def with_cands(idx: list[int]) -> ModelBatch:
        return dataclasses.replace(batch, cand_feats=batch.cand_feats[:, idx], cand_sid_codes=batch.cand_sid_codes[:, idx])

    perm = [2, 0, 3, 1]
    torch.testing.assert_close(run(model, with_cands(perm)).cand_action_logits, base[:, perm], **TOL)
    torch.testing.assert_close(run(model, with_cands([1])).cand_action_logits, base[:, [1]], **TOL)
    torch.testing.assert_close(run(model, with_cands([3, 0])).cand_action_logits, base[:, [3, 0]], **TOL)
    # add candidates: the first 4 keep their scores
    g = torch.Generator().manual_seed(9)
    more = dataclasses.replace(
        batch,
        cand_feats=torch.cat([batch.cand_feats, torch.randn(3, 3, model.config.item_feat_dim, generator=g)], 1),
        cand_sid_codes=torch.cat([batch.cand_sid_codes, batch.cand_sid_codes[:, :3].flip(1)], 1),
    )
    torch.testing.assert_close(run(model, more).cand_action_logits[:, :4], base, **TOL)
    # change other rows entirely: row 0 keeps its scores
    other = make_batch(model.config, [5, 5, 4], 5, 4, 77)
    for f in dataclasses.fields(ModelBatch):
        a, b = getattr(batch, f.name), getattr(other, f.name)
        if a is not None and b is not None:
            b[0] = a[0]
    torch.testing.assert_close(run(model, other).cand_action_logits[0], base[0], **TOL)
    # ...while the history does matter
    changed = dataclasses.replace(batch, item_feats=batch.item_feats.flip(1))
    assert (run(model, changed).cand_action_logits[0] - base[0]).abs().max() > 1e-5


def test_variant_outputs_per_layout() -> None:
    shapes = {}
    for layout in ("pinger", "tiger", "dense", "hstu"):
        model = make_model(3, layout=layout, sid_fusion=layout == "pinger")
        out = run(model, make_batch(model.config, [4, 2], 4, 0 if layout == "tiger" else 2, 3))
        shapes[layout] = (out.hidden.shape[1], out.sid_logits is not None, out.user_vecs is not None)
        assert torch.isfinite(out.hidden).all()
        if out.user_vecs is not None:
            torch.testing.assert_close(out.user_vecs.norm(dim=-1), torch.ones(2, 4), **TOL)
    L = 3
    assert shapes == {"pinger": (4 * L + 2, True, True), "tiger": (4 * L, True, False),
                      "dense": (4 + 2, False, True), "hstu": (8 + 2, False, True)}


def test_item_vectors_are_unit_norm_and_match_batch_vectors() -> None:
    model = make_model(4)
    batch = make_batch(model.config, [3], 3, 0, 4)
    out = run(model, batch)
    with torch.no_grad():
        vecs = model.item_vectors(batch.item_feats[0])
    torch.testing.assert_close(vecs, out.item_vecs[0], **TOL)
    torch.testing.assert_close(vecs.norm(dim=-1), torch.ones(3), **TOL)


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="layout"):
        ModelConfig.from_name("tiny", layout="sasrec")
    with pytest.raises(ConfigError, match="sid_codebook_sizes"):
        ModelConfig.from_name("tiny", sid_levels=3, sid_codebook_sizes=[4, 4])
    with pytest.raises(ConfigError, match="d_model"):
        ModelConfig.from_name("tiny", d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="preset"):
        ModelConfig.from_name("huge")
    with pytest.raises(ConfigError, match="unknown key"):
        ModelConfig.from_dict({"d_modl": 3})
    cfg = ModelConfig.from_name("gpu-base", n_actions=6)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    # 'triton' is a CUDA fast path: on CPU it is forced off and the reference runs
    tri = make_model(0, attn_impl="triton")
    ref = make_model(0, attn_impl="reference")
    b = make_batch(tri.config, [2], 2, 0, 0)
    a1, a2 = run(tri, b), run(ref, b)
    assert torch.equal(a1.hidden, a2.hidden)


def test_bad_inputs_name_the_field() -> None:
    model = make_model(0)
    batch = make_batch(model.config, [3, 2], 3, 2, 0)
    bad = dataclasses.replace(batch, sid_codes=batch.sid_codes.clone())
    bad.sid_codes[0, 0, 1] = 99
    with pytest.raises(ValueError, match="sid_codes.*level 2"):
        run(model, bad)
    with pytest.raises(ValueError, match="sid_codes"):
        run(model, dataclasses.replace(batch, sid_codes=batch.sid_codes[..., :2]))
    with pytest.raises(ValueError, match="actions"):
        run(model, dataclasses.replace(batch, actions=batch.actions + 10))
    with pytest.raises(ValueError, match="item_feat_dim"):
        run(model, dataclasses.replace(batch, item_feats=batch.item_feats[..., :5]))
    with pytest.raises(ValueError, match="cand_surface"):
        run(model, dataclasses.replace(batch, cand_surface=None))
    with pytest.raises(ValueError, match="max_items"):
        big = make_batch(model.config, [17], 17, 0, 0)
        run(model, big)
    with pytest.raises(ValueError, match="lengths >= 1"):
        model.encode_history(dataclasses.replace(batch, lengths=torch.tensor([3, 0]), cand_feats=None))
    tiger = make_model(0, layout="tiger", sid_fusion=False)
    with pytest.raises(ConfigError, match="tiger"):
        run(tiger, make_batch(tiger.config, [2], 2, 2, 0))


@pytest.mark.parametrize("impl", ["reference", "flex"])
def test_training_mode_backward_reaches_every_parameter(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENREC_ATTN", raising=False)
    torch.manual_seed(0)
    model = GenRecModel(ModelConfig.from_name("tiny", dropout=0.1, target_condition=True, attn_impl=impl)).train()
    batch = make_batch(model.config, [4, 2], 4, 2, 0)
    batch.target_actions = torch.randint(0, 5, (2, 4))
    batch.request_surface, batch.request_action = torch.tensor([1, 2]), torch.tensor([0, 3])
    out = model(batch)  # flex + dropout falls back to the reference path (flex has no attention dropout)
    v = out.item_valid
    loss = sum(t[m].sum() for t, m in zip(out.sid_logits, out.sid_valid)) + out.user_vecs[v].sum()
    loss = loss + out.action_logits[v].sum() + out.cand_action_logits.sum() + out.next_sid_logits.sum()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []
    assert out.layout.meta.is_cand.sum() == 4 and out.layout.meta.is_pad.sum() == 2 * 3
