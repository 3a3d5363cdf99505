"""A model-agnostic training loop: AdamW + warm-up/decay, clipping, bf16 on CUDA, checkpoints,
exact resume, early stopping, TensorBoard, DDP, and an optional weight average (``ema_decay``,
:mod:`genrec.train.ema`) that evaluation and the checkpoint's served weights use.

Protocol: ``model.training_step(batch) -> dict[str, Tensor]`` with a scalar ``"loss"`` plus any
named scalar terms (logged as-is); the optional keys ``"n_items"`` (targets in this batch: the
count that metrics and DDP gradients are weighted by) and ``"n_tokens"`` (for tokens/s) are
not logged as terms. ``train_iter_factory(IterSpec) -> Iterator[batch]`` must yield, for this
rank, the batches from global step ``spec.start_step`` onwards, deterministically from
``spec.seed`` — that is what makes resume exact.

Non-standard: randomness inside a step (dropout, MAM masking) is re-seeded from
``(seed, rank, step)`` before every step, so a resumed run on any number of ranks replays the
uninterrupted run's loss trajectory without gathering per-rank RNG states; the LR schedule is a
plain closure over the *current* config (not restored from the checkpoint), so ``total_steps``
may be extended on resume. ``max_minutes`` is likewise the whole run's budget: the training time
used so far is saved in each checkpoint and a resumed run goes on counting from it (a run resumed
with its budget spent takes no step; raise ``max_minutes`` to extend it). With
``decay_by="deadline"`` the schedule reads that clock too (rank 0's, shared by the ``max_minutes``
check), so it carries on from where the run stopped, though wall time is not replayed exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from genrec.errors import ConfigError, GenrecError
from genrec.train import checkpoint as ckpt
from genrec.train.config import CUDA_GRAPH_MODES, TrainConfig
from genrec.train.distributed import (
    DistInfo,
    all_reduce_weighted,
    barrier,
    broadcast_object,
    count_weighted_loss,
    init_distributed,
    pick_device,
    wrap_model,
)
from genrec.train.ema import WeightAverage
from genrec.workdir import WorkDir, atomic_write_bytes, atomic_write_json

_RESERVED = {"loss", "n_items", "n_tokens"}
TRAINER_KEY = "_trainer"


@dataclass(frozen=True)
class IterSpec:
    """What the data-iterator factory needs to produce this rank's batches from ``start_step``."""

    start_step: int
    seed: int
    rank: int
    world_size: int
    batch_size: int  # GLOBAL batch; a rank's share is shard_bounds(batch_size, rank, world_size)
    num_workers: int = 0


@dataclass
class TrainResult:
    step: int
    stopped_early: bool
    best_step: int | None
    best_metric: float | None
    history: list[dict[str, float]] = field(default_factory=list)  # per step run in this process
    evals: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    interrupted: str | None = None  # "SIGINT" / "SIGTERM" when a signal stopped the run (checkpointed first)
    archived: Path | None = None  # where a fresh start (resume=False) moved the previous run's files


# ---------------------------------------------------------------------------- optimizer / schedule

def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decay on ≥2-D weights; none on biases, norms, and embedding tables.

    A model may name more no-decay parameters via ``model.no_weight_decay() -> set[str]``.
    """
    emb_params: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):
            emb_params.update(id(p) for p in mod.parameters(recurse=False))
        elif "norm" in type(mod).__name__.lower():
            emb_params.update(id(p) for p in mod.parameters(recurse=False))
    nwd = getattr(model, "no_weight_decay", None)
    extra: set[str] = set(nwd()) if callable(nwd) else set()
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() < 2 or id(p) in emb_params or name in extra:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def lr_multiplier(cfg: TrainConfig, time_progress: Callable[[], float] | None = None) -> Callable[[int], float]:
    """Linear warm-up to 1 over ``warmup_steps``, then cosine/linear decay to ``min_lr_ratio``.

    With ``time_progress`` (the fraction of the wall-time budget used; see ``TrainConfig.decay_by``)
    the decay's progress is the larger of the step and time fractions; warm-up stays step-based.
    """
    warm, total, floor, kind = cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio, cfg.decay

    def mult(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if kind == "constant":
            return 1.0
        progress = (step - warm) / max(1, total - warm)
        if time_progress is not None:
            progress = max(progress, time_progress())
        progress = min(1.0, max(0.0, progress))
        if kind == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return floor + (1 - floor) * (1 - progress)

    return mult


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    fused = all(p.is_cuda for p in model.parameters()) and any(True for _ in model.parameters())
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]),
                             eps=cfg.eps, **({"fused": True} if fused else {}))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def step_seed(seed: int, rank: int, step: int) -> int:
    """Deterministic per-(seed, rank, step) seed (a simple 64-bit mix)."""
    x = (seed * 0x9E3779B97F4A7C15 + rank * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB) % (2**64)
    x ^= x >> 31
    return x % (2**63 - 1)


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(to_device(v, device) for v in batch)
    if isinstance(batch, list):
        return [to_device(v, device) for v in batch]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: to_device(getattr(batch, f.name), device)
                                             for f in dataclasses.fields(batch) if f.init})
    if hasattr(batch, "to") and callable(batch.to):
        return batch.to(device)
    return batch


def _leading_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, Mapping):
        for v in batch.values():
            return _leading_size(v)
    if isinstance(batch, (list, tuple)) and batch:
        return _leading_size(batch[0])
    return 1


def _truncate_log(path: Path, step: int) -> None:
    """Drop log records past ``step`` (written by a run that crashed after its last checkpoint)."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    keep = []
    for line in lines:
        try:
            if int(json.loads(line)["step"]) <= step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line
    if len(keep) != len(lines):
        atomic_write_bytes(path, "".join(x + "\n" for x in keep).encode())


RUN_FILES = ("train_log.jsonl", "eval_log.jsonl", "tb")  # the run's own files beside its checkpoints
# run settings a resume may not change: what the model learns from would change meaning mid-run
_RESUME_FIXED = ("run.variant", "run.data.split", "run.init_from")
# model settings that change neither the parameters nor the function's definition (the rest are refused)
_RESUME_FREE_MODEL = ("model.dropout", "model.attn_impl")


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose value differs between a checkpoint's config and this run's, every section
    (``train``, ``run``, ``model``, ...) -- not only ``train`` (audit: objective, data and variant changes
    were accepted silently). A section the checkpoint did not record is not compared."""
    a, b = _flat(saved), _flat(now)
    sections = {k.split(".", 1)[0] for k in a}
    return sorted(k for k in set(a) | set(b) if k.split(".", 1)[0] in sections and a.get(k) != b.get(k)
                  and not k.startswith("run.train."))  # (the run's train section is the ``train`` one)


def archive_previous_run(wd: WorkDir) -> Path | None:
    """Move a previous run's checkpoints, logs, TensorBoard events and reports into
    ``WORKDIR/previous-runs/<time>/`` (nothing is deleted); None when there is no previous run.

    A fresh start (``genrec train --no-resume``) used to write its checkpoints beside the old ones:
    the old ``BEST`` stayed and ``recommend``/``eval``/``serve`` kept loading it, and ``keep_last``
    pruned the new run's folders while keeping the old, higher-numbered ones."""
    cdir = wd.checkpoints
    if not cdir.is_dir() or not (any((cdir / p).exists() for p in (ckpt.LATEST, ckpt.BEST))
                                 or any(cdir.glob("step-*"))):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = wd.root / "previous-runs" / stamp
    n = 2
    while dest.exists():
        dest = wd.root / "previous-runs" / f"{stamp}-{n}"
        n += 1
    dest.mkdir(parents=True)
    for src in (cdir, wd.reports, *(wd.root / f for f in RUN_FILES)):
        if src.exists():
            src.replace(dest / src.name)  # a rename within the run directory: atomic, nothing copied
    return dest


class _Interrupts:
    """SIGINT / SIGTERM during :meth:`Trainer.fit`: the first one is noted and the loop stops at the end of
    the step in progress, after a checkpoint (preemption, Ctrl-C); a second one interrupts at once. Only the
    main thread can take signals; elsewhere this does nothing."""

    def __init__(self) -> None:
        self.caught: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_Interrupts":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if self.caught is not None:  # the second one: do not wait for the step
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.caught = signal.Signals(signum).name
        print(f"[genrec.train] {self.caught}: stopping after this step with a checkpoint (again to stop at once)",
              file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)


def _clock(seconds: float) -> str:
    """``95`` -> ``1m35s``; ``3725`` -> ``1h02m``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _ProgressLines:
    """Plain progress lines on stderr, for output that is not a terminal (a log file, a pipe): the tqdm bar
    draws nothing useful there. A line at a log step once ``every_s`` seconds have passed since the last one
    (so: every ``log_every`` steps or every ``every_s`` seconds, whichever is rarer) and at the last step,
    plus one per evaluation; each line is flushed."""

    def __init__(self, total: int, start: int, every_s: float, metric: str) -> None:
        self.total, self.start, self.every_s, self.metric = total, start, every_s, metric
        self.t0 = self.t_last = time.perf_counter()
        self.last_eval: tuple[str, float, int] | None = None

    @staticmethod
    def say(msg: str) -> None:
        print(f"[genrec.train] {msg}", file=sys.stderr, flush=True)

    def begin(self, log_every: int) -> None:
        every = f"every {log_every} steps (train.log_every)" if log_every else "at the end"
        rarer = f", at most once per {self.every_s:g} s (train.progress_every_s)" if self.every_s > 0 else ""
        self.say(f"training from step {self.start} to {self.total}: a progress line {every}{rarer}; "
                 f"train.progress=off for none")

    def step(self, step: int, loss: float, items_per_s: float, *, last: bool) -> None:
        now = time.perf_counter()
        if not last and now - self.t_last < self.every_s:
            return
        self.t_last = now
        elapsed = now - self.t0
        done = step - self.start
        parts = [f"step {step}/{self.total} ({100.0 * step / max(1, self.total):.0f}%)", f"elapsed {_clock(elapsed)}"]
        if done > 0 and step < self.total:
            parts.append(f"eta {_clock(elapsed / done * (self.total - step))}")
        parts += [f"loss {loss:.4f}", f"items/s {items_per_s:.0f}"]
        if self.last_eval is not None:
            k, v, at = self.last_eval
            parts.append(f"{k} {v:.4f} (step {at})")
        self.say("  ".join(parts))

    def evaluated(self, step: int, metrics: Mapping[str, float], improved: bool) -> None:
        if not metrics:
            return
        keys = sorted(metrics)
        key = (self.metric if self.metric in metrics else
               next((k for k in keys if k.endswith("recall@10")), keys[0]))
        self.last_eval = (key, float(metrics[key]), step)
        self.say(f"step {step}/{self.total} validation: {key} {metrics[key]:.4f}" + ("  (best so far)" if improved
                                                                                   else ""))


class _StepModule(nn.Module):
    """Routes ``forward`` to ``training_step`` so DDP's hooks see the call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        return self.model.training_step(batch)  # type: ignore[operator]


# ---------------------------------------------------------------------------- trainer

class Trainer:
    """Train ``model`` on batches from ``train_iter_factory``; see the module docstring for the protocol."""

    def __init__(
        self,
        model: nn.Module,
        train_iter_factory: Callable[[IterSpec], Iterator[Any]],
        cfg: TrainConfig,
        workdir: str | Path | WorkDir,
        *,
        eval_fn: Callable[[nn.Module], Mapping[str, float]] | None = None,
        extra: Mapping[str, Any] | None = None,
        config_extra: Mapping[str, Any] | None = None,
        dist_info: DistInfo | None = None,
    ) -> None:
        if not hasattr(model, "training_step"):
            raise TypeError(f"{type(model).__name__} has no training_step(batch) -> dict method")
        self.cfg = cfg
        self.info = dist_info if dist_info is not None else init_distributed(cfg.device)
        self.device = pick_device(cfg.device, self.info.local_rank)
        if self.info.is_distributed and self.device != self.info.device:
            raise ConfigError(f"config key 'device': {cfg.device!r} resolves to {self.device}, but the process "
                              f"group was initialised for {self.info.device}")
        self.wd = workdir if isinstance(workdir, WorkDir) else WorkDir(workdir)
        self.ckpt_dir = self.wd.checkpoints
        self.model = model.to(self.device)
        self.wrapped = wrap_model(_StepModule(self.model), self.info,
                                  find_unused_parameters=cfg.find_unused_parameters)
        self.optimizer = build_optimizer(self.model, cfg)
        self.ema = WeightAverage(self.model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        # rank 0's training seconds, as of the last _out_of_time check: this fit's clock plus the time
        # earlier fits of the run used (restored on resume), so max_minutes is the run's whole budget
        self._elapsed = self._elapsed_before = 0.0
        self._damaged: list[Path] = []  # checkpoints a resume could not read, set aside by fit()
        self._resumed: Path | None = None
        # the log window open at the last checkpoint, summed over every rank ({"sum": {term: Σ v·n}, "n": Σ n}):
        # saved with it, so a run resumed between two log steps logs the window the uninterrupted run logs
        self._log_window: dict[str, Any] = {}
        time_progress = self._time_progress if cfg.decay_by == "deadline" else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_multiplier(cfg, time_progress))
        self.factory = train_iter_factory
        self.eval_fn = eval_fn
        self.extra = dict(extra or {})
        if TRAINER_KEY in self.extra:
            raise ValueError(f"extra may not use the reserved key {TRAINER_KEY!r}")
        self.config_dict = {"train": cfg.to_dict(), **dict(config_extra or {})}
        self.step = 0
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.bad_evals = 0
        self._last_saved: int | None = None

    # ------------------------------------------------------------------ state
    def _trainer_state(self) -> dict[str, Any]:
        return {"step": self.step, "best_metric": self.best_metric, "best_step": self.best_step,
                "bad_evals": self.bad_evals, "seed": self.cfg.seed, "world_size": self.info.world_size,
                "elapsed_s": self._elapsed, "ema_updates": self.ema.updates if self.ema is not None else 0,
                "log_window": self._log_window}

    def averaged(self) -> contextlib.AbstractContextManager[None]:
        """The weights to evaluate and serve in the model for a ``with`` block: the weight average
        when ``ema_decay`` keeps one, else the live weights as they are."""
        return self.ema.swapped() if self.ema is not None else contextlib.nullcontext()

    def save(self, *, mark_best: bool = False) -> Path | None:
        """Checkpoint the current step (rank 0 writes; all ranks wait)."""
        path = None
        if self.info.is_main:
            path = ckpt.save_checkpoint(
                self.ckpt_dir, self.step, self.model, self.optimizer, self.scheduler,
                {**self.extra, TRAINER_KEY: self._trainer_state()},
                config=self.config_dict, keep_last=self.cfg.keep_last, mark_best=mark_best,
                served=self.ema.swapped if self.ema is not None else None)
        self._last_saved = self.step
        barrier(self.info)
        return path

    def resume(self) -> bool:
        """Load ``LATEST`` if there is one; True when a checkpoint was loaded.

        A checkpoint that cannot be read (a torn or damaged file: :class:`~genrec.train.checkpoint.CheckpointError`)
        is reported, and the next older complete one is tried, newest first; the damaged ones are set aside by
        :meth:`fit` once every rank has resumed. A config that changed is refused, never fallen back from."""
        candidates = ckpt.resume_candidates(self.ckpt_dir)
        if not candidates:
            ckpt.resolve_checkpoint(self.ckpt_dir)  # a LATEST that names a missing folder, with no other: say so
            return False
        damaged: list[tuple[Path, ckpt.CheckpointError]] = []
        for found in candidates:
            try:
                self._resume_from(found)
            except ckpt.CheckpointError as e:
                damaged.append((found, e))
                if self.info.is_main:
                    print(f"[genrec.train] cannot resume from {found}: {e}", file=sys.stderr)
                continue
            self._damaged, self._resumed = [p for p, _ in damaged], found
            if damaged and self.info.is_main:
                print(f"[genrec.train] resumed from the older {found.name} instead: the steps after it are trained "
                      f"again (the same steps: resume is exact); the unreadable checkpoint(s) will be kept as "
                      f"{', '.join(p.name + '.damaged' for p in self._damaged)}", file=sys.stderr)
            return True
        tried = "; ".join(f"{p.name}: {e}" for p, e in damaged)
        raise ckpt.CheckpointError(f"no checkpoint under {self.ckpt_dir} can be resumed from ({tried}); start afresh "
                                   f"with --no-resume (the checkpoints are moved to previous-runs/, not deleted)")

    def _resume_from(self, found: Path) -> None:
        saved_cfg = ckpt.load_config_dict(found)
        changed = _config_changes(saved_cfg, self.config_dict) if saved_cfg is not None else []
        model_keys = [k for k in changed if k.startswith("model.") and k not in _RESUME_FREE_MODEL]
        fixed = [k for k in changed if k in _RESUME_FIXED]
        if model_keys or fixed:
            raise ConfigError(f"cannot resume {found}: {', '.join(model_keys + fixed)} changed since it was written "
                              f"(the model's shape or the meaning of its training data would change mid-run); "
                              f"keep the run's values, or start afresh with --no-resume (the old run is kept)")
        extra = ckpt.load_checkpoint(found, self.model, self.optimizer, self.scheduler,
                                     device=str(self.device))
        state = extra.pop(TRAINER_KEY, {})
        # the model now holds the checkpoint's served weights: the average if it was saved with one
        # (ema_updates is 0 otherwise), so the average restarts there; then the live weights go back in
        if self.ema is not None:
            self.ema.reset(int(state.get("ema_updates", 0)))
        ckpt.load_train_weights(found, self.model, device=str(self.device))
        self.step = int(state.get("step", ckpt.checkpoint_step(found)))
        self.best_metric = state.get("best_metric")
        self.best_step = state.get("best_step")
        self.bad_evals = int(state.get("bad_evals", 0))
        self._elapsed = self._elapsed_before = float(state.get("elapsed_s", 0.0))
        self._log_window = dict(state.get("log_window") or {})
        self._last_saved = self.step
        for k, v in extra.items():
            self.extra.setdefault(k, v)
        if changed and self.info.is_main:
            print(f"[genrec.train] resuming {found.name} with changed config keys: {changed}", file=sys.stderr)

    # ------------------------------------------------------------------ loop
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.cfg.bf16 and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _progress(self) -> tuple[Any, _ProgressLines | None]:
        """(a tqdm bar, plain progress lines): the bar on a terminal (or with progress="on"), the lines when
        stderr is not a terminal and progress="auto", neither with "off"; rank 0 only."""
        if self.cfg.progress == "off" or not self.info.is_main:
            return None, None
        if self.cfg.progress == "auto" and not sys.stderr.isatty():
            return None, _ProgressLines(self.cfg.total_steps, self.step, self.cfg.progress_every_s,
                                        self.cfg.early_stopping.metric)
        from tqdm.auto import tqdm

        return tqdm(total=self.cfg.total_steps, initial=self.step, desc="train", dynamic_ncols=True), None

    def evaluate(self) -> dict[str, float]:
        """Run ``eval_fn`` on rank 0 (no grad, eval mode); every rank gets the same metrics."""
        metrics: dict[str, float] = {}
        if self.eval_fn is not None and self.info.is_main:
            self.model.eval()
            with torch.no_grad(), self._autocast(), self.averaged():
                metrics = {k: float(v) for k, v in self.eval_fn(self.model).items()}
            self.model.train()
        return broadcast_object(metrics, self.info)

    def _early_stop_update(self, metrics: Mapping[str, float]) -> tuple[bool, bool]:
        """(improved, should_stop) for the configured metric."""
        es = self.cfg.early_stopping
        if not es.metric:
            return False, False
        if es.metric not in metrics:
            raise GenrecError(f"early_stopping.metric {es.metric!r} not among eval metrics {sorted(metrics)}")
        v = metrics[es.metric]
        better = (self.best_metric is None or
                  (v > self.best_metric + es.min_delta if es.mode == "max" else v < self.best_metric - es.min_delta))
        if better:
            self.best_metric, self.best_step, self.bad_evals = v, self.step, 0
        else:
            self.bad_evals += 1
        return better, es.patience > 0 and self.bad_evals >= es.patience

    def _out_of_time(self, t_fit: float) -> bool:
        """``max_minutes`` reached (rank 0's clock decides, so every rank stops at the same step).

        The budget covers the whole run: the time earlier fits used (saved in the checkpoint) counts.
        Also records the elapsed time in ``self._elapsed`` for the ``decay_by="deadline"`` schedule,
        so every rank computes the same LR, and for the next checkpoint.
        """
        elapsed = self._elapsed_before + (time.perf_counter() - t_fit)
        if self.cfg.max_minutes <= 0:
            self._elapsed = elapsed
            return False
        if self.info.world_size > 1:
            import torch.distributed as dist

            shared = torch.tensor([elapsed], dtype=torch.float64, device=self.device)
            dist.broadcast(shared, src=0)
            elapsed = float(shared.item())
        self._elapsed = elapsed
        return elapsed > 60.0 * self.cfg.max_minutes

    def _time_progress(self) -> float:
        """Fraction of ``max_minutes`` the run has used (restored on resume); see ``_out_of_time``."""
        return self._elapsed / (60.0 * self.cfg.max_minutes) if self.cfg.max_minutes > 0 else 0.0

    def fit(self, *, resume: bool = True) -> TrainResult:
        """Train until ``cfg.total_steps`` (or early stop / data end); returns the trajectory."""
        cfg, info = self.cfg, self.info
        archived = None
        if resume:
            self.resume()
        elif info.is_main:
            archived = archive_previous_run(self.wd)
            if archived is not None:
                print(f"[genrec.train] starting afresh: the previous run's checkpoints, logs and reports were "
                      f"moved to {archived}", file=sys.stderr)
        barrier(info)
        if self._damaged and info.is_main:  # every rank has resumed: the damaged folders go out of the way
            for p in self._damaged:
                print(f"[genrec.train] set aside: {ckpt.set_aside(p, latest=self._resumed)}", file=sys.stderr)
            self._damaged = []
        barrier(info)
        if self.step == 0:
            seed_everything(cfg.seed + info.rank)
        log_path = self.wd.root / "train_log.jsonl"
        eval_log_path = self.wd.root / "eval_log.jsonl"  # one record per evaluation: step, metrics, best
        if info.is_main:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.ckpt_dir / "config.json", self.config_dict)
            _truncate_log(log_path, self.step)
            _truncate_log(eval_log_path, self.step)
        writer = None
        if cfg.tensorboard and info.is_main:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(self.wd.root / "tb"))
        bar, lines = self._progress()
        result = TrainResult(self.step, False, self.best_step, self.best_metric, archived=archived)
        it = iter(self.factory(IterSpec(self.step, cfg.seed, info.rank, info.world_size,
                                        cfg.batch_size, cfg.num_workers)))
        pending: list[tuple[int, dict[str, torch.Tensor], float]] = []
        # the open log window: the resumed checkpoint's (global sums, held by rank 0 alone so that the all-reduce
        # at the next log step counts them once), then this fit's steps
        win_sum: dict[str, float] = dict(self._log_window.get("sum", {})) if info.is_main else {}
        win_n = float(self._log_window.get("n", 0.0)) if info.is_main else 0.0
        win_items = win_tokens = 0.0

        def absorb() -> None:
            """The queued steps into the history and the open window (one host sync)."""
            nonlocal win_n
            for r in self._drain(pending):
                n = r.pop("_n")
                result.history.append(r)
                for k, v in r.items():
                    if k != "step":
                        win_sum[k] = win_sum.get(k, 0.0) + v * n
                win_n += n

        def checkpoint(mark_best: bool = False) -> Path | None:
            """:meth:`save`, with every rank's open log window summed into the state it writes (all ranks call it)."""
            absorb()
            means, total = all_reduce_weighted({k: v / max(win_n, 1e-12) for k, v in sorted(win_sum.items())},
                                               win_n, info)
            self._log_window = {"sum": {k: m * total for k, m in means.items()}, "n": total} if total > 0 else {}
            return self.save(mark_best=mark_best)
        t0 = t_fit = time.perf_counter()
        # a resumed run whose time budget is already spent takes no step (like one at total_steps)
        spent = self._out_of_time(t_fit)
        if self.step >= cfg.total_steps and info.is_main:
            print(f"[genrec.train] the run is already at step {self.step} of train.total_steps={cfg.total_steps}: "
                  "nothing to train (raise train.total_steps to go on, or --no-resume to start afresh)",
                  file=sys.stderr)
        if spent and info.is_main:
            print(f"[genrec.train] the run's time budget is spent ({self._elapsed / 60:.1f} of train.max_minutes="
                  f"{cfg.max_minutes:g} used at step {self.step}): no step taken; raise train.max_minutes to go on",
                  file=sys.stderr)
        if lines is not None and self.step < cfg.total_steps and not spent:
            lines.begin(cfg.log_every)
        self.model.train()
        # train.compile_mode records CUDA graphs: each step's replay overwrites the last one's graph outputs,
        # so the step is marked as a new one, and its logged scalars are copied out of graph memory
        graphs = cfg.compile and cfg.compile_mode in CUDA_GRAPH_MODES and self.device.type == "cuda"
        interrupts = _Interrupts()
        try:
            interrupts.__enter__()
            while self.step < cfg.total_steps and not spent:
                torch.manual_seed(step_seed(cfg.seed, info.rank, self.step))
                try:
                    batch = next(it)
                except StopIteration:
                    break
                batch = to_device(batch, self.device)
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                with self._autocast():
                    out = self.wrapped(batch)
                if not isinstance(out, Mapping) or "loss" not in out:
                    raise GenrecError(f"{type(self.model).__name__}.training_step must return a dict with 'loss'")
                loss = out["loss"]
                if loss.dim() != 0:
                    raise GenrecError(f"training_step 'loss' must be a scalar, got shape {tuple(loss.shape)}")
                n_items = float(out["n_items"]) if "n_items" in out else float(_leading_size(batch))
                n_tokens = float(out["n_tokens"]) if "n_tokens" in out else 0.0
                count_weighted_loss(loss, n_items, info).backward()
                grad_norm = (torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                             if cfg.grad_clip > 0 else torch.zeros((), device=loss.device))  # (logged beside the loss)
                self.optimizer.step()
                if self.ema is not None:
                    self.ema.update()
                # the clock is read before scheduler.step(), so a "deadline" decay sees this step's time
                out_of_time = self._out_of_time(t_fit)
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                terms = {k: v.detach().float() for k, v in out.items()
                         if k not in _RESERVED and isinstance(v, torch.Tensor) and v.dim() == 0}
                terms = {"loss": loss.detach().float(), **terms, "grad_norm": grad_norm.detach().float()}
                if graphs:
                    terms = {k: v.clone() for k, v in terms.items()}
                pending.append((self.step, terms, n_items))
                win_items += n_items
                win_tokens += n_tokens
                if bar is not None:
                    bar.update(1)

                last = self.step >= cfg.total_steps or out_of_time
                if (cfg.log_every and self.step % cfg.log_every == 0) or last:
                    absorb()
                    means, _ = all_reduce_weighted({k: v / max(win_n, 1e-12) for k, v in sorted(win_sum.items())},
                                                   win_n, info)
                    dt = max(time.perf_counter() - t0, 1e-9)
                    rates, _ = all_reduce_weighted({"items_per_s": win_items / dt, "tokens_per_s": win_tokens / dt},
                                                   1.0, info)
                    rates = {k: v * info.world_size for k, v in rates.items()}  # sum over ranks
                    lr = float(self.scheduler.get_last_lr()[0])
                    if not math.isfinite(means.get("loss", 0.0)):
                        raise GenrecError(f"training loss became non-finite in the log window ending at step "
                                          f"{self.step}: {means}")
                    if info.is_main:
                        rec = {"step": self.step, "lr": lr, **means, **rates}
                        with open(log_path, "a", encoding="utf-8") as f:
                            f.write(json.dumps(rec) + "\n")
                        if writer is not None:
                            for k, v in {**means, **rates, "lr": lr}.items():
                                writer.add_scalar(f"train/{k}", v, self.step)
                        if bar is not None:
                            post = {"loss": f"{means.get('loss', float('nan')):.4f}",
                                    "items/s": f"{rates['items_per_s']:.0f}"}
                            if win_tokens:
                                post["tok/s"] = f"{rates['tokens_per_s']:.0f}"
                            bar.set_postfix(post)
                        if lines is not None:
                            lines.step(self.step, means.get("loss", float("nan")), rates["items_per_s"], last=last)
                    win_sum.clear()
                    win_n, win_items, win_tokens = 0.0, 0.0, 0.0
                    t0 = time.perf_counter()

                stop = False
                if self.eval_fn is not None and ((cfg.eval_every and self.step % cfg.eval_every == 0) or last):
                    metrics = self.evaluate()
                    result.evals.append({"step": self.step, **metrics})
                    if writer is not None:
                        for k, v in metrics.items():
                            writer.add_scalar(f"eval/{k}", v, self.step)
                    improved, stop = self._early_stop_update(metrics)
                    if lines is not None:
                        lines.evaluated(self.step, metrics, improved)
                    if info.is_main:
                        with open(eval_log_path, "a", encoding="utf-8") as f:
                            f.write(json.dumps({"step": self.step, **metrics, "best": improved}) + "\n")
                    if improved:
                        result.last_checkpoint = checkpoint(mark_best=True)
                if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and self._last_saved != self.step:
                    result.last_checkpoint = checkpoint()
                if stop:
                    result.stopped_early = True
                    break
                if last:  # total_steps, or max_minutes
                    break
                if self._interrupted(interrupts):
                    result.interrupted = interrupts.caught or "signal (another rank)"
                    break
        finally:
            interrupts.__exit__()
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        if self._last_saved != self.step:  # the same on every rank
            result.last_checkpoint = checkpoint()
        else:
            absorb()
        if result.last_checkpoint is None:  # nothing new written: the checkpoint this run stands at
            result.last_checkpoint = ckpt.resolve_checkpoint(self.ckpt_dir)
        result.step, result.best_step, result.best_metric = self.step, self.best_step, self.best_metric
        return result

    def _interrupted(self, interrupts: _Interrupts) -> bool:
        """Whether a signal asks the loop to stop after this step -- on every rank at the same step: with
        several processes the flag is all-reduced at log boundaries only (one small collective there)."""
        if self.info.world_size <= 1:
            return interrupts.caught is not None
        if not (self.cfg.log_every and self.step % self.cfg.log_every == 0):
            return False
        import torch.distributed as dist

        flag = torch.tensor([1.0 if interrupts.caught else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    @staticmethod
    def _drain(pending: list[Any]) -> list[dict[str, float]]:
        """Materialise queued per-step terms (one host sync per log window, not per step)."""
        rows = []
        for step, terms, n in pending:
            vals = torch.stack(list(terms.values())).cpu().tolist()
            rows.append({"step": step, **dict(zip(terms.keys(), vals)), "_n": n})
        pending.clear()
        return rows
