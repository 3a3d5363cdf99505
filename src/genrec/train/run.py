"""``genrec train``: one joint training run from a prepared run directory.

A :class:`RunConfig` bundles the model, objective, data and optimiser settings; named
presets (``RunConfig.from_name``) reproduce every reported number, ``key=value`` overrides
change any field (``model.d_model=128``, ``train.lr=3e-4``, ``objective.w_item=0``), and a
``variant`` switches the papers' ablations and baselines with the same code:

=============  ==========================================================================
pinger         interleaved SID + dense tokens, SID fusion, joint SID + item + action loss
tiger          TIGER layout: all L SID tokens per item, causal, SID loss only
sasrec         dense-only layout, full-softmax cross-entropy next-item loss (the bar)
dense          dense-only layout, sampled softmax + logQ, + action loss (PinRec/UniPinRec)
no-fusion      pinger without SID fusion
ranking-only   pinger layout, action loss only (UniPinRec "w/o item loss")
hstu           HSTU-style interleaved item/action tokens, item + action loss
frozen-ft      UniPinRec's "PinRec finetuned": start from ``init_from`` (a retrieval
               checkpoint), add the action loss, item encoder frozen (its vectors = the
               deployed ANN index's)
=============  ==========================================================================

The resolved config is written beside the checkpoints (``checkpoints/config.json``).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.errors import ConfigError
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.train.batches import BatchStream, ItemCatalog, materialise
from genrec.train.config import (EarlyStoppingConfig, TrainConfig, apply_overrides, compile_kwargs,
                                 compile_mode_for_world, from_dict, to_dict)
from genrec.train.objective import JointObjective, ObjectiveConfig
from genrec.workdir import WorkDir, read_json

VARIANTS = ("pinger", "tiger", "sasrec", "dense", "no-fusion", "ranking-only", "hstu", "frozen-ft")


def check_features_split(wd: WorkDir, kind: str) -> None:
    """Refuse item features whose engagement vectors saw another split's training events than the run's
    (``data.split``): with leave-one-out features a temporal run's test targets -- events after the cut --
    are in its item vectors (74 of 90 temporal test targets on MovieLens 100K). Features without a recorded
    split (built from a file before splits were recorded) pass."""
    man = wd.features / "manifest.json"
    if not man.exists():
        return
    built = (read_json(man).get("inputs") or {}).get("split")
    if built is not None and built != kind:
        raise ConfigError(f"data.split: {wd.features}: the item features' engagement vectors were built from the "
                          f"{built!r} split's training events, and this run trains with data.split={kind}: events the run "
                          f"must not see (its valid/test targets) are in them. Run `genrec features build "
                          f"{wd.root} --split {kind}` (then `genrec sid build`), or train with data.split={built}")


@dataclass
class DataConfig:
    context_len: int = 50
    p_rank: float = 0.5  # share of examples cut at a feedview whose slate becomes candidates
    fv_pick: str = "uniform"  # which feedview such a row is cut at: uniform (any, drawn) | last (the newest)
    max_cands: int = 16
    neg_cands: int = 8  # sampled catalogue items added to each slate as impression-only candidates
    neg_sampling: str = "uniform"  # uniform | popularity (training-split counts ^ 0.75: retrieval-like negatives)
    split: str = "loo"  # loo | temporal
    valid_cases: int = 2000  # valid users scored per evaluation during training (0 = all)
    eval_beam: int = 20
    # training batches pad item and candidate slots to a multiple of this (1 = to the longest
    # row): the same loss, and shapes that repeat, so GPU kernels and attention plans are reused
    pad_multiple: int = 8


@dataclass
class ModelOverrides:
    """Model fields a run may override; the rest come from the preset and the data."""

    d_model: int = 0
    n_layers: int = 0
    n_heads: int = 0
    d_ff: int = 0
    dropout: float = -1.0
    item_dim: int = 0
    sid_fusion: bool = True
    target_condition: bool = False
    attn_impl: str = "auto"
    # a learned vector per item id seen in training, added to the content MLP (SASRec's ID
    # embedding); items without one (cold, added later) keep their content vector
    id_embedding: bool = False
    # the fields below pass through to ModelConfig unchanged (see its comments); None = the preset's
    item_content: bool | None = None  # false: ID vectors only (needs id_embedding=true)
    input_dropout: float | None = None
    positions: str | None = None  # start | end
    pos_init_std: float | None = None
    user_head: str | None = None  # mlp | linear | identity
    norm: str | None = None  # rmsnorm | layernorm
    normalize: bool | None = None  # false: raw dot-product scores (set objective.temperature=1)
    id_init_std: float | None = None
    embed_init_std: float | None = None
    ffn_dropout: float | None = None
    input_proj: bool | None = None  # false: the item vector is the input token (needs item_dim == d_model)


@dataclass
class RunConfig:
    variant: str = "pinger"
    model_preset: str = "cpu-small"
    init_from: str = ""  # a checkpoint (folder or checkpoints root) to start from; weights only
    freeze_item_encoder: bool = False
    model: ModelOverrides = field(default_factory=ModelOverrides)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_name(cls, name: str, overrides: list[str] | None = None) -> "RunConfig":
        if name not in RUN_PRESETS:
            raise ConfigError(f"unknown run preset {name!r}; choose one of {sorted(RUN_PRESETS)}")
        cfg = from_dict(cls, RUN_PRESETS[name])
        cfg = apply_overrides(cfg, overrides or [])
        _check_model_overrides(overrides or [])
        if cfg.variant not in VARIANTS:
            raise ConfigError(f"config key 'variant': {cfg.variant!r} is not one of {VARIANTS}")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def _check_model_overrides(overrides: list[str]) -> None:
    """``model.*`` sizes given on the command line must be positive and dropout in [0, 1): in
    :class:`ModelOverrides` 0 (sizes) and -1 (dropout) mean "the preset's", so a typed 0 or a negative
    value would otherwise be dropped without a word."""
    for o in overrides:
        key, _, raw = o.partition("=")
        name = key.strip().removeprefix("model.")
        if not key.strip().startswith("model.") or name not in ("d_model", "n_layers", "n_heads", "d_ff",
                                                                "item_dim", "dropout"):
            continue
        v = float(raw)  # (apply_overrides has already parsed it as a number)
        if name == "dropout" and not 0.0 <= v < 1.0:
            raise ConfigError(f"config key 'model.dropout': must be in [0, 1), got {raw.strip()}")
        if name != "dropout" and v <= 0:
            raise ConfigError(f"config key '{key.strip()}': must be a positive integer, got {raw.strip()}")


def _preset(model_preset: str, train: dict[str, Any], data: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"model_preset": model_preset, "train": train, "data": data, **kw}


RUN_PRESETS: dict[str, dict[str, Any]] = {
    # the quickstart: ~1-3 minutes on 2 CPU cores (MovieLens 100K)
    "quickstart": _preset("cpu-small", dict(lr=2e-3, warmup_steps=20, total_steps=150, batch_size=64, bf16=False,
                                            device="cpu", log_every=25, eval_every=0, ckpt_every=0,
                                            tensorboard=True, progress="auto"),
                          dict(context_len=50, valid_cases=300)),
    # tests: seconds
    "cpu-tiny": _preset("cpu-small", dict(lr=3e-3, warmup_steps=2, total_steps=12, batch_size=16, bf16=False,
                                          device="cpu", log_every=4, eval_every=0, ckpt_every=6, keep_last=2,
                                          tensorboard=False, progress="off"),
                        dict(context_len=20, valid_cases=64, eval_beam=10),
                        model=dict(d_model=32, n_layers=1, n_heads=2, d_ff=64)),
    # a real CPU run (tens of minutes on 2 cores)
    "cpu-small": _preset("cpu-small", dict(lr=1e-3, warmup_steps=100, total_steps=3000, batch_size=128,
                                           bf16=False, device="cpu", log_every=50, eval_every=500,
                                           ckpt_every=500),
                         dict(context_len=50)),
    # one H200; the training forward compiled (1.6x the steps of eager in Beauty round 12)
    "gpu-base": _preset("gpu-base", dict(lr=1e-3, warmup_steps=300, total_steps=6000, batch_size=256, bf16=True,
                                         device="cuda", log_every=100, eval_every=1000, ckpt_every=1000, compile=True,
                                         compile_mode="reduce-overhead",  # CUDA graphs: 1.44x items/s on Beauty
                                         early_stopping=EarlyStoppingConfig(metric="valid/ann/recall@10",
                                                                            mode="max", patience=3)),
                        dict(context_len=50, valid_cases=0)),
    # Amazon- and MovieLens-sized sequences, the joint model (SID + next-item + action losses) on the plain SASRec
    # recipe's training (../shared/yardstick/sasrec.py: ID vectors tied in and out, d 64, 2 blocks of 1 head,
    # dropout .5 on the inputs too, positions counted from the end, Adam 1e-3 constant) plus a content MLP beside the
    # ID vectors and a weight average; chosen on validation by the ladders in configs/ladder-*.json (frozen as
    # configs/seq-small.json). ~5.5 minutes of training, sized for one GPU (a 2-core CPU gets through ~60 steps).
    "seq-small": dict(
        variant="pinger", model_preset="gpu-base",
        model=dict(d_model=64, n_layers=2, n_heads=1, d_ff=64, item_dim=64, dropout=0.5, input_dropout=0.5,
                   id_embedding=True, item_content=True, positions="end", pos_init_std=0.02, user_head="identity"),
        objective=dict(item_loss="full", w_sid=4.0, w_item=1.0, w_action=0.2),
        data=dict(context_len=50, valid_cases=5000, eval_beam=20),
        train=dict(lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999), decay="constant", warmup_steps=0, grad_clip=0.0,
                   ema_decay=0.999, batch_size=256, bf16=True, device="auto", total_steps=200000, max_minutes=5.5,
                   eval_every=200, log_every=200, ckpt_every=1000, keep_last=2, compile=False,
                   early_stopping=EarlyStoppingConfig(metric="valid/sid/recall@10", mode="max", patience=8))),
}


def variant_overrides(cfg: RunConfig) -> tuple[dict[str, Any], ObjectiveConfig]:
    """Model-field overrides and the objective each variant implies."""
    v = cfg.variant
    obj = cfg.objective
    m: dict[str, Any] = {}
    if v == "tiger":
        m["layout"] = "tiger"
        obj = dataclasses.replace(obj, w_item=0.0, w_action=0.0)
    elif v == "sasrec":
        m["layout"] = "dense"
        m["sid_fusion"] = False  # the plain recipe has no SIDs
        obj = dataclasses.replace(obj, w_sid=0.0, w_action=0.0, item_loss="full")
    elif v == "dense":
        m["layout"] = "dense"
        obj = dataclasses.replace(obj, w_sid=0.0)
    elif v == "no-fusion":
        m["sid_fusion"] = False
    elif v == "ranking-only":
        obj = dataclasses.replace(obj, w_sid=0.0, w_item=0.0)
    elif v == "hstu":
        m["layout"] = "hstu"
        obj = dataclasses.replace(obj, w_sid=0.0)
    elif v == "frozen-ft":  # PinRec (dense retrieval) fine-tuned for ranking
        m["layout"] = "dense"
        obj = dataclasses.replace(obj, w_sid=0.0)
    return m, obj


def build_model_config(cfg: RunConfig, catalog: ItemCatalog, n_actions: int, n_surfaces: int,
                       sid_sizes: list[int] | None, n_id_items: int = 0) -> ModelConfig:
    """``n_id_items``: how many item ids get a learned vector when ``model.id_embedding`` is on."""
    mv, _ = variant_overrides(cfg)
    o = cfg.model
    kw: dict[str, Any] = {"n_actions": n_actions, "n_surfaces": max(1, n_surfaces),
                          "item_feat_dim": int(catalog.feats.shape[1]), "max_items": cfg.data.context_len + 1,
                          "sid_fusion": o.sid_fusion, "target_condition": o.target_condition,
                          "attn_impl": o.attn_impl,
                          "item_id_vocab": max(1, n_id_items) if o.id_embedding else 0}
    for name in ("d_model", "n_layers", "n_heads", "d_ff", "item_dim"):
        if getattr(o, name) > 0:
            kw[name] = getattr(o, name)
    if o.dropout >= 0:
        kw["dropout"] = o.dropout
    for name in (f.name for f in dataclasses.fields(o) if f.default is None):  # the pass-through fields
        if getattr(o, name) is not None:
            kw[name] = getattr(o, name)
    if sid_sizes is not None:
        kw["sid_levels"] = len(sid_sizes)
        kw["sid_codebook_sizes"] = list(sid_sizes)
    kw.update(mv)
    if sid_sizes is None and kw.get("layout", "pinger") in ("pinger", "tiger"):
        raise ConfigError(f"variant {cfg.variant!r} needs Semantic IDs: run `genrec sid build` first")
    return ModelConfig.from_name(cfg.model_preset, **kw)


def init_and_freeze(objective: JointObjective, cfg: RunConfig) -> None:
    """``init_from``: load model weights (and the frequency sketch) from another run's checkpoint;
    ``freeze_item_encoder`` (implied by ``frozen-ft``): the item encoder gets no updates."""
    from genrec.train.checkpoint import load_checkpoint

    if cfg.variant == "frozen-ft" and not cfg.init_from:
        raise ConfigError("variant 'frozen-ft' needs init_from=<retrieval run's checkpoints folder>")
    if cfg.init_from:
        load_checkpoint(cfg.init_from, objective, restore_rng=False)
    if cfg.freeze_item_encoder or cfg.variant == "frozen-ft":
        for p in objective.model.item_encoder.parameters():
            p.requires_grad_(False)


def train_run(workdir: str | Path, cfg: RunConfig, *, resume: bool = True) -> dict[str, Any]:
    """Train one model in ``WORKDIR`` (checkpoints under ``WORKDIR/checkpoints``)."""
    from genrec.eval.retrieval import evaluate_retrieval, make_eval_set
    from genrec.pipeline import load_catalog, open_store
    from genrec.train.distributed import launched_world_size, pick_device
    from genrec.train.trainer import Trainer

    pick_device(cfg.train.device)  # a missing CUDA device fails here, before the data is read
    wd = WorkDir(workdir)
    store = open_store(wd.root)
    info = store.info()
    mv, obj_cfg = variant_overrides(cfg)
    needs_sids = mv.get("layout", "pinger") in ("pinger", "tiger")
    if cfg.data.split not in ("loo", "temporal"):
        raise ConfigError(f"config key 'data.split': must be 'loo' or 'temporal', got {cfg.data.split!r}")
    check_features_split(wd, cfg.data.split)  # before anything is loaded: the fix is a features rebuild
    catalog = load_catalog(wd.root, with_sids=needs_sids or (wd.sid / "CURRENT").exists())
    sid_build = None
    sid_sizes = None
    if catalog.codes is not None:
        from genrec.sid.build import open_current

        sid_build = open_current(wd.sid)
        sid_sizes = [int(k) for k in sid_build.codebook_sizes]
    split = SplitSpec(kind="temporal" if cfg.data.split == "temporal" else "loo")
    reader = BucketJoinReader(store, split=split, role="train", context_len=10 ** 9, seed=cfg.train.seed)
    examples = materialise(reader, catalog)
    # how often the training split shows each catalogue row: ID vectors only for rows it shows
    # (others would stay at their random init); popularity-sampled negatives weigh by it
    row_counts = np.bincount(np.concatenate([e.rows for e in examples]), minlength=len(catalog)) if examples \
        else np.zeros(len(catalog), dtype=np.int64)
    seen_ids = catalog.item_ids[row_counts > 0]
    mcfg = build_model_config(cfg, catalog, len(info.actions), len(info.surfaces), sid_sizes, len(seen_ids))
    torch.manual_seed(cfg.train.seed)
    model = GenRecModel(mcfg)
    if mcfg.item_id_vocab > 0:
        model.item_encoder.set_id_keys(torch.from_numpy(seen_ids))
    pos = [info.actions.index(a) for a in info.positive_actions]
    objective = JointObjective(model, catalog, obj_cfg, pos, sketch_seed=cfg.train.seed)
    init_and_freeze(objective, cfg)
    if not cfg.train.compile and cfg.train.compile_mode != "default":
        print(f"[genrec.train] train.compile_mode={cfg.train.compile_mode} is not used: train.compile=false (eager)",
              file=sys.stderr)
    if cfg.train.compile:  # (the device was checked at the top)
        world = launched_world_size()
        mode = compile_mode_for_world(cfg.train.compile_mode, world)
        if mode != cfg.train.compile_mode:
            print(f"[genrec.train] train.compile_mode={cfg.train.compile_mode} -> {mode} under torchrun ({world} "
                  "processes): CUDA-graphed training is checked on one GPU only", file=sys.stderr)
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile_mode=mode))
        # in place: the state dict keeps its keys, checkpoints stay interchangeable
        model.compile(**compile_kwargs(mode))
        print(f"[genrec.train] train.compile=true (mode {mode}): the first steps of each batch shape compile the "
              "training forward (tens of seconds; train.compile=false runs eager)", file=sys.stderr)

    valid = make_eval_set(list(BucketJoinReader(store, split=split, role="valid", context_len=cfg.data.context_len)),
                          catalog, max_cases=cfg.data.valid_cases, seed=cfg.train.seed)
    if len(valid) == 0:
        print("[genrec.train] warning: no validation cases (no user has a validation event in this split), so "
              "every valid/* metric below reads 0 and says nothing; early stopping and the BEST checkpoint follow "
              "them. Give users more events, or check the split.", file=sys.stderr)

    trie = leaf_rows = None
    if sid_build is not None:
        from genrec.decode.trie_torch import TorchTrie

        t = sid_build.trie
        leaf_rows = catalog.rows(np.asarray(t.leaf_items))

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        nonlocal trie
        dev = next(m.parameters()).device
        if sid_build is not None and sid_sizes is not None and (trie is None or trie.device != dev):
            t = sid_build.trie
            trie = TorchTrie.from_arrays(t.offsets, t.codes, t.children, sid_sizes, device=dev)
        res = evaluate_retrieval(m, valid, beam_width=cfg.data.eval_beam, context_len=cfg.data.context_len,
                                 trie=trie, leaf_rows=leaf_rows)
        return {f"valid/{p}/{k}": v for p, r in res.items() for k, v in r.items() if k != "n"}

    if cfg.data.neg_sampling not in ("uniform", "popularity"):
        raise ConfigError(f"config key 'data.neg_sampling': must be 'uniform' or 'popularity', "
                          f"got {cfg.data.neg_sampling!r}")
    neg_weights = None
    if cfg.data.neg_sampling == "popularity":
        neg_weights = row_counts.astype(np.float64) ** 0.75 if examples else np.ones(len(catalog))

    def factory(spec: Any) -> Any:
        stream = BatchStream(examples, batch_size=cfg.train.batch_size, seed=spec.seed,
                             context_len=cfg.data.context_len, n_actions=len(info.actions),
                             p_rank=cfg.data.p_rank if obj_cfg.w_action > 0 else 0.0,
                             max_cands=cfg.data.max_cands, rank=spec.rank, world=spec.world_size,
                             neg_cands=cfg.data.neg_cands, n_catalog=len(catalog), neg_weights=neg_weights,
                             pad_multiple=cfg.data.pad_multiple, fv_pick=cfg.data.fv_pick)
        return stream.iter_from(spec.start_step)

    extra = {"tables": store.manifest().get("namespace", ""), "sid_version": sid_build.version if sid_build else None,
             "features": str(wd.features), "model_config": mcfg.to_dict(), "run_config": cfg.to_dict()}
    trainer = Trainer(objective, factory, cfg.train, wd, eval_fn=eval_fn, extra=extra,
                      config_extra={"run": cfg.to_dict(), "model": mcfg.to_dict()})
    result = trainer.fit(resume=resume)
    with trainer.averaged():
        final = eval_fn(objective)  # the weights the last checkpoint serves
    return {"step": result.step, "best_step": result.best_step, "valid": final,
            "train_examples": len(examples), "valid_cases": len(valid),
            "last_loss": result.history[-1] if result.history else None,
            "checkpoint": str(result.last_checkpoint) if result.last_checkpoint else None,
            **({"interrupted": result.interrupted} if result.interrupted else {}),
            **({"previous_run": str(result.archived)} if result.archived else {})}
