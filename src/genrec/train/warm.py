"""Warm start (``init_from``): a new run's weights loaded from an earlier run's checkpoint, across a catalogue
that grew in between.

The daily cycle (``genrec data append`` -> ``genrec sid assign`` -> ``genrec train --init-from``) changes two
things the model is sized by, and nothing else:

* **the last SID level's codebook** can grow when new items are coded with the frozen codebooks
  (:func:`genrec.sid.build.assign_sids`: old codes never change, a new item takes the next free code of its
  prefix). Every tensor sized by a codebook (the level's embedding table, its head's rows) is copied into the
  leading rows of the bigger one; the new codes' rows keep their fresh initialisation.
* **the learned ID vectors** (``model.id_embedding``): one row per item id the training split shows, keyed
  by the sorted ``id_keys``. The new run's keys are its own (the new data's ids); each key the checkpoint also
  has gets the checkpoint's vector, whatever its row was there.

A tensor whose shape differs in any other way -- a width, a layer count, another number of SID levels -- is
refused, naming it: those weights mean nothing in the other model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from genrec.model.checkpoint_io import CheckpointError, open_checkpoint, read_file, read_weights
from genrec.workdir import read_json

__all__ = ["grown_sizes", "warm_start"]


def _model_config(ckpt: Path) -> dict[str, Any] | None:
    path = ckpt / "config.json"
    if not path.exists():
        return None
    cfg = read_file(path, read_json)
    return cfg.get("model") if isinstance(cfg, dict) else None


def grown_sizes(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> set[tuple[int, int]]:
    """The ``(old, new)`` lengths a tensor dimension may grow by between checkpoint config ``saved`` and the run's
    ``now``: a SID level's codebook that grew (same number of levels), and the number of learned ID vectors."""
    if not saved or not now:
        return set()
    pairs: set[tuple[int, int]] = set()
    old, new = saved.get("sid_codebook_sizes") or [], now.get("sid_codebook_sizes") or []
    if len(old) == len(new):
        pairs |= {(int(a), int(b)) for a, b in zip(old, new) if b > a}
    a, b = int(saved.get("item_id_vocab") or 0), int(now.get("item_id_vocab") or 0)
    if 0 < a < b:
        pairs.add((a, b))
    return pairs


def _grow(src: torch.Tensor, into: torch.Tensor, key: str, ckpt: Path, pairs: set[tuple[int, int]]) -> torch.Tensor:
    """``src`` copied into the leading part of a copy of ``into``: every dimension that differs must be one the
    catalogue's growth explains (``pairs``), else the checkpoint is another model (a CheckpointError)."""
    if src.dim() != into.dim() or any(a != b and (a, b) not in pairs for a, b in zip(src.shape, into.shape)):
        why = ("codebooks and ID vectors grew by " + ", ".join(f"{a}->{b}" for a, b in sorted(pairs))) if pairs \
            else "the catalogue did not grow"
        raise CheckpointError(f"init_from={ckpt}: {key} has shape {tuple(src.shape)}, this run's "
                              f"{tuple(into.shape)}, which the catalogue's growth does not explain ({why}): the "
                              f"checkpoint is another model (width, layers, SID levels?); train with its model "
                              f"settings, or from scratch")
    out = into.detach().clone()
    out[tuple(slice(0, n) for n in src.shape)] = src.to(out.dtype)
    return out


def _remap_ids(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> set[str]:
    """Learned ID vectors moved to the run's own ``id_keys`` rows (matched by item id); returns the keys done."""
    done: set[str] = set()
    for key in own:
        if not key.endswith("id_keys") or key not in state:
            continue
        emb = key[: -len("id_keys")] + "id_emb.weight"
        if emb not in own or emb not in state:
            continue
        old_keys, old_w = state[key].to(torch.int64), state[emb]
        if old_keys.numel() == 0:
            continue
        new_keys, w = own[key].to(torch.int64), own[emb].detach().clone()
        big = torch.iinfo(torch.int64).max
        s = torch.searchsorted(old_keys, new_keys).clamp(max=old_keys.numel() - 1)  # old_keys sorted ascending
        hit = (old_keys[s] == new_keys) & (new_keys != big)  # [V_new]
        w[hit] = old_w[s[hit]].to(w.dtype)
        state[key], state[emb] = own[key], w
        done |= {key, emb}
    return done


def warm_start(objective: nn.Module, init_from: str | Path) -> dict[str, Any]:
    """Load checkpoint ``init_from`` (a checkpoint folder, or a checkpoints folder: its LATEST) into the
    training objective ``objective`` (its ``model`` submodule built for the new run, ID keys set), growing the
    tensors the catalogue's growth made bigger (the module docstring). Returns what was done: the checkpoint,
    the tensors grown and the ID tensors matched by item id."""
    ckpt = open_checkpoint(init_from)
    state = read_weights(ckpt / "model.safetensors")
    model: Any = getattr(objective, "model", objective)
    config = getattr(model, "config", None)
    now = config.to_dict() if config is not None else None
    saved = _model_config(ckpt)
    pairs = grown_sizes(saved, now)
    own = objective.state_dict()
    remapped = _remap_ids(state, own)
    grown = []
    for key, t in own.items():
        if key in state and key not in remapped and tuple(state[key].shape) != tuple(t.shape):
            state[key] = _grow(state[key], t, key, ckpt, pairs)
            grown.append(key)
    try:
        objective.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{ckpt / 'model.safetensors'} does not fit this run's model: {e}") from e
    return {"checkpoint": str(ckpt), "grown": grown, "id_vectors_matched": sorted(remapped)}
