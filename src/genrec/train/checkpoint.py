"""Crash-safe, pickle-free checkpoints: safetensors for tensors, JSON for everything else.

Layout of one checkpoint (``CKPT_ROOT/step-000123/``)::

    model.safetensors   model weights; tied tensors stored once, their other names in the metadata
    train_model.safetensors  only when the served weights are not the trained ones (an EMA of them):
                        the live weights training resumes from
    state.safetensors   optimizer + scheduler tensors and RNG states, flattened to "optim/...", "rng/..."
    state.json          the non-tensor skeleton of that state (tensors replaced by references)
    extra.json          caller's extra (e.g. SID / feature versions, trainer counters)
    config.json         resolved config (if given)
    meta.json           step, file list, format version

Non-standard: nested optimizer/scheduler state is encoded exactly (int dict keys, tuples,
inf/nan) by a tagged JSON skeleton plus a flat tensor file, so nothing is ever pickled and
``torch.load`` is never called. The folder is written under a temp name and renamed
(:func:`genrec.workdir.atomic_dir`); only then is ``LATEST`` rewritten atomically, so a kill at
any moment leaves the previous checkpoint loadable and ``LATEST`` pointing at it. A checkpoint
damaged afterwards (a disk error, a torn copy) raises :class:`CheckpointError` naming the file;
:func:`resume_candidates` lists the older ones a resume falls back to, and :func:`set_aside`
renames a damaged folder out of the way (``step-000300.damaged``) without deleting anything.

This module is the training side: writing, pruning, resuming. Reading a checkpoint's served weights
-- what inference needs -- is :mod:`genrec.model.checkpoint_io`, whose names this module uses and
re-exports (``CheckpointError``, ``LATEST``, ``BEST``, ``resolve_checkpoint``, ...).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from genrec.model.checkpoint_io import (
    BEST,
    FORMAT_VERSION,
    LATEST,
    REQUIRED_FILES,
    STEP_RE,
    CheckpointError,
    list_checkpoints,
    load_config_dict,
    load_weights,
    open_checkpoint,
    read_file,
    read_pointer,
    resolve_checkpoint,
)
from genrec.workdir import atomic_dir, atomic_write_bytes, atomic_write_json, clean_stale_tmp, read_json

TRAIN_WEIGHTS = "train_model.safetensors"

__all__ = ["BEST", "LATEST", "TRAIN_WEIGHTS", "CheckpointError", "checkpoint_step", "list_checkpoints",
           "load_checkpoint", "load_config_dict", "load_train_weights", "load_weights", "resolve_checkpoint",
           "resume_candidates", "save_checkpoint", "save_weights", "set_aside"]


def step_dirname(step: int) -> str:
    return f"step-{step:06d}"


# ---------------------------------------------------------------------------- flatten / unflatten

def flatten_state(obj: Any, tensors: dict[str, torch.Tensor], prefix: str) -> Any:
    """JSON skeleton of ``obj`` with every tensor moved into ``tensors`` under a unique key."""
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}#{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"{prefix}#{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).astype(np.int64 if obj.dtype.kind in "iub"
                                                                         else np.float64))
        return {"__ndarray__": key, "dtype": obj.dtype.str}
    if isinstance(obj, dict):
        return {"__dict__": [[flatten_state(k, tensors, prefix), flatten_state(v, tensors, prefix)]
                             for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten_state(v, tensors, prefix) for v in obj]}
    if isinstance(obj, list):
        return [flatten_state(v, tensors, prefix) for v in obj]
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            return {"__float__": repr(obj)}
        return obj
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return flatten_state(obj.item(), tensors, prefix)
    raise CheckpointError(f"cannot store a {type(obj).__name__} in a checkpoint without pickle (at {prefix!r})")


def unflatten_state(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy().astype(np.dtype(obj["dtype"]))
        if "__dict__" in obj:
            return {unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(unflatten_state(v, tensors) for v in obj["__tuple__"])
        if "__float__" in obj:
            return float(obj["__float__"])
        raise CheckpointError(f"unknown tagged object in checkpoint state: {sorted(obj)}")
    return obj


# ---------------------------------------------------------------------------- RNG

def get_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


# ---------------------------------------------------------------------------- save / load

def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model


def save_weights(model: nn.Module, path: str | Path, metadata: Mapping[str, str] | None = None) -> None:
    """``model.state_dict()`` to safetensors. Exact aliases (tied weights) are stored once and
    listed in the metadata; partial views of one storage (e.g. cuDNN's flattened RNN weights)
    are copied apart, which ``safetensors.torch.save_model`` refuses to do."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, t in model.state_dict().items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
               t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().to("cpu", copy=True).contiguous()  # own storage per tensor
    meta = {**dict(metadata or {}), "aliases": json.dumps(aliases, sort_keys=True)}
    save_file(tensors, str(path), metadata=meta)


def save_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    extra: Mapping[str, Any] | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    keep_last: int = 3,
    save_rng: bool = True,
    mark_best: bool = False,
    served: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> Path:
    """Write ``root/step-{step:06d}`` atomically, point ``LATEST`` (and ``BEST`` if asked) at it,
    and delete older ``step-*`` folders beyond the last ``keep_last`` (never the ``BEST`` one).

    ``served``: a context in which ``model`` holds the weights to serve and evaluate (e.g.
    ``WeightAverage.swapped``); they go to ``model.safetensors`` and the live weights, which
    training resumes from, to ``train_model.safetensors``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(root)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    name = step_dirname(step)
    tensors: dict[str, torch.Tensor] = {}
    skeleton: dict[str, Any] = {}
    if optimizer is not None:
        skeleton["optimizer"] = flatten_state(optimizer.state_dict(), tensors, "optim")
    if scheduler is not None:
        skeleton["scheduler"] = flatten_state(scheduler.state_dict(), tensors, "sched")
    if save_rng:
        skeleton["rng"] = flatten_state(get_rng_state(), tensors, "rng")
    extra_skel = flatten_state(dict(extra or {}), {}, "extra")  # validates: extra must be JSON-able
    del extra_skel
    with atomic_dir(root / name, overwrite=True) as tmp:
        weights_meta = {"step": str(step)}
        if served is not None:  # the live weights first, then the served ones in their place
            save_weights(_unwrap(model), tmp / TRAIN_WEIGHTS, metadata=weights_meta)
        with (served or contextlib.nullcontext)():
            save_weights(_unwrap(model), tmp / "model.safetensors", metadata=weights_meta)
        save_file(tensors, str(tmp / "state.safetensors"))
        atomic_write_json(tmp / "state.json", skeleton)
        atomic_write_json(tmp / "extra.json", dict(extra or {}))
        if config is not None:
            atomic_write_json(tmp / "config.json", dict(config))
        atomic_write_json(tmp / "meta.json", {"format": FORMAT_VERSION, "step": step,
                                              "files": sorted(p.name for p in tmp.iterdir()) + ["meta.json"]})
    atomic_write_bytes(root / LATEST, (name + "\n").encode())
    if mark_best:
        atomic_write_bytes(root / BEST, (name + "\n").encode())
    _prune(root, keep_last)
    return root / name


def _prune(root: Path, keep_last: int) -> None:
    keep = {p for _, p in list_checkpoints(root)[-keep_last:]}
    for which in (LATEST, BEST):
        ptr = read_pointer(root, which)
        if ptr is not None:
            keep.add(ptr)
    for _, p in list_checkpoints(root):
        if p not in keep:
            shutil.rmtree(p, ignore_errors=True)


def checkpoint_step(path: str | Path) -> int:
    ckpt = resolve_checkpoint(path)
    if ckpt is None:
        raise CheckpointError(f"no checkpoint at {path}")
    return int(read_json(ckpt / "meta.json")["step"])


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    *,
    which: str = LATEST,
    restore_rng: bool = True,
    strict: bool = True,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Load weights (and optimizer/scheduler/RNG state when given) from a checkpoint folder or a
    root's ``LATEST``/``BEST``; returns the saved ``extra`` dict. The weights load under the names they
    were saved with (the training objective's: resume, ``init_from``); a bare model for inference loads
    through :func:`genrec.model.checkpoint_io.load_checkpoint`."""
    ckpt = open_checkpoint(path, which, required=REQUIRED_FILES)
    load_weights(_unwrap(model), ckpt / "model.safetensors", strict=strict, device=device)
    tensors = read_file(ckpt / "state.safetensors", lambda p: load_file(str(p), device="cpu"))
    skeleton = read_file(ckpt / "state.json", read_json)
    try:
        if optimizer is not None:
            if "optimizer" not in skeleton:
                raise CheckpointError(f"{ckpt} has no optimizer state")
            optimizer.load_state_dict(unflatten_state(skeleton["optimizer"], tensors))
        if scheduler is not None:
            if "scheduler" not in skeleton:
                raise CheckpointError(f"{ckpt} has no scheduler state")
            scheduler.load_state_dict(unflatten_state(skeleton["scheduler"], tensors))
        if restore_rng and "rng" in skeleton:
            set_rng_state(unflatten_state(skeleton["rng"], tensors))
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:  # a skeleton that does not fit its tensors
        raise CheckpointError(f"{ckpt / 'state.json'} does not match {ckpt / 'state.safetensors'} or this "
                              f"optimizer: {type(e).__name__}: {e}") from e
    return dict(read_file(ckpt / "extra.json", read_json))


def resume_candidates(root: str | Path) -> list[Path]:
    """The checkpoints a resume tries, in order: ``LATEST``'s, then every older complete one, newest
    first. A ``LATEST`` that names a missing folder is passed over (the rest are still tried)."""
    root = Path(root)
    try:
        latest = resolve_checkpoint(root, LATEST)
    except CheckpointError:
        latest = None
    if latest is None:
        return [p for _, p in reversed(list_checkpoints(root))]
    m = STEP_RE.match(latest.name)
    below = int(m.group(1)) if m else -1
    return [latest] + [p for s, p in reversed(list_checkpoints(root)) if s < below]


def set_aside(ckpt: Path, latest: Path | None = None) -> Path:
    """Rename a damaged checkpoint folder to ``NAME.damaged`` (``.damaged-2``, ... if taken): it is no
    longer listed, pruned, resumed or served, and nothing in it is deleted. ``LATEST`` is pointed at
    ``latest`` when given; a ``BEST`` that named the folder is removed (the next better evaluation marks
    one again). Returns the new path."""
    ckpt = Path(ckpt)
    root = ckpt.parent
    dest = root / f"{ckpt.name}.damaged"
    n = 2
    while dest.exists():
        dest, n = root / f"{ckpt.name}.damaged-{n}", n + 1
    best = root / BEST
    if best.exists() and best.read_text().strip() == ckpt.name:
        best.unlink()
    os.replace(ckpt, dest)
    if latest is not None:
        atomic_write_bytes(root / LATEST, (latest.name + "\n").encode())
    return dest


def load_train_weights(ckpt: str | Path, model: nn.Module, *, device: str | torch.device = "cpu") -> bool:
    """Load a checkpoint folder's live training weights (``train_model.safetensors``) into ``model``
    if it has them (it was saved with ``served``); False when the served weights are the trained ones."""
    path = Path(ckpt) / TRAIN_WEIGHTS
    if not path.exists():
        if TRAIN_WEIGHTS in read_json(Path(ckpt) / "meta.json").get("files", []):
            raise CheckpointError(f"{path} is missing: the checkpoint was saved with it (an averaged model), "
                                  f"so training cannot resume from its live weights")
        return False
    load_weights(_unwrap(model), path, device=device)
    return True
