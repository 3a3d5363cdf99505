"""``genrec train``: one joint training run from a prepared run directory.

Reads the run's tables, item catalogue (features + current SIDs) and training split, builds the model
and the objective from a :class:`~genrec.train.run.RunConfig` (presets, ``key=value`` overrides,
variants: :mod:`genrec.train.run`), and runs the :class:`~genrec.train.trainer.Trainer`. Its periodic
validation -- retrieval metrics on the valid split, which early stopping and the ``BEST`` checkpoint
follow -- is :func:`genrec.eval.retrieval.evaluate_retrieval`, handed to the trainer as its ``eval_fn``
from here: ``genrec.train`` itself does not import ``genrec.eval``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.catalog import load_catalog, open_store
from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.data.store import catalog_config
from genrec.data.stream_index import stream_index
from genrec.decode.rows import leaf_rows as sid_leaf_rows
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError
from genrec.eval.ranking import SLATE_NEGATIVES, Slate, collect_slates, slate_scalars
from genrec.eval.retrieval import eval_cases, evaluate_retrieval
from genrec.model.genrec_model import GenRecModel
from genrec.sid.build import open_current
from genrec.train.batches import NEIGHBOURS, BatchStream, materialise, neighbour_table
from genrec.train.config import compile_kwargs, compile_mode_for_world
from genrec.train.distributed import DistInfo, broadcast_object, pick_device, process_group
from genrec.train.objective import JointObjective
from genrec.train.ray_engine import RayEngine
from genrec.train.run import RunConfig, build_model_config, check_features_split, init_and_freeze, variant_overrides
from genrec.train.stream import CollateOptions, EmbeddedEngine, StreamBatches, WindowPlan, WindowReader, row_counts
from genrec.train.trainer import Trainer
from genrec.workdir import WorkDir

__all__ = ["train_run"]


def train_run(workdir: str | Path, cfg: RunConfig, *, resume: bool = True, phase: str | None = None) -> dict[str, Any]:
    """Train one model in ``WORKDIR`` (checkpoints under ``WORKDIR/checkpoints``). ``phase`` names the run as one
    phase of several (:mod:`genrec.recipes.retrieval_first`): recorded in its checkpoints' config.

    Under ``torchrun --nproc-per-node W`` each of the W processes trains on its share of every global batch
    (``train.batch_size`` is global) through DDP, gloo on CPU and NCCL on CUDA: rank 0 writes the checkpoints
    and logs and runs the validation, whose metrics -- and so early stopping -- every rank shares. Every
    process returns the same summary; a process group this call set up is torn down before it returns."""
    pick_device(cfg.train.device)  # a missing CUDA device fails here, before the data is read
    with process_group(cfg.train.device) as dist_info:
        return _train(workdir, cfg, dist_info, resume=resume, phase=phase)


def _train(workdir: str | Path, cfg: RunConfig, dist_info: DistInfo, *, resume: bool,
           phase: str | None) -> dict[str, Any]:
    """:func:`train_run`'s run, in its process group (``dist_info``)."""
    wd = WorkDir(workdir)
    store = open_store(wd.root)
    info = store.info()
    mv, obj_cfg = variant_overrides(cfg)
    if (resolved := obj_cfg.for_actions(len(info.actions))) is not obj_cfg and dist_info.rank == 0:
        print(f"[genrec.train] the data logs {len(info.actions)} actions ({', '.join(info.actions)}): the action "
              f"loss weighs {resolved.w_action:g} (objective.w_action_feedback), not {obj_cfg.w_action:g}",
              file=sys.stderr)
    obj_cfg = resolved
    needs_sids = mv.get("layout", "pinger") in ("pinger", "tiger")
    if cfg.data.split not in ("loo", "temporal"):
        raise ConfigError(f"config key 'data.split': must be 'loo' or 'temporal', got {cfg.data.split!r}")
    check_features_split(wd, cfg.data.split)  # before anything is loaded: the fix is a features rebuild
    catalog = load_catalog(wd.root, with_sids=needs_sids or (wd.sid / "CURRENT").exists())
    sid_build = None
    sid_sizes = None
    if catalog.codes is not None:
        sid_build = open_current(wd.sid)
        sid_sizes = [int(k) for k in sid_build.codebook_sizes]
    split = SplitSpec(kind="temporal" if cfg.data.split == "temporal" else "loo")
    reader = BucketJoinReader(store, split=split, role="train", context_len=10 ** 9, seed=cfg.train.seed)
    # how often the training split shows each catalogue row: ID vectors only for rows it shows
    # (others would stay at their random init); popularity-sampled negatives weigh by it
    if cfg.data.stream:  # per-bucket counts only: each rank reads its own buckets while it trains
        index = stream_index(store, reader.split)
        n_train, counts = index.total, row_counts(index, catalog)
    else:
        examples = materialise(reader, catalog)
        n_train = len(examples)
        counts = np.bincount(np.concatenate([e.rows for e in examples]), minlength=len(catalog)) if examples \
            else np.zeros(len(catalog), dtype=np.int64)
    seen_ids = catalog.item_ids[counts > 0]
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
        world = dist_info.world_size
        mode = compile_mode_for_world(cfg.train.compile_mode, world)
        if mode != cfg.train.compile_mode:
            print(f"[genrec.train] train.compile_mode={cfg.train.compile_mode} -> {mode} under torchrun ({world} "
                  "processes): CUDA-graphed training is checked on one GPU only", file=sys.stderr)
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile_mode=mode))
        # in place: the state dict keeps its keys, checkpoints stay interchangeable
        model.compile(**compile_kwargs(mode))
        print(f"[genrec.train] train.compile=true (mode {mode}): the first steps of each batch shape compile the "
              "training forward (tens of seconds; train.compile=false runs eager)", file=sys.stderr)

    valid, kept, feedviews = eval_cases(
        list(BucketJoinReader(store, split=split, role="valid", context_len=cfg.data.context_len)), catalog,
        max_cases=cfg.data.valid_cases, seed=cfg.train.seed)
    # the validation cases' held-out slates, scored by the action heads where the run trains them (valid/rank/*)
    slates: list[Slate] = []
    if model.action_head is not None and obj_cfg.w_action > 0:
        slates, _ = collect_slates(kept, feedviews, catalog, context_len=cfg.data.context_len,
                                   negatives=SLATE_NEGATIVES)  # as genrec eval
    if len(valid) == 0:
        print("[genrec.train] warning: no validation cases (no user has a validation event in this split), so "
              "every valid/* metric below reads 0 and says nothing; early stopping and the BEST checkpoint follow "
              "them. Give users more events, or check the split.", file=sys.stderr)

    trie = leaf_rows = None
    if sid_build is not None:
        leaf_rows = sid_leaf_rows(sid_build.trie, catalog, strict=True)

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        nonlocal trie
        dev = next(m.parameters()).device
        if sid_build is not None and sid_sizes is not None and (trie is None or trie.device != dev):
            trie = TorchTrie.from_sid_trie(sid_build.trie, device=dev)
        # "sid-dense": the SID stage served by default where the model has a dense stage (the dense leaf)
        res = evaluate_retrieval(m, valid, paths=("ann", "sid", "sid-dense"), beam_width=cfg.data.eval_beam,
                                 context_len=cfg.data.context_len, trie=trie, leaf_rows=leaf_rows,
                                 dense_temperature=obj_cfg.temperature)
        out = {f"valid/{p}/{k}": v for p, r in res.items() for k, v in r.items() if k != "n"}
        if slates:
            ranked = slate_scalars(m, slates, info.actions, info.positive_actions)
            out.update({f"valid/{k}": v for k, v in ranked.items()})
        return out

    sampling = cfg.data.sampling_for(len(info.actions))
    by_feedback = sampling != cfg.data.neg_sampling
    key = "data.neg_sampling_feedback" if by_feedback else "data.neg_sampling"
    if by_feedback and obj_cfg.w_action > 0 and dist_info.rank == 0:
        print(f"[genrec.train] the data logs {len(info.actions)} actions: ranking candidates drawn {sampling} "
              f"(data.neg_sampling_feedback), not {cfg.data.neg_sampling}", file=sys.stderr)
    neg_weights = neg_table = neg_near = None
    if sampling == "popularity":
        neg_weights = counts.astype(np.float64) ** 0.75 if n_train else np.ones(len(catalog))
    elif sampling in ("neighbours", "mixed"):
        if catalog.n_engagement == 0:
            raise ConfigError(f"config key '{key}': {sampling!r} needs the items' engagement "
                              f"vectors (features in {wd.features} have none): rebuild them with `genrec features build`")
        neg_table = neighbour_table(catalog.feats[:, -catalog.n_engagement:].numpy(), NEIGHBOURS)
        neg_near = (cfg.data.neg_cands + 1) // 2 if sampling == "mixed" else None
    p_rank = cfg.data.p_rank if obj_cfg.w_action > 0 or obj_cfg.w_dpo > 0 else 0.0
    # the batches' settings, checked before anything trains; the streaming and in-memory inputs share them
    options = CollateOptions(
        context_len=cfg.data.context_len, n_actions=len(info.actions), p_rank=p_rank,
        max_cands=cfg.data.max_cands, neg_cands=cfg.data.neg_cands, n_catalog=len(catalog),
        neg_cdf=None if neg_weights is None else CollateOptions.negative_cdf(neg_weights, len(catalog)),
        pad_multiple=cfg.data.pad_multiple, fv_pick=cfg.data.fv_pick, rank_rows=cfg.data.rank_rows,
        neg_table=neg_table, neg_near=neg_near)
    engine: EmbeddedEngine | RayEngine | None = None
    if cfg.data.stream:
        engine = EmbeddedEngine(WindowReader(store, reader.split, catalog, seed=cfg.train.seed)) \
            if cfg.data.engine == "embedded" else \
            RayEngine(store.tables_dir, catalog_config(), reader.split, catalog.item_ids, seed=cfg.train.seed,
                      workers=cfg.data.ray_workers)

    def factory(spec: Any) -> Any:
        if engine is not None:
            plan = WindowPlan(index.examples, batch_size=cfg.train.batch_size, seed=spec.seed, rank=spec.rank,
                              world=spec.world_size, window_buckets=cfg.data.window_buckets)
            return StreamBatches(engine, plan, options).iter_from(spec.start_step)
        stream = BatchStream(examples, batch_size=cfg.train.batch_size, seed=spec.seed, rank=spec.rank,
                             world=spec.world_size, options=options)
        return stream.iter_from(spec.start_step)

    # what the run was trained on, recorded together in every checkpoint (and named by the server that serves it)
    extra = {"tables": store.tables_version, "tables_snapshots": store.snapshot_ids(),
             "sid_version": sid_build.version if sid_build else None, "init_from": cfg.init_from or None,
             "features": str(wd.features), "model_config": mcfg.to_dict(), "run_config": cfg.to_dict()}
    config_extra = {"run": cfg.to_dict(), "model": mcfg.to_dict(), **({"phase": phase} if phase else {})}
    # a loss weighed 0 leaves its head without gradients: DDP must look for such parameters (it fails at the second
    # step otherwise); the retrieval phase of retrieval_first (w_action 0) and ranking-only train so
    idle = [n for n, w, head in (("action", obj_cfg.w_action, model.action_head), ("sid", obj_cfg.w_sid, model.sid_heads),
                                  ("item", obj_cfg.w_item, model.user_head)) if w == 0 and head is not None]
    train_cfg = cfg.train
    if idle and dist_info.is_distributed and not train_cfg.find_unused_parameters:
        train_cfg = dataclasses.replace(train_cfg, find_unused_parameters=True)
        if dist_info.is_main:
            print(f"[genrec.train] the {', '.join(idle)} loss weighs 0: DDP looks for parameters without gradients "
                  "(train.find_unused_parameters)", file=sys.stderr)
    trainer = Trainer(objective, factory, train_cfg, wd, eval_fn=eval_fn, extra=extra, config_extra=config_extra,
                      dist_info=dist_info)
    with engine if engine is not None else contextlib.nullcontext():
        result = trainer.fit(resume=resume)
    final: dict[str, float] = {}
    if dist_info.is_main:  # (the weights are the same on every rank)
        with trainer.averaged():
            final = eval_fn(objective)  # the weights the last checkpoint serves
    final = broadcast_object(final, dist_info)
    return {"step": result.step, "best_step": result.best_step, "valid": final,
            "train_examples": n_train, "valid_cases": len(valid),
            "last_loss": result.last_step,
            "checkpoint": str(result.last_checkpoint) if result.last_checkpoint else None,
            **({"interrupted": result.interrupted} if result.interrupted else {}),
            **({"previous_run": str(result.archived)} if result.archived else {})}
