"""SIDs quantised from a trained model's own item vectors: ``genrec sid build WORKDIR --source model --from-run RUN``.

The SID path's prefix tree then follows the geometry the model scores items by -- the vectors its ANN index holds
(:meth:`genrec.infer.catalog_model.CatalogModel.all_catalogue_vectors`, learned ID vector included) -- rather than
the content or engagement vectors of the item features. RUN must have been trained on WORKDIR's items: each item of
WORKDIR's features needs a row in RUN's catalogue.

``genrec sid assign`` on such a version: a new item has no trained ID vector, so it gets what the model's item tower
makes of its content features alone (content beside an all-zero engagement block, no ID vector; the served
catalogue gives the items `sid assign` added imputed ones, :mod:`genrec.infer.catalog_model`). A tower without a content MLP (``model.item_content=false``: ID vectors only) has nothing to
give a new item, and the assign is refused. The build's manifest names the checkpoint folder used; the assign loads
that one again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.errors import ConfigError, DataError
from genrec.infer.load import load_model, open_run
from genrec.model.genrec_model import GenRecModel
from genrec.sid.rqkmeans import check_vectors
from genrec.workdir import read_json

__all__ = ["content_item_vectors", "model_item_vectors", "new_item_model_vectors"]


def model_item_vectors(run: str | Path, item_ids: Any, *, checkpoint: str | Path | None = None,
                       workdir: str | Path | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """RUN's item vectors (``checkpoint`` as :func:`genrec.infer.load.find_checkpoint`, relative to RUN) as its
    ANN index holds them, one row per item of ``item_ids`` (int64[n], in that order); and the build inputs
    naming the run, the checkpoint folder and its step. An item missing from RUN's catalogue is a
    :class:`ConfigError` naming both runs (``workdir``: the run the items come from, for the message)."""
    loaded = open_run(run, checkpoint, "cpu")
    vecs = loaded.catalog_model.all_catalogue_vectors().cpu().numpy()  # [N, item_dim] in catalogue order
    cat_ids = np.asarray(loaded.catalog.item_ids, dtype=np.int64)
    want = np.asarray(item_ids, dtype=np.int64)
    order = np.argsort(cat_ids, kind="stable")
    pos = np.searchsorted(cat_ids[order], want).clip(max=max(len(cat_ids) - 1, 0))
    found = (cat_ids[order][pos] == want) if len(cat_ids) else np.zeros(len(want), dtype=bool)
    if not found.all():
        miss = want[~found]
        where = f"the item features of {workdir}" if workdir is not None else "the items asked for"
        raise ConfigError(f"--from-run {run}: {len(miss)} of the {len(want)} items of {where} are not in the "
                          f"catalogue of {run} (e.g. item {int(miss[0])}); `--source model` needs a run trained on "
                          f"the same items (its features and SIDs built from the same tables)")
    rows = order[pos]
    inputs = {"run": str(Path(run).resolve()), "checkpoint": str(loaded.checkpoint.resolve()), "step": loaded.step}
    return np.ascontiguousarray(vecs[rows], dtype=np.float32), inputs


def content_item_vectors(model: GenRecModel, content: Any, item_ids: Any) -> np.ndarray:
    """What ``model``'s item tower makes of NEW items from their content vectors alone (f32 ``[m, item_dim]``):
    the features ``[content ‖ 0]`` (no engagement yet) and their ids (a new id has no learned ID vector: the content MLP's vector alone).
    A tower without a content MLP is refused: every new item would get the same all-zero vector."""
    cfg = model.config
    if model.item_encoder.mlp is None:
        raise ConfigError("the model's item tower has no content MLP (model.item_content=false: item ID vectors "
                          "only), so a new item -- no trained ID vector -- would get an all-zero vector: `sid "
                          "assign` cannot code it under SIDs built from this model's item vectors. Rebuild the "
                          "SIDs (`genrec sid build`) from a model with item_content=true, or from --source content")
    c = check_vectors(content, name="new item content vectors")
    ids = np.asarray(item_ids, dtype=np.int64)
    if ids.shape != (c.shape[0],):
        raise DataError(f"{c.shape[0]} content vectors for item ids of shape {ids.shape}", field="item_ids")
    if c.shape[1] > cfg.item_feat_dim:
        raise DataError(f"new item content vectors have dimension {c.shape[1]}; the model's item features have "
                        f"{cfg.item_feat_dim} (content + engagement)", field="vectors")
    feats = np.concatenate([c, np.zeros((c.shape[0], cfg.item_feat_dim - c.shape[1]), np.float32)], axis=1)
    model.eval()
    with torch.no_grad():
        v = model.item_vectors(torch.from_numpy(feats), torch.from_numpy(ids))
    return np.ascontiguousarray(v.float().numpy(), dtype=np.float32)


def new_item_model_vectors(version_path: str | Path, content: Any, item_ids: Any) -> np.ndarray:
    """``sid assign``'s vectors for NEW items under a ``--source model`` version: the checkpoint its build
    recorded (loaded again), through :func:`content_item_vectors`."""
    path = Path(version_path)
    inputs = read_json(path / "manifest.json").get("inputs", {})
    ckpt = Path(str(inputs.get("checkpoint") or ""))
    if not inputs.get("checkpoint") or not (ckpt / "model.safetensors").exists():
        raise ConfigError(f"SID version {path.name} quantised the item vectors of checkpoint "
                          f"{inputs.get('checkpoint')!r} (run {inputs.get('run')}), which is gone: new items cannot "
                          f"be coded with that model. Rebuild the SIDs (`genrec sid build --source model --from-run "
                          f"RUN`) from a checkpoint that exists")
    model, _ = load_model(ckpt)
    return content_item_vectors(model, content, item_ids)
