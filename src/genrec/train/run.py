"""What ``genrec train`` runs: the run configuration, its presets and variants, and the model it builds.

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

The resolved config is written beside the checkpoints (``checkpoints/config.json``). The run itself
-- data, model, trainer and its validation -- is :func:`genrec.recipes.training.train_run`.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

from genrec.catalog import ItemCatalog
from genrec.errors import ConfigError
from genrec.model.config import ModelConfig
from genrec.train.batches import NEG_SAMPLING
from genrec.train.config import EarlyStoppingConfig, TrainConfig, apply_overrides, from_dict, to_dict
from genrec.train.objective import JointObjective, ObjectiveConfig, logs_feedback
from genrec.train.warm import warm_start
from genrec.workdir import WorkDir, read_json

RETRIEVAL_FIRST = ("off", "feedback", "on")
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
    rank_rows: str = "cut"  # a user drawn for ranking: cut (its row cut at the feedview) | extra (a cut row added)
    max_cands: int = 16
    neg_cands: int = 8  # sampled catalogue items added to each slate as impression-only candidates
    # uniform | popularity (training-split counts ^ 0.75) | neighbours (the engagement neighbours of the slate's
    # items, the user's own items left out: what L0 returns beside what the user took) | mixed (half of each)
    neg_sampling: str = "uniform"
    # where the data logs several actions (like / view / dislike), this sampling instead (None: neg_sampling
    # everywhere); the candidates teach the heads which action, so one-action data keeps neg_sampling
    neg_sampling_feedback: str | None = None
    split: str = "loo"  # loo | temporal
    valid_cases: int = 2000  # valid users scored per evaluation during training (0 = all)
    eval_beam: int = 20
    # training batches pad item and candidate slots to a multiple of this (1 = to the longest
    # row): the same loss, and shapes that repeat, so GPU kernels and attention plans are reused
    pad_multiple: int = 8
    # streaming input (genrec.train.stream): false = every training example materialised in memory on every rank;
    # true = each rank reads only its buckets, window_buckets buckets at a time, shuffled within the window
    stream: bool = False
    window_buckets: int = 1
    engine: str = "embedded"  # embedded (pyiceberg in the trainer) | ray (Ray Data workers; needs stream=true)
    ray_workers: int = 2  # Ray actors preparing this rank's batches (engine=ray)

    def __post_init__(self) -> None:
        if self.engine not in ("embedded", "ray"):
            raise ConfigError(f"config key 'data.engine': must be 'embedded' or 'ray', got {self.engine!r}")
        if self.engine == "ray" and not self.stream:
            raise ConfigError("config key 'data.engine': 'ray' prepares streamed windows; set data.stream=true too")
        if self.window_buckets < 1:
            raise ConfigError(f"config key 'data.window_buckets': must be >= 1, got {self.window_buckets}")
        if self.ray_workers < 1:
            raise ConfigError(f"config key 'data.ray_workers': must be >= 1, got {self.ray_workers}")
        if self.neg_sampling not in NEG_SAMPLING:
            raise ConfigError(f"config key 'data.neg_sampling': must be one of {', '.join(NEG_SAMPLING)}, "
                              f"got {self.neg_sampling!r}")
        if self.neg_sampling_feedback is not None and self.neg_sampling_feedback not in NEG_SAMPLING:
            raise ConfigError(f"config key 'data.neg_sampling_feedback': must be one of {', '.join(NEG_SAMPLING)} "
                              f"or null, got {self.neg_sampling_feedback!r}")

    def sampling_for(self, n_actions: int) -> str:
        """How ranking rows' impression-only candidates are drawn on data that logs ``n_actions`` actions:
        ``neg_sampling_feedback`` where it logs several and that is set, else ``neg_sampling``."""
        return self.neg_sampling_feedback if self.neg_sampling_feedback is not None and logs_feedback(n_actions) \
            else self.neg_sampling


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
    init_from: str = ""  # a checkpoint (folder or checkpoints root) to start from; weights only (genrec.train.warm)
    # train retrieval alone first, then the joint model from its last checkpoint (genrec.recipes.retrieval_first):
    # off | feedback (where the data logs several actions) | on
    retrieval_first: str = "off"
    # the metric the joint phase of such a run early-stops on and picks its best checkpoint by (e.g. valid/rank/auc:
    # the heads it trains); "" = train.early_stopping.metric, as the retrieval phase
    joint_metric: str = ""
    freeze_item_encoder: bool = False
    model: ModelOverrides = field(default_factory=ModelOverrides)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_name(cls, name: str, overrides: list[str] | None = None, stage: str = "joint") -> "RunConfig":
        """Preset ``name``, then the ``stage``'s overrides (:data:`STAGES`), then ``overrides``."""
        if name not in RUN_PRESETS:
            raise ConfigError(f"unknown run preset {name!r}; choose one of {sorted(RUN_PRESETS)}")
        if stage not in STAGES:
            raise ConfigError(f"unknown training stage {stage!r}; choose one of {sorted(STAGES)}")
        cfg = from_dict(cls, RUN_PRESETS[name])
        cfg = apply_overrides(cfg, [*STAGES[stage], *(overrides or [])])
        _check_model_overrides(overrides or [])
        if cfg.variant not in VARIANTS:
            raise ConfigError(f"config key 'variant': {cfg.variant!r} is not one of {VARIANTS}")
        if cfg.retrieval_first not in RETRIEVAL_FIRST:
            raise ConfigError(f"config key 'retrieval_first': must be one of {', '.join(RETRIEVAL_FIRST)}, "
                              f"got {cfg.retrieval_first!r}")
        if cfg.joint_metric and not cfg.joint_metric.startswith("valid/"):  # (said before a phase has trained)
            raise ConfigError(f"config key 'joint_metric': a validation metric (valid/...), e.g. valid/rank/hit@3 or "
                              f"valid/ann/ndcg@10, got {cfg.joint_metric!r}")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


# Training stages: ``joint`` trains the joint objective; ``dpo`` (PinGER's post-training) starts from
# ``init_from``, keeps it frozen as the reference and adds DPO on the SID sequences of pairs from one slate
# (genrec.train.dpo); every user with a slate adds a row cut at a request (its pairs) beside its whole history
# (the joint loss keeps training on that), and no weight average (it would hold the weights near the start for
# the few steps the stage takes).
STAGES: dict[str, tuple[str, ...]] = {
    "joint": (),
    "dpo": ("objective.w_dpo=1", "data.p_rank=1", "data.rank_rows=extra", "train.ema_decay=0"),
}


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
    # a real CPU run (about an hour on 2 free cores, MovieLens 100K; longer when they are shared)
    "cpu-small": _preset("cpu-small", dict(lr=1e-3, warmup_steps=100, total_steps=3000, batch_size=128,
                                           bf16=False, device="cpu", log_every=50, eval_every=500,
                                           ckpt_every=500),
                         dict(context_len=50)),
    # one H200; the training forward compiled (`python benchmarks/bench_train.py WORKDIR --preset gpu-base`, with and
    # without train.compile=true, times the two)
    "gpu-base": _preset("gpu-base", dict(lr=1e-3, warmup_steps=300, total_steps=6000, batch_size=256, bf16=True,
                                         device="cuda", log_every=100, eval_every=1000, ckpt_every=1000, compile=True,
                                         compile_mode="reduce-overhead",  # CUDA graphs: 1.44x items/s on Beauty
                                         early_stopping=EarlyStoppingConfig(metric="valid/ann/recall@10",
                                                                            mode="max", patience=3)),
                        dict(context_len=50, valid_cases=0)),
    # Amazon- and MovieLens-sized sequences, the joint model (SID + next-item + action losses) on the plain SASRec
    # recipe's training (../shared/yardstick/sasrec.py: ID vectors tied in and out -- the item vector is the input
    # token -- and scored by raw dot products, dropout .5 on the inputs too, positions counted from the end, Adam 1e-3
    # constant) plus a content MLP beside the ID vectors and a weight average, at the plain recipe's width (d 64, 2
    # blocks of 1 head: configs/ladder-beauty-width.json, chosen on Beauty's validation over d 128; frozen as
    # configs/seq-small.json). The ranking rows' sampled negatives are the engagement neighbours of the slate's items
    # (configs/ladder-ml-l1-cpu.json: the heads alone rank the union decidedly better, retrieval unchanged). The
    # action loss weighs .2 where the data logs one action (Beauty's retrieval falls at 2 and 5:
    # configs/ladder-beauty-action.json) and 5 where it logs several (MovieLens with like / view / dislike:
    # configs/ladder-ml-order-cpu.json, rung a5). There the retrieval model is trained first and the joint model
    # from it (retrieval_first: UniPinRec's ordering, configs/ladder-ml-order-cpu.json rungs warm and two), the
    # joint model's checkpoint chosen by its heads' mean validation AUC (joint_metric; on ANN NDCG it kept its first
    # evaluation on a GPU, the heads barely trained: configs/ladder-ml-joint-gpu.json, rungs two-auc and two; on
    # Hit@3, which plateaus early, it stopped too soon on ml-latest-small: configs/ladder-mlsmall-order-cpu.json).
    # 5 minutes of training (each phase's), sized for one GPU.
    "seq-small": dict(
        variant="pinger", model_preset="gpu-base", retrieval_first="feedback", joint_metric="valid/rank/auc",
        model=dict(d_model=64, n_layers=2, n_heads=1, d_ff=64, item_dim=64, dropout=0.5, input_dropout=0.5,
                   id_embedding=True, item_content=True, positions="end", pos_init_std=0.02, user_head="identity",
                   input_proj=False, normalize=False, embed_init_std=0.02),
        objective=dict(item_loss="full", w_sid=4.0, w_item=1.0, w_action=0.2, w_action_feedback=5.0,
                       temperature=1.0),
        data=dict(context_len=50, valid_cases=5000, eval_beam=20, neg_sampling="neighbours",
                  neg_sampling_feedback="mixed"),
        train=dict(lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999), decay="constant", warmup_steps=0, grad_clip=0.0,
                   ema_decay=0.999, batch_size=256, bf16=True, device="auto", total_steps=200000, max_minutes=5,
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
    if sid_sizes is None:  # a dense model without SIDs: nothing to fuse into its item tokens
        kw["sid_fusion"] = False
    return ModelConfig.from_name(cfg.model_preset, **kw)


def init_and_freeze(objective: JointObjective, cfg: RunConfig) -> None:
    """``init_from``: load model weights (and the frequency sketch) from another run's checkpoint;
    ``freeze_item_encoder`` (implied by ``frozen-ft``): the item encoder gets no updates."""
    if cfg.variant == "frozen-ft" and not cfg.init_from:
        raise ConfigError("variant 'frozen-ft' needs init_from=<retrieval run's checkpoints folder>")
    if cfg.init_from:
        done = warm_start(objective, cfg.init_from)  # weights only; a catalogue that grew since is carried over
        if done["grown"]:
            print(f"[genrec.train] init_from {done['checkpoint']}: the catalogue grew since, so "
                  f"{', '.join(done['grown'])} kept the checkpoint's rows and initialised the new ones",
                  file=sys.stderr)
    if objective.cfg.w_dpo > 0:
        if not cfg.init_from:
            raise ConfigError("the DPO stage (objective.w_dpo > 0) needs init_from=<the checkpoint to tune>: it is "
                              "the frozen reference")
        objective.set_reference(copy.deepcopy(objective.model))
    if cfg.freeze_item_encoder or cfg.variant == "frozen-ft":
        for p in objective.model.item_encoder.parameters():
            p.requires_grad_(False)
