"""The input-path knobs of the plain SASRec recipe: the item vector as the input token (``input_proj=False``),
the input embedding tables' init (``embed_init_std``) and dropout inside the FFN (``ffn_dropout``)."""

from __future__ import annotations

import pytest
import torch

from genrec.errors import ConfigError
from genrec.model import GenRecModel, ModelConfig
from genrec.model.layout import build_layout


def _model(seed: int = 0, **over) -> GenRecModel:
    torch.manual_seed(seed)
    return GenRecModel(ModelConfig.from_name("tiny", **over))


def test_untied_input_is_the_item_vector_plus_action_and_surface() -> None:
    """input_proj=False: a dense token is item vector + action embedding + surface embedding, by hand."""
    model = _model(1, input_proj=False, item_dim=32, sid_fusion=False, layout="dense")
    enc = model.dense_input
    g = torch.Generator().manual_seed(1)
    vecs = torch.randn(3, 5, 32, generator=g)
    acts = torch.randint(0, model.config.n_actions + 1, (3, 5), generator=g)
    surf = torch.randint(0, model.config.n_surfaces, (3, 5), generator=g)
    want = vecs + enc.action.weight.T[acts] + enc.surface.weight[surf]  # [3, 5, D]: one column per action class
    torch.testing.assert_close(model.dense_tokens(vecs, acts, surf, None), want)
    # the default projects [item ‖ action] instead: not the same function
    proj = _model(1, item_dim=32, sid_fusion=False, layout="dense")
    assert not torch.allclose(proj.dense_tokens(vecs, acts, surf, None), want)


def test_untied_input_needs_item_dim_equal_to_d_model() -> None:
    with pytest.raises(ConfigError, match="input_proj"):
        ModelConfig.from_name("tiny", input_proj=False, item_dim=16)  # tiny: d_model 32


def test_embed_init_std_sets_the_input_tables() -> None:
    """embed_init_std re-draws the surface, SID code, SID level and time-gap tables; the default (1.0) leaves
    nn.Embedding's N(0, 1) draw, and the same seed gives the same weights as before the knob existed."""
    small = _model(2, embed_init_std=0.02, time_buckets=8)
    tables = [small.dense_input.surface.weight, *[t.weight for t in small.sid_emb.tables],
              small.sid_emb.level.weight, small.time_gap.emb.weight]
    for w in tables:
        assert 0.01 < float(w.detach().std()) < 0.04
    default = _model(2, time_buckets=8)
    assert 0.7 < float(default.dense_input.surface.weight.detach().std()) < 1.3
    again = _model(2, time_buckets=8)
    for (k, a), (_, b) in zip(default.state_dict().items(), again.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)


def test_ffn_dropout_acts_in_training_only() -> None:
    """ffn_dropout alone (every other dropout 0): two training forwards differ, evaluation is deterministic and
    equals the same weights without the dropout layer (it holds no parameters)."""
    model = _model(3, ffn_dropout=0.5, layout="dense", sid_fusion=False)
    plain = _model(3, layout="dense", sid_fusion=False)
    sd = {k.replace("mlp.3.", "mlp.2."): v for k, v in model.state_dict().items()}  # [Linear, GELU, Dropout, Linear]
    plain.load_state_dict(sd)
    x = torch.randn(2, 6, model.config.d_model)
    lay = build_layout(torch.tensor([6, 4]), 6, "dense", model.config.sid_levels, 0)
    model.train()
    a, b = model.backbone(x, lay.meta, "dense"), model.backbone(x, lay.meta, "dense")
    assert not torch.allclose(a, b)
    model.eval()
    plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.backbone(x, lay.meta, "dense"), plain.backbone(x, lay.meta, "dense"))
