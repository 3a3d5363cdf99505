"""``genrec train WORKDIR --init-from RUN``: a new run warm-started from an earlier run's checkpoint.

The daily cycle trains each day's model from the day before's (``genrec data append`` -> ``genrec sid assign``
-> ``genrec train --init-from``). ``RUN`` is a run directory -- the checkpoint it serves: BEST if marked, else
LATEST (:func:`genrec.infer.load.find_checkpoint`'s rule) -- or anything ``--checkpoint`` takes: a name of one
of WORKDIR's own checkpoints (``best``, ``last``, a step), or a path to a checkpoint folder.

A warm start is a new run: the run WORKDIR holds (its checkpoints, logs, reports) is moved to
``WORKDIR/previous-runs/<time>/`` first, as ``--no-resume`` does, so nothing of it is lost, and a starting
checkpoint that lay in it is followed to where it went -- the new run records that path as its ``init_from``.
If the warm start fails before its first checkpoint, the previous run is put back, so WORKDIR still serves it.
An interrupted warm start resumes with ``genrec train WORKDIR`` (without ``--init-from``): the run's recorded
``init_from`` is kept (:func:`genrec.recipes.retrieval_first.train`).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

from genrec.errors import ConfigError
from genrec.infer.load import find_checkpoint
from genrec.model.checkpoint_io import LATEST, list_checkpoints, resolve_checkpoint
from genrec.recipes.training import train_run
from genrec.train.distributed import barrier, broadcast_object, process_group
from genrec.train.run import RunConfig
from genrec.train.run_state import RUN_FILES, archive_previous_run
from genrec.workdir import WorkDir, read_json

__all__ = ["resolve_init_from", "train_warm"]


def resolve_init_from(workdir: str | Path, init_from: str | Path) -> Path:
    """The checkpoint folder ``--init-from`` names (the module docstring), resolved to an absolute path."""
    text = str(init_from).strip()
    if not text:
        raise ConfigError("--init-from: empty; give a run directory or a checkpoint")
    p = Path(text).expanduser()
    if p.is_dir() and (p / "checkpoints").is_dir() and not (p / "meta.json").exists():
        return find_checkpoint(p).resolve()  # a run directory: the checkpoint it serves
    return find_checkpoint(workdir, text).resolve()


def _put_back(wd: WorkDir, archived: Path) -> None:
    """Undo the setting aside of the previous run (a warm start that wrote no checkpoint)."""
    for name in ("checkpoints", "reports", *RUN_FILES):
        src, dest = archived / name, wd.root / name
        if not src.exists():
            continue
        if dest.exists():  # the failed start's own (checkpoint-less) files
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        src.replace(dest)
    shutil.rmtree(archived, ignore_errors=True)


def train_warm(workdir: str | Path, cfg: RunConfig, init_from: str | Path) -> dict[str, Any]:
    """Train a new run in WORKDIR from the checkpoint ``init_from`` names (the module docstring); returns the
    run's summary with ``init_from`` (the checkpoint, where it lies now) and ``previous_run`` (where WORKDIR's
    earlier run went)."""
    if cfg.init_from:
        raise ConfigError(f"--init-from {init_from} and the config key init_from={cfg.init_from}: give one")
    wd = WorkDir(workdir)
    with process_group(cfg.train.device) as info:  # under torchrun: rank 0 sets the old run aside, all ranks train
        ckpt = resolve_init_from(wd.root, init_from)
        checkpoints = wd.checkpoints.resolve()
        barrier(info)  # every rank has found the start before it moves
        archived = archive_previous_run(wd) if info.is_main else None
        if info.is_distributed:
            moved = broadcast_object(None if archived is None else str(archived), info)
            archived = None if moved is None else Path(moved)
        if archived is not None:
            if info.is_main:
                print(f"[genrec.train] warm start: WORKDIR's previous run was moved to {archived}", file=sys.stderr)
            if ckpt.is_relative_to(checkpoints):
                ckpt = archived / "checkpoints" / ckpt.relative_to(checkpoints)
        cfg = dataclasses.replace(cfg, init_from=str(ckpt))
        try:
            out = train_run(wd.root, cfg, resume=True)
        except BaseException:
            if archived is not None and info.is_main and not list_checkpoints(wd.checkpoints):
                _put_back(wd, archived)
                print(f"[genrec.train] the warm start failed before its first checkpoint: the previous run is back "
                      f"in {wd.checkpoints}", file=sys.stderr)
            raise
    return {**out, "init_from": str(ckpt), **({"previous_run": str(archived)} if archived is not None else {})}
