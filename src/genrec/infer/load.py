"""Loading a trained run for inference: which checkpoint, its model and catalogue, the current SIDs (the
device trie and the leaves' catalogue rows), the ANN index cached per checkpoint, and the CUDA-graph mode.

Weights are read through :mod:`genrec.model.checkpoint_io` (never the training objective); a damaged file
names itself and the run's other checkpoints. The ANN index is built once per (weights, features, index
kind) and cached atomically under ``WORKDIR/ann/``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.catalog import ItemCatalog, load_catalog
from genrec.data.store import TableStore
from genrec.decode.rows import leaf_rows as sid_leaf_rows
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError, DataError
from genrec.infer.ann import AnnConfig, AnnIndex
from genrec.infer.catalog_model import CatalogModel
from genrec.model.checkpoint_io import (
    BEST,
    LATEST,
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
)
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.sid.build import SidBuild, open_current, open_version
from genrec.workdir import WorkDir, file_digest, read_json


def graph_mode(device: torch.device) -> str:
    """Which serving stages replay CUDA graphs: "off" on a CPU; else ``GENREC_CUDA_GRAPHS``:
    "all" (default, also "1": the history encode, the SID decode and the ranking decode), "sid"
    (the SID decode only) or "off" ("0")."""
    if device.type != "cuda":
        return "off"
    raw = os.environ.get("GENREC_CUDA_GRAPHS", "all").strip().lower()
    mode = {"1": "all", "0": "off", "": "all"}.get(raw, raw)
    if mode not in ("off", "sid", "all"):
        raise ConfigError(f"GENREC_CUDA_GRAPHS: expected off, sid or all (or 0/1), got {raw!r}")
    return mode


CHECKPOINT_RULE = ("best, last (or latest), a step number (120), a folder name under WORKDIR/checkpoints "
                   "(step-000120), or a path to a checkpoint folder (or to a checkpoints folder: its last)")
"""What a ``--checkpoint`` value may be, for every command (:func:`find_checkpoint` applies it; the CLI's
help, ``genrec.cli._app.CHECKPOINT``, says the same). Names are looked up before paths."""

_MARKS = {"best": BEST, "last": LATEST, "latest": LATEST}


def checkpoint_mark(checkpoint: str | Path | None) -> str | None:
    """``BEST`` / ``LATEST`` when ``checkpoint`` names a marker (best, last, latest: any case), else None."""
    return None if checkpoint is None else _MARKS.get(str(checkpoint).strip().lower())


def checkpoint_names(workdir: str | Path) -> list[str]:
    """The names WORKDIR's checkpoints answer to, for messages: ``best -> step-000120`` and ``last -> ...`` where
    marked, then every complete checkpoint folder with its step number."""
    root = WorkDir(workdir).checkpoints
    out = []
    for word, mark in (("best", BEST), ("last", LATEST)):
        try:
            p = resolve_checkpoint(root, mark) if (root / mark).exists() else None
        except CheckpointError:
            p = None
        if p is not None:
            out.append(f"{word} -> {p.name}")
    out += [f"{p.name} (or {step})" for step, p in list_checkpoints(root)]
    return out


def find_checkpoint(workdir: str | Path, checkpoint: str | Path | None = None) -> Path:
    """The checkpoint folder a command loads, by the one rule every ``--checkpoint`` follows
    (:data:`CHECKPOINT_RULE`): None = BEST if marked, else LATEST; ``best`` / ``last`` / ``latest`` (any
    case); a step number or a folder name under ``WORKDIR/checkpoints``; else a path to a checkpoint
    folder, or to a checkpoints folder (its LATEST). Anything else is a :class:`ConfigError` listing the
    names this run's checkpoints answer to."""
    wd = WorkDir(workdir)
    if checkpoint is None:
        ckpt = next((c for m in (BEST, LATEST) if (c := resolve_checkpoint(wd.checkpoints, m)) is not None), None)
        if ckpt is None:
            raise ConfigError(f"no checkpoint under {wd.checkpoints}: run `genrec train {wd.root}` first")
        return ckpt
    text = str(checkpoint).strip()
    mark = checkpoint_mark(text)
    if mark is not None:
        ckpt = resolve_checkpoint(wd.checkpoints, mark)
    elif text.isdigit():
        ckpt = next((p for step, p in list_checkpoints(wd.checkpoints) if step == int(text)), None)
    elif text and "/" not in text and "\\" not in text and text not in (".", "..") and (wd.checkpoints / text).is_dir():
        ckpt = resolve_checkpoint(wd.checkpoints / text)
    else:
        ckpt = resolve_checkpoint(Path(text)) if text else None
    if ckpt is None:
        names = checkpoint_names(wd.root)
        have = (f"this run's checkpoints: {', '.join(names)}" if names
                else f"{wd.checkpoints} holds no checkpoint yet (run `genrec train {wd.root}`)")
        raise ConfigError(f"--checkpoint {text!r}: neither a name of a checkpoint of {wd.root} nor a path to a "
                          f"checkpoint folder; {have}. --checkpoint takes {CHECKPOINT_RULE}")
    return ckpt


def dataset_vocab(wd: WorkDir, mcfg: ModelConfig) -> tuple[list[str], list[str], list[str]]:
    """(actions, positive actions, surfaces) from the tables; generic names when the tables are gone."""
    store = TableStore(wd.tables)
    if store.exists():
        info = store.info()
        if len(info.actions) != mcfg.n_actions:
            raise ConfigError(f"{wd.tables}: {len(info.actions)} actions, the model has {mcfg.n_actions}")
        surfaces = list(info.surfaces) or ["default"]
        return list(info.actions), list(info.positive_actions), surfaces
    acts = [f"action{i}" for i in range(mcfg.n_actions)]
    return acts, acts, [f"surface{i}" for i in range(mcfg.n_surfaces)]


def fingerprint(paths: Sequence[Path], first: str | None = None) -> str:
    """A short fingerprint of the files' contents (missing files are skipped); ``first``: the digest of a
    file read earlier, taken as the first file's (``fingerprint([a, b]) == fingerprint([b], first=file_digest(a))``)."""
    h = hashlib.sha256()
    if first is not None:
        h.update(first.encode())
    for p in paths:
        if p.exists():
            h.update(file_digest(p).encode())
    return h.hexdigest()[:10]


def resolve_precision(precision: str | None) -> str:
    """"float32" or "bf16": ``precision``, else ``$GENREC_PRECISION``, else float32."""
    prec = precision or os.environ.get("GENREC_PRECISION") or "float32"
    if prec not in ("float32", "bf16"):
        raise ConfigError(f"precision must be 'float32' or 'bf16' (argument or GENREC_PRECISION), got {prec!r}")
    return prec


SID_MODES = ("auto", "full", "prefix", "merged", "dense")


def resolve_sid_mode(mode: str | None) -> str:
    """The SID stage's retrieval: ``mode``, else ``$GENREC_SID_MODE``, else "auto". "full": full-code beams;
    "prefix" / "merged": the coarse-prefix retrieval (:mod:`genrec.decode.prefix`), items beam by beam or all by
    score; "dense": the same beams over the semantic levels, the item inside each prefix by the softmax of its
    dense score (the request's user vector against the item's, at the trained temperature), all by score;
    "auto": "merged" while the catalogue holds items the model has no trained logit for (added by
    `genrec sid assign` since training), else "dense" where the model has a dense stage, else "full"."""
    m = (mode or os.environ.get("GENREC_SID_MODE") or "auto").strip().lower()
    if m not in SID_MODES:
        raise ConfigError(f"sid_mode must be one of {', '.join(SID_MODES)} (argument or GENREC_SID_MODE), got {m!r}")
    return m


@dataclass
class LoadedRun:
    """What :func:`open_run` read of a run directory, for the Recommender to hold."""

    workdir: WorkDir
    checkpoint: Path
    run_config: dict[str, Any] | None
    catalog_model: CatalogModel
    catalog: ItemCatalog
    actions: list[str]
    positive_actions: list[str]
    surfaces: list[str]
    step: int
    weights_digest: str | None  # sha256 of model.safetensors as loaded
    trie: TorchTrie | None  # the current SIDs on the device (layouts with a SID decoding stage)
    leaf_rows: np.ndarray | None  # catalogue row of each leaf of that trie
    sid_index: Any
    sid_version: str | None
    known: np.ndarray | None = None  # per leaf: the model has a trained last-level logit for it (known_leaves)


def trained_temperature(run_config: dict[str, Any] | None) -> float:
    """The item softmax's temperature a run trained with (``objective.temperature`` of its stored configuration;
    1.0 when absent): the scale of its dense scores, for the SID stage's dense leaf rule ("dense")."""
    return float(((run_config or {}).get("objective") or {}).get("temperature", 1.0))


def read_run_config(ckpt: Path, checkpoints_dir: Path | None = None) -> dict[str, Any]:
    """The run configuration a checkpoint was trained with: its ``config.json``, else the one in
    ``checkpoints_dir`` (the run's checkpoints folder; default: the checkpoint's parent)."""
    cfg_path = ckpt / "config.json"
    if not cfg_path.exists():
        cfg_path = (checkpoints_dir if checkpoints_dir is not None else ckpt.parent) / "config.json"
    if not cfg_path.exists():
        raise ConfigError(f"{ckpt}: no config.json beside the weights; cannot rebuild the model")
    cfg = read_json(cfg_path)
    if "model" not in cfg:
        raise DataError("missing key 'model'", path=cfg_path, field="model")
    return cfg


def load_model(ckpt: Path, mcfg: ModelConfig | None = None) -> tuple[GenRecModel, str | None]:
    """The model of checkpoint folder ``ckpt`` on the CPU (``mcfg``: its configuration, default read by
    :func:`read_run_config`), and the sha256 of its ``model.safetensors`` as loaded. A damaged file names
    itself and the run's other checkpoints."""
    if mcfg is None:
        mcfg = ModelConfig.from_dict(read_run_config(ckpt)["model"])
    model = GenRecModel(mcfg)
    weights = ckpt / "model.safetensors"
    digest = file_digest(weights) if weights.exists() else None
    try:  # the model's weights out of the training objective's state (genrec.model.checkpoint_io)
        load_checkpoint(ckpt, model, device="cpu")
    except CheckpointError as e:  # a damaged file: name it, and the run's checkpoints that could serve instead
        others = [p for _, p in reversed(list_checkpoints(ckpt.parent)) if p != ckpt]
        hint = (f"other checkpoints of this run, newest first: {', '.join(p.name for p in others)} "
                f"(e.g. --checkpoint {others[0]})") if others else "the run has no other checkpoint"
        raise CheckpointError(f"{e}; {hint}") from e
    if digest is not None and file_digest(weights) != digest:  # (remembered per size + mtime: no re-hash)
        raise ConfigError(f"{weights}: replaced while it was being loaded; load again")
    return model, digest


def open_run(workdir: str | Path, checkpoint: str | Path | None = None,
             device: str | torch.device = "cpu") -> LoadedRun:
    """WORKDIR's model (``checkpoint`` as :func:`find_checkpoint`) on ``device`` with its catalogue, and the
    current SIDs (trie on ``device``)."""
    wd = WorkDir(workdir)
    ckpt = find_checkpoint(wd.root, checkpoint)
    cfg = read_run_config(ckpt, wd.checkpoints)
    mcfg = ModelConfig.from_dict(cfg["model"])
    catalog = load_catalog(wd.root, with_sids=mcfg.uses_sids)
    if int(catalog.feats.shape[1]) != mcfg.item_feat_dim:
        raise ConfigError(f"{wd.features}: item features have width {int(catalog.feats.shape[1])}, the model "
                          f"was trained on {mcfg.item_feat_dim} (features rebuilt since training?)")
    actions, positive, surfaces = dataset_vocab(wd, mcfg)
    model, digest = load_model(ckpt, mcfg)
    held = CatalogModel(model, catalog).to(device)
    step = int(read_json(ckpt / "meta.json")["step"])
    trie = sid_index = leaf_rows = known = None
    sid_version: str | None = None
    if mcfg.uses_sids:
        sb = open_current(wd.sid)
        sizes = [int(k) for k in sb.codebook_sizes]
        want = list(mcfg.sid_codebook_sizes)
        # `genrec sid assign` may grow the last (disambiguation) level past the model's head: its new codes
        # are served through the coarse-prefix retrieval (genrec.decode.prefix); the semantic levels must match
        if len(sizes) != len(want) or sizes[:-1] != want[:-1] or sizes[-1] < want[-1]:
            raise ConfigError(f"{wd.sid}: current SID version {sb.version} has codebooks {sizes}, the model was "
                              f"trained with {want}; retrain or point CURRENT back")
        sid_index, sid_version = sb.index, sb.version
        if mcfg.layout in ("pinger", "tiger"):  # SID heads -> a decoding stage (dense + fusion has none)
            trie = TorchTrie.from_sid_trie(sb.trie, device=device)
            leaf_rows = sid_leaf_rows(sb.trie, catalog)
            known = known_leaves(wd, ckpt, sb, want[-1])
    return LoadedRun(wd, ckpt, cfg.get("run"), held, catalog, actions, positive, surfaces, step, digest, trie,
                     leaf_rows, sid_index, sid_version, known)


def known_leaves(wd: WorkDir, ckpt: Path, sb: SidBuild, head: int) -> np.ndarray:
    """bool [n_L] per leaf of ``sb``'s trie: does the model have a trained last-level logit for it -- its final
    code inside the model's head (``head`` codes) and the item, with this very code, in the SID version the
    checkpoint was trained on (``extra.json``'s ``sid_version``). Items `genrec sid assign` added since are not
    known: the model never saw a positive for their code under their prefix. When the training version is not
    recorded or was pruned, every code inside the head counts as known."""
    items = np.asarray(sb.trie.leaf_items, dtype=np.int64)
    final = np.asarray(sb.index.codes_of(items), dtype=np.int64)  # [n_L, L]
    known = final[:, -1] < head
    extra = ckpt / "extra.json"
    trained = read_json(extra).get("sid_version") if extra.exists() else None
    if not trained or trained == sb.version or not (wd.sid / str(trained) / "manifest.json").exists():
        return known
    tv = open_version(wd.sid, str(trained))
    had = tv.index.contains(items)
    same = np.zeros(len(items), dtype=bool)
    if had.any():
        same[had] = (np.asarray(tv.index.codes_of(items[had]), dtype=np.int64) == final[had]).all(1)
    return known & same


def load_or_build_ann(wd: WorkDir, ckpt: Path, cfg: AnnConfig, *, step: int, fp: str | None,
                      item_vecs: torch.Tensor, catalog: ItemCatalog) -> AnnIndex:
    """``WORKDIR/ann/step-NNNNNN-<hash of weights + features + index kind>``, built atomically once
    (``fp``: the run's fingerprint, None: hashed from the files now). A cached index is used only while it holds
    ``item_vecs`` for the catalogue's items (rebuilt when items were added, or their vectors are made otherwise
    than when it was built: items `genrec sid assign` added get imputed engagement and ID vectors)."""
    fp = fp or fingerprint([ckpt / "model.safetensors", wd.features / "manifest.json"])
    folder = wd.root / "ann" / f"step-{step:06d}-{cfg.kind}-{fp}"
    vecs = item_vecs.float().cpu().numpy()
    if (folder / "manifest.json").exists():
        idx = AnnIndex.load(folder)
        if (len(idx) == len(catalog) and np.array_equal(idx.item_ids, catalog.item_ids)
                and np.allclose(idx.vectors(), vecs, rtol=0, atol=1e-4)):
            return idx
    idx = AnnIndex.build(vecs, catalog.item_ids, cfg)
    idx.save(folder, overwrite=True)
    return idx
