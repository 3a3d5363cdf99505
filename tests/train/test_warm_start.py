"""Warm start (`init_from`) across a catalogue that grew: the last SID level's codebook bigger (new items coded
with the frozen codebooks) and new learned ID vectors. Every weight the checkpoint has keeps its value -- a grown
table in its leading rows, an ID vector at its item's row in the new keys -- and any other shape change is
refused, naming the tensor (before, a strict load refused the grown model outright)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from genrec.model.checkpoint_io import CheckpointError
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.train.checkpoint import save_checkpoint
from genrec.train.warm import warm_start


class Holder(nn.Module):
    """What training saves: the model under ``model.`` (as the training objective holds it)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.model = GenRecModel(cfg)


def _cfg(sizes: list[int], vocab: int = 0, **kw: object) -> ModelConfig:
    return ModelConfig.from_name("tiny", sid_levels=len(sizes), sid_codebook_sizes=sizes, item_id_vocab=vocab,
                                 dropout=0.0, **kw)


def _saved(tmp_path: Path, cfg: ModelConfig, keys: list[int] | None = None) -> tuple[Holder, Path]:
    torch.manual_seed(0)
    old = Holder(cfg)
    if keys is not None:
        old.model.item_encoder.set_id_keys(torch.tensor(keys))
    ckpt = save_checkpoint(tmp_path / "ck", 5, old, config={"model": cfg.to_dict()}, save_rng=False)
    return old, ckpt


def test_grown_codebook_and_new_item_ids_keep_every_old_weight(tmp_path: Path) -> None:
    old, ckpt = _saved(tmp_path, _cfg([8, 8, 5], vocab=4), keys=[10, 20, 30, 40])
    torch.manual_seed(1)
    new = Holder(_cfg([8, 8, 7], vocab=5))
    new.model.item_encoder.set_id_keys(torch.tensor([5, 20, 40, 50, 60]))  # 20 and 40 seen before
    fresh = {k: v.clone() for k, v in new.state_dict().items()}
    done = warm_start(new, ckpt)
    assert sorted(done["grown"]) == ["model.sid_emb.tables.2.weight", "model.sid_heads.heads.2.bias",
                                     "model.sid_heads.heads.2.weight"]
    o, n = old.state_dict(), new.state_dict()
    for key in n:
        if key in done["grown"]:  # the old codes' rows carried over, the new codes' rows as initialised
            assert torch.equal(n[key][:5], o[key]) and torch.equal(n[key][5:], fresh[key][5:]), key
        elif key.endswith("id_emb.weight"):  # matched by item id, not by row
            assert torch.equal(n[key][1], o[key][1]) and torch.equal(n[key][2], o[key][3])
            assert torch.equal(n[key][[0, 3, 4]], fresh[key][[0, 3, 4]])
        elif key.endswith("id_keys"):
            assert n[key][:5].tolist() == [5, 20, 40, 50, 60]  # the new run's own keys
        else:
            assert torch.equal(n[key], o[key]), key


def test_same_model_loads_as_before(tmp_path: Path) -> None:
    old, ckpt = _saved(tmp_path, _cfg([8, 8, 5]))
    new = Holder(_cfg([8, 8, 5]))
    assert warm_start(new, ckpt)["grown"] == []
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))


@pytest.mark.parametrize("change", [dict(sizes=[8, 8, 4]), dict(sizes=[8, 8, 5], d_model=48),
                                    dict(sizes=[8, 8, 5, 5])], ids=["shrunk", "wider", "more-levels"])
def test_other_models_are_refused(change: dict, tmp_path: Path) -> None:
    _, ckpt = _saved(tmp_path, _cfg([8, 8, 5]))
    sizes = change.pop("sizes")
    kw = {"n_heads": 2, **change} if "d_model" in change else change
    new = Holder(_cfg(sizes, **kw))
    with pytest.raises(CheckpointError, match="(cannot be grown|does not explain|does not fit)"):
        warm_start(new, ckpt)
