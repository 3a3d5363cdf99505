"""The read side of genrec's checkpoints: what inference needs to load a trained model from a run.

A checkpoint folder (``CKPT_ROOT/step-000123/``, layout in :mod:`genrec.train.checkpoint`, which writes
it) holds the served weights in ``model.safetensors`` (tied tensors stored once, their other names in the
metadata), the resolved config in ``config.json`` and ``meta.json`` (step, file list, format version);
``LATEST`` and ``BEST`` in the root name a folder. Here: finding a run's checkpoints, reading weights, and
:func:`load_checkpoint`, which loads the served weights into a :class:`~genrec.model.GenRecModel`.

Training saves the state of its objective (:class:`genrec.train.objective.JointObjective`), which holds the
model as its ``model`` submodule: the model's tensors are stored under ``model.``, beside the objective's
own training state (``sketch.*``, its item-frequency sketch). :func:`load_checkpoint` strips the prefix and
leaves the training state out; resuming training (optimizer, scheduler, RNG, the live weights of an
averaged model) is :mod:`genrec.train.checkpoint`'s, which builds on this module. Nothing is ever
unpickled: weights come through safetensors, the rest is JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from genrec.errors import GenrecError
from genrec.workdir import read_json

FORMAT_VERSION = 1
LATEST = "LATEST"
BEST = "BEST"
STEP_RE = re.compile(r"^step-(\d+)$")
MODEL_PREFIX = "model."
"""Where the training objective keeps the model: its state dict names the model's tensors ``model.<name>``."""
TRAINING_ONLY = ("sketch.",)
"""State the training objective saves beside the model that inference does not read (its count-min sketch)."""
SERVED_FILES = ("model.safetensors", "extra.json")
"""What inference reads of a checkpoint: a folder copied for serving may leave the training state out."""
REQUIRED_FILES = (*SERVED_FILES, "state.safetensors", "state.json")
"""What a resume reads: the served files and the optimizer / scheduler / RNG state."""

__all__ = ["BEST", "LATEST", "REQUIRED_FILES", "SERVED_FILES", "CheckpointError", "list_checkpoints", "load_checkpoint",
           "load_config_dict", "load_weights", "model_state", "open_checkpoint", "read_weights", "resolve_checkpoint"]


class CheckpointError(GenrecError):
    """A checkpoint is missing, incomplete, or does not fit the model/optimizer."""


def read_weights(path: str | Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a weights file written by :func:`genrec.train.checkpoint.save_weights`, every
    alias (a tied tensor stored once) under each of its names."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
        state = load_file(str(path), device=str(device))
    except Exception as e:  # a torn or foreign file
        raise CheckpointError(f"{path}: cannot read safetensors weights: {e}") from e
    for alias, canonical in json.loads(meta.get("aliases", "{}")).items():
        state[alias] = state[canonical]
    return state


def _load_state(model: nn.Module, state: Mapping[str, torch.Tensor], path: Path, strict: bool) -> None:
    try:
        model.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not fit {type(model).__name__}: {e}") from e


def load_weights(model: nn.Module, path: str | Path, *, strict: bool = True,
                 device: str | torch.device = "cpu") -> None:
    """Inverse of :func:`genrec.train.checkpoint.save_weights` (copies into the model's existing
    parameters, under the names they were saved with)."""
    _load_state(model, read_weights(path, device=device), Path(path), strict)


def model_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's own state out of a training objective's: ``model.<name>`` -> ``<name>``, the training-only
    entries (:data:`TRAINING_ONLY`) left out, anything else kept (so a strict load still names it)."""
    return {k.removeprefix(MODEL_PREFIX): v for k, v in state.items() if not k.startswith(TRAINING_ONLY)}


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete checkpoint under ``root``, by step."""
    root = Path(root)
    out = []
    if root.is_dir():
        for p in root.iterdir():
            m = STEP_RE.match(p.name)
            if m and p.is_dir() and (p / "meta.json").exists():
                out.append((int(m.group(1)), p))
    return sorted(out)


def read_pointer(root: Path, which: str) -> Path | None:
    """The folder ``root/LATEST`` (or ``BEST``) names; None when the pointer file is absent."""
    p = root / which
    if not p.exists():
        return None
    name = p.read_text().strip()
    if not STEP_RE.match(name):
        raise CheckpointError(f"{p}: does not name a checkpoint folder: {name!r}")
    return root / name


def resolve_checkpoint(path: str | Path, which: str = LATEST) -> Path | None:
    """The checkpoint folder for ``path``: a checkpoint itself, or a root holding ``LATEST``/``BEST``.

    Returns None when ``path`` is a root with no checkpoint yet; raises when the pointer is dangling.
    """
    path = Path(path)
    if (path / "meta.json").exists():
        return path
    if not path.exists():
        return None
    ptr = read_pointer(path, which)
    if ptr is None:
        return None
    if not (ptr / "meta.json").exists():
        raise CheckpointError(f"{path / which} points at {ptr.name}, which is missing or incomplete")
    return ptr


def read_file(path: Path, read: Callable[[Path], Any]) -> Any:
    """``read(path)``, with a torn or foreign file reported as a :class:`CheckpointError` naming it."""
    try:
        return read(path)
    except (OSError, ValueError, SafetensorError) as e:  # json.JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e


def open_checkpoint(path: str | Path, which: str = LATEST, *, required: tuple[str, ...] = SERVED_FILES) -> Path:
    """The checkpoint folder for ``path`` (as :func:`resolve_checkpoint`): its ``meta.json`` in a known format and
    the ``required`` files present (default: what inference reads; a resume asks for ``REQUIRED_FILES``), else a
    :class:`CheckpointError` naming what is not."""
    ckpt = resolve_checkpoint(path, which)
    if ckpt is None:
        raise CheckpointError(f"no checkpoint at {path} (no {which} file and no meta.json)")
    meta = read_file(ckpt / "meta.json", read_json)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        fmt = meta.get("format") if isinstance(meta, dict) else meta
        raise CheckpointError(f"{ckpt / 'meta.json'}: unsupported checkpoint format {fmt!r}")
    for f in required:
        if not (ckpt / f).exists():
            what = "" if f in SERVED_FILES else " for resuming training (serving does not need it)"
            raise CheckpointError(f"{ckpt / f} is missing: the checkpoint is incomplete{what}")
    return ckpt


def load_checkpoint(path: str | Path, model: nn.Module, *, which: str = LATEST, strict: bool = True,
                    device: str | torch.device = "cpu") -> dict[str, Any]:
    """Load the served weights of a checkpoint folder (or a root's ``LATEST``/``BEST``) into ``model``, a
    :class:`~genrec.model.GenRecModel` (:func:`model_state`: the objective's prefix stripped, its training
    state left out); returns the saved ``extra`` dict."""
    ckpt = open_checkpoint(path, which)
    weights = ckpt / "model.safetensors"
    _load_state(model, model_state(read_weights(weights, device=device)), weights, strict)
    return dict(read_file(ckpt / "extra.json", read_json))


def load_config_dict(path: str | Path) -> dict[str, Any] | None:
    """The ``config.json`` saved with a checkpoint (None if it was saved without one)."""
    ckpt = resolve_checkpoint(path)
    if ckpt is None or not (ckpt / "config.json").exists():
        return None
    return read_file(ckpt / "config.json", read_json)  # type: ignore[no-any-return]
