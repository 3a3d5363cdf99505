"""``genrec train`` with ``retrieval_first``: the retrieval model first, then the joint model from it, one command.

On MovieLens 100K with like / view / dislike the joint model trained from scratch ranked below a frozen fine-tune of
a retrieval model (Hit@3, decided) and retrieved below the retrieval-only model; trained from a retrieval-only
model's weights with nothing frozen it met both (``docs/log/2026-12-06-ordering-warm.md``), where one run that
switched the action loss on midway did not. So a run with ``retrieval_first`` (``on``; ``feedback``: where the data
logs several actions, as ``--preset seq-small`` sets) is two runs in WORKDIR:

1. **the retrieval phase**: the run's configuration with ``objective.w_action=0`` (no ranking rows), its own early
   stopping and budget; its checkpoints' config records ``phase: retrieval-first``, and a finished phase leaves
   ``checkpoints/retrieval-first.json`` (its summary);
2. **the joint phase**: a warm start (:func:`genrec.recipes.warmstart.train_warm`) from the retrieval phase's LAST
   checkpoint (where its early stopping ended it), with the run's own losses, a fresh optimiser and a fresh weight
   average; the retrieval phase moves to ``WORKDIR/previous-runs/`` and the joint run records where its start lies
   (``init_from``). The last, not the best: the measured recipe started there, and started from the best checkpoint
   (MovieLens 100K with actions, CPU) the joint phase's validation retrieval only fell, so its early stopping kept
   its first evaluation, the heads barely trained (slate Hit@3 −.070 on validation, decided;
   ``docs/log/2026-12-06-retrieval-first.md``).

Running the command again resumes where it stopped: an interrupted retrieval phase resumes (then the joint phase
runs), a finished one goes straight to the joint phase, an interrupted joint phase resumes with its recorded start
(as any warm start does). ``--no-resume`` sets WORKDIR's run aside and starts at the retrieval phase; ``--init-from``
or ``init_from=`` names the start, so there is no retrieval phase. A run that trains no action loss (``w_action``
0, ``variant=ranking-only``, ``tiger``, ``sasrec``) or no retrieval loss is one run whatever ``retrieval_first``
says, except ``on``, which refuses it. Under torchrun both phases share one process group; rank 0 sets the
retrieval phase aside, and the two processes' phases equal one process's (``tests/train/test_torchrun_train.py``).
The joint phase picks its checkpoint by ``joint_metric`` where one is set (the preset's: its heads' mean validation
AUC, ``valid/rank/auc``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from genrec.catalog import open_store
from genrec.errors import ConfigError
from genrec.model.checkpoint_io import CheckpointError, load_config_dict
from genrec.recipes.training import train_run
from genrec.recipes.warmstart import train_warm
from genrec.train.distributed import process_group
from genrec.train.objective import logs_feedback
from genrec.train.run import RunConfig, variant_overrides
from genrec.workdir import WorkDir, atomic_write_json, read_json

__all__ = ["DONE_FILE", "RETRIEVAL_PHASE", "retrieval_first_applies", "train"]

RETRIEVAL_PHASE = "retrieval-first"
DONE_FILE = "retrieval-first.json"  # under checkpoints/: the retrieval phase finished (its summary)
_SUMMARY = ("step", "best_step", "valid", "checkpoint")


def retrieval_first_applies(cfg: RunConfig, n_actions: int) -> bool:
    """Whether a run of ``cfg`` on data that logs ``n_actions`` actions trains in two phases (the module
    docstring); ``retrieval_first=on`` on a run that cannot is a :class:`ConfigError` saying why."""
    mode = cfg.retrieval_first
    if mode == "off" or (mode == "feedback" and not logs_feedback(n_actions)):
        return False
    _, obj = variant_overrides(cfg)
    obj = obj.for_actions(n_actions)
    why = ""
    if cfg.init_from:
        why = f"init_from={cfg.init_from} names the run's start"
    elif cfg.variant == "frozen-ft":
        why = "variant frozen-ft starts from init_from"
    elif obj.w_action == 0:
        why = f"variant {cfg.variant} with objective.w_action={obj.w_action:g} trains no action loss"
    elif obj.w_item == 0 and obj.w_sid == 0:
        why = f"variant {cfg.variant} trains no retrieval loss (objective.w_item and w_sid are 0)"
    elif obj.w_dpo > 0:
        why = "the DPO stage tunes the checkpoint init_from names"
    if why and mode == "on":
        raise ConfigError(f"config key 'retrieval_first': on, but {why}; set retrieval_first=off")
    return not why


def _latest_config(wd: WorkDir) -> dict[str, Any] | None:
    """The config of the run WORKDIR holds (its LATEST checkpoint's), None when it holds none."""
    try:
        cfg = load_config_dict(wd.checkpoints)
    except (CheckpointError, OSError, ValueError):  # a damaged pointer or file: the resume itself will say so
        return None
    return cfg if isinstance(cfg, dict) else None


def _joint(cfg: RunConfig) -> RunConfig:
    """The joint phase's configuration: the run's, early-stopping on ``joint_metric`` where one is set."""
    if not cfg.joint_metric:
        return cfg
    es = dataclasses.replace(cfg.train.early_stopping, metric=cfg.joint_metric)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, early_stopping=es))


def train(workdir: str | Path, cfg: RunConfig, *, resume: bool = True,
          init_from: str | Path | None = None) -> dict[str, Any]:
    """What ``genrec train WORKDIR`` runs: a warm start from ``init_from``; else the run WORKDIR holds resumed (a
    warm start keeps its recorded start); else, where :func:`retrieval_first_applies`, the two phases; else one run.
    Returns the run's summary; after two phases it carries the retrieval phase's under ``retrieval_first``."""
    if init_from is not None:
        return train_warm(workdir, cfg, init_from)
    wd = WorkDir(workdir)
    saved = _latest_config(wd) if resume else None
    # (the tables are read for their actions only where the setting could apply)
    two = cfg.retrieval_first != "off" and retrieval_first_applies(cfg, len(open_store(wd.root).info().actions))
    if saved is not None and saved.get("phase") == RETRIEVAL_PHASE and not two:
        raise ConfigError(f"{wd.checkpoints} holds the retrieval phase of a two-phase run (retrieval_first), and this "
                          f"run (retrieval_first={cfg.retrieval_first}) is one phase: run it with the settings it "
                          f"was started with, or start afresh with --no-resume (the old run is kept)")
    if saved is not None and saved.get("phase") != RETRIEVAL_PHASE:
        kept = str((saved.get("run") or {}).get("init_from") or "")
        if kept and not cfg.init_from:  # resuming a warm start (the joint phase is one): it keeps its start
            cfg = dataclasses.replace(_joint(cfg) if two else cfg, init_from=kept)
        return train_run(wd.root, cfg, resume=resume)
    if not two:
        return train_run(wd.root, cfg, resume=resume)
    with process_group(cfg.train.device) as info:  # under torchrun: one process group for both phases
        done = wd.checkpoints / DONE_FILE
        if saved is not None and done.exists():
            first = read_json(done)
            if info.is_main:
                print(f"[genrec.train] the retrieval phase finished at step {first.get('step')}: on to the joint "
                      "phase", file=sys.stderr)
        else:
            if info.is_main:
                print("[genrec.train] retrieval_first: the retrieval phase (objective.w_action=0) first, then the "
                      "joint model from its last checkpoint", file=sys.stderr)
            retrieval = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, w_action=0.0))
            out = train_run(wd.root, retrieval, resume=resume, phase=RETRIEVAL_PHASE)
            if out.get("interrupted"):
                return {**out, "phase": RETRIEVAL_PHASE}
            first = {k: out.get(k) for k in _SUMMARY}
            if info.is_main:
                atomic_write_json(done, first)
        joint = train_warm(wd.root, _joint(cfg), "last")  # the retrieval phase's last checkpoint (module docstring)
    return {**joint, "retrieval_first": first}
