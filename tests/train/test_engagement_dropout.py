"""Engagement dropout zeroes only the engagement columns, only in training, at about rate p."""

import numpy as np
import torch

from genrec.catalog import ItemCatalog
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.train.objective import JointObjective, ObjectiveConfig


def test_engagement_dropout_masks_engagement_columns_in_training_only():
    n, dc, de = 200, 5, 7
    cat = ItemCatalog(item_ids=np.arange(n, dtype=np.int64), feats=torch.rand(n, dc + de) + 0.1, codes=None,
                      n_engagement=de)
    cfg = ModelConfig.from_name("tiny", layout="dense", item_feat_dim=dc + de, n_actions=2, n_surfaces=1)
    obj = JointObjective(GenRecModel(cfg), cat, ObjectiveConfig(engagement_dropout=0.3), [0])
    rows = torch.arange(n).repeat(20)  # [4000]
    obj.model.train()
    f = obj.item_feats(rows)
    assert torch.equal(f[:, :dc], cat.feats[rows, :dc])  # content untouched
    zero = (f[:, dc:] == 0).all(1)
    kept = (f[:, dc:] == cat.feats[rows, dc:]).all(1)
    assert bool((zero | kept).all())  # a row's engagement is dropped whole or kept whole
    assert abs(float(zero.float().mean()) - 0.3) < 0.04
    obj.model.eval()
    assert torch.equal(obj.item_feats(rows), cat.feats[rows])  # never at eval / serving
