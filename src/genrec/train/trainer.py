"""A model-agnostic training loop: AdamW + warm-up/decay, clipping, bf16 on CUDA, checkpoints,
exact resume, early stopping, TensorBoard, DDP, and an optional weight average (``ema_decay``,
:mod:`genrec.train.ema`) that evaluation and the checkpoint's served weights use.

Protocol: ``model.training_step(batch) -> dict[str, Tensor]`` with a scalar ``"loss"`` plus any
named scalar terms (logged as-is); the optional keys ``"n_items"`` (targets in this batch: the
count that metrics and DDP gradients are weighted by) and ``"n_tokens"`` (for tokens/s) are
not logged as terms. ``train_iter_factory(IterSpec) -> Iterator[batch]`` must yield, for this
rank, the batches from global step ``spec.start_step`` onwards, deterministically from
``spec.seed`` — that is what makes resume exact.

Under torchrun a loss that is one mean over the rank's items is count-weighted by ``n_items``. A loss
of several means over different counts (the joint objective's) divides each sum by its count over
every rank itself and returns ``"n_items_global"`` (Σ over ranks of ``n_items``): its loss and terms
are then this rank's shares, summed over the ranks the global batch's values
(:func:`~genrec.train.distributed.step_loss`).

Non-standard: randomness inside a step (dropout, MAM masking) is re-seeded from
``(seed, rank, step)`` before every step, so a resumed run on any number of ranks replays the
uninterrupted run's loss trajectory without gathering per-rank RNG states; the LR schedule is a
plain closure over the *current* config (not restored from the checkpoint), so ``total_steps``
may be extended on resume. ``max_minutes`` is likewise the whole run's budget: the training time
used so far is saved in each checkpoint and a resumed run goes on counting from it (a run resumed
with its budget spent takes no step; raise ``max_minutes`` to extend it). With
``decay_by="deadline"`` the schedule reads that clock too (rank 0's, shared by the ``max_minutes``
check), so it carries on from where the run stopped, though wall time is not replayed exactly.

The loop's parts live beside it: the optimiser, schedule and seeds (:mod:`genrec.train.optim`), the
run's log files, resume checks and log window (:mod:`genrec.train.run_state`), progress lines and
signal handling (:mod:`genrec.train.progress`).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from genrec.errors import ConfigError, GenrecError
from genrec.train import checkpoint as ckpt
from genrec.train.config import CUDA_GRAPH_MODES, TrainConfig
from genrec.train.distributed import (
    DistInfo,
    StepModule,
    all_reduce_weighted,
    any_rank,
    barrier,
    broadcast_object,
    init_distributed,
    leading_size,
    pick_device,
    rank0_value,
    step_loss,
    to_device,
    wrap_model,
)
from genrec.train.ema import WeightAverage
from genrec.train.optim import build_optimizer, lr_multiplier, seed_everything, step_seed
from genrec.train.progress import Interrupts, ProgressLines, open_progress
from genrec.train.run_state import (
    LogWindow,
    RunLogs,
    archive_previous_run,
    check_resume_config,
    config_changes,
    global_record,
    truncate_log,
)
from genrec.workdir import WorkDir, atomic_write_json

_RESERVED = {"loss", "n_items", "n_items_global", "n_tokens"}
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
    last_step: dict[str, float] | None = None  # the last step's record over every rank (history's are one rank's)
    evals: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    interrupted: str | None = None  # "SIGINT" / "SIGTERM" when a signal stopped the run (checkpointed first)
    archived: Path | None = None  # where a fresh start (resume=False) moved the previous run's files


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
        self.wrapped = wrap_model(StepModule(self.model), self.info,
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
        self._last_weight = 0.0  # the last step's weight among the ranks (its items, or its share of them)

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
        changed = config_changes(saved_cfg, self.config_dict) if saved_cfg is not None else []
        check_resume_config(found, changed)
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
        better = es.improves(v, self.best_metric)
        if better:
            self.best_metric, self.best_step, self.bad_evals = v, self.step, 0
        else:
            self.bad_evals += 1
        return better, es.patience > 0 and self.bad_evals >= es.patience

    def _out_of_time(self, t_fit: float) -> bool:
        """``max_minutes`` reached: the whole run's budget (earlier fits' time, saved in the checkpoint, counts), on
        rank 0's clock so every rank stops at the same step; ``self._elapsed`` keeps that time for the next
        checkpoint and the ``decay_by="deadline"`` schedule (the same LR on every rank)."""
        elapsed = self._elapsed_before + (time.perf_counter() - t_fit)
        self._elapsed = elapsed if self.cfg.max_minutes <= 0 else rank0_value(elapsed, self.info)
        return self.cfg.max_minutes > 0 and self._elapsed > 60.0 * self.cfg.max_minutes

    def _time_progress(self) -> float:
        """Fraction of ``max_minutes`` the run has used (restored on resume); see ``_out_of_time``."""
        return self._elapsed / (60.0 * self.cfg.max_minutes) if self.cfg.max_minutes > 0 else 0.0

    def fit(self, *, resume: bool = True) -> TrainResult:
        """Train until ``cfg.total_steps`` (or early stop / data end); returns the trajectory."""
        cfg, info = self.cfg, self.info
        archived = self._begin(resume)
        logs = self._open_logs()
        bar, lines = open_progress(self.cfg, self.info.is_main, self.step)
        result = TrainResult(self.step, False, self.best_step, self.best_metric, archived=archived)
        it = iter(self.factory(IterSpec(self.step, cfg.seed, info.rank, info.world_size,
                                        cfg.batch_size, cfg.num_workers)))
        window = LogWindow(self._log_window, info.is_main)
        t0 = t_fit = time.perf_counter()
        # a resumed run whose time budget is already spent takes no step (like one at total_steps)
        spent = self._out_of_time(t_fit)
        self._announce(spent, lines)
        self.model.train()
        # train.compile_mode records CUDA graphs: each step's replay overwrites the last one's graph outputs,
        # so the step is marked as a new one, and its logged scalars are copied out of graph memory
        graphs = cfg.compile and cfg.compile_mode in CUDA_GRAPH_MODES and self.device.type == "cuda"
        interrupts = Interrupts()
        try:
            interrupts.__enter__()
            while self.step < cfg.total_steps and not spent:
                torch.manual_seed(step_seed(cfg.seed, info.rank, self.step))
                try:
                    batch = next(it)
                except StopIteration:
                    break
                out_of_time = self._train_step(batch, window, t_fit, graphs)
                if bar is not None:
                    bar.update(1)
                last = self.step >= cfg.total_steps or out_of_time
                if (cfg.log_every and self.step % cfg.log_every == 0) or last:
                    self._log_step(window, result, logs, t0, bar, lines, last=last)
                    t0 = time.perf_counter()
                stop = self._eval_step(window, result, logs, lines, last=last)
                if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and self._last_saved != self.step:
                    result.last_checkpoint = self._checkpoint(window, result)
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
            logs.close()
        if self._last_saved != self.step:  # the same on every rank
            result.last_checkpoint = self._checkpoint(window, result)
        else:
            window.absorb(result.history)
        if result.last_checkpoint is None:  # nothing new written: the checkpoint this run stands at
            result.last_checkpoint = ckpt.resolve_checkpoint(self.ckpt_dir)
        if result.history:  # (every rank took the same steps)
            result.last_step = global_record(result.history[-1], self._last_weight, info)
        result.step, result.best_step, result.best_metric = self.step, self.best_step, self.best_metric
        return result

    # ------------------------------------------------------------------ fit's steps
    def _begin(self, resume: bool) -> Path | None:
        """Resume from the newest readable checkpoint, or (``resume=False``) set the previous run aside and
        return where it went; then set aside the damaged checkpoints a resume passed over, and seed a fresh run."""
        info = self.info
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
            seed_everything(self.cfg.seed + info.rank)
        return archived

    def _open_logs(self) -> RunLogs:
        """The run's config beside the checkpoints, its logs cut back to this step, TensorBoard (rank 0)."""
        logs = RunLogs(self.wd.root / "train_log.jsonl", self.wd.root / "eval_log.jsonl", self.info.is_main)
        if self.info.is_main:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.ckpt_dir / "config.json", self.config_dict)
            truncate_log(logs.train, self.step)
            truncate_log(logs.evals, self.step)  # one record per evaluation: step, metrics, best
        if self.cfg.tensorboard and self.info.is_main:
            from torch.utils.tensorboard import SummaryWriter  # local: TensorBoard is loaded only when asked for

            logs.writer = SummaryWriter(str(self.wd.root / "tb"))
        return logs

    def _announce(self, spent: bool, lines: ProgressLines | None) -> None:
        """Say (rank 0) when there is nothing to train, else where the progress lines come."""
        cfg = self.cfg
        if self.step >= cfg.total_steps and self.info.is_main:
            print(f"[genrec.train] the run is already at step {self.step} of train.total_steps={cfg.total_steps}: "
                  "nothing to train (raise train.total_steps to go on, or --no-resume to start afresh)",
                  file=sys.stderr)
        if spent and self.info.is_main:
            print(f"[genrec.train] the run's time budget is spent ({self._elapsed / 60:.1f} of train.max_minutes="
                  f"{cfg.max_minutes:g} used at step {self.step}): no step taken; raise train.max_minutes to go on",
                  file=sys.stderr)
        if lines is not None and self.step < cfg.total_steps and not spent:
            lines.begin(cfg.log_every)

    def _train_step(self, batch: Any, window: LogWindow, t_fit: float, graphs: bool) -> bool:
        """One optimiser step on ``batch``, its terms queued in ``window``; returns whether the time is up."""
        cfg, info = self.cfg, self.info
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
        n_items = float(out["n_items"]) if "n_items" in out else float(leading_size(batch))
        n_tokens = float(out["n_tokens"]) if "n_tokens" in out else 0.0
        n_global = float(out["n_items_global"]) if "n_items_global" in out else None
        to_backward, share, weight = step_loss(loss, n_items, n_global, info)
        to_backward.backward()
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
        terms = {"loss": loss.detach().float(), **terms}
        if share != 1.0:  # this rank's shares of the global values, scaled for the log window (step_loss)
            terms = {k: v * share for k, v in terms.items()}
        terms["grad_norm"] = grad_norm.detach().float()  # (the same on every rank)
        if graphs:
            terms = {k: v.clone() for k, v in terms.items()}
        window.add(self.step, terms, n_items, n_tokens, weight=weight)
        self._last_weight = weight
        return out_of_time

    def _log_step(self, window: LogWindow, result: TrainResult, logs: RunLogs, t0: float, bar: Any,
                  lines: ProgressLines | None, *, last: bool) -> None:
        """Close the log window opened at ``t0``: every rank's means and throughput into the log, TensorBoard,
        the bar and the progress lines (rank 0); a non-finite loss stops the run."""
        info = self.info
        window.absorb(result.history)
        means, _ = window.means(info)
        dt = max(time.perf_counter() - t0, 1e-9)
        rates, _ = all_reduce_weighted({"items_per_s": window.items / dt, "tokens_per_s": window.tokens / dt},
                                       1.0, info)
        rates = {k: v * info.world_size for k, v in rates.items()}  # sum over ranks
        lr = float(self.scheduler.get_last_lr()[0])
        if not math.isfinite(means.get("loss", 0.0)):
            raise GenrecError(f"training loss became non-finite in the log window ending at step "
                              f"{self.step}: {means}")
        if torch.cuda.is_available() and self.device.type == "cuda":  # the run's peak so far, this rank
            rates["peak_mem_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        if info.is_main:
            logs.append(logs.train, {"step": self.step, "lr": lr, **means, **rates})
            logs.scalars("train", {**means, **rates, "lr": lr}, self.step)
            if bar is not None:
                post = {"loss": f"{means.get('loss', float('nan')):.4f}", "items/s": f"{rates['items_per_s']:.0f}"}
                if window.tokens:
                    post["tok/s"] = f"{rates['tokens_per_s']:.0f}"
                bar.set_postfix(post)
            if lines is not None:
                lines.step(self.step, means.get("loss", float("nan")), rates["items_per_s"], last=last)
        window.clear()

    def _eval_step(self, window: LogWindow, result: TrainResult, logs: RunLogs, lines: ProgressLines | None, *,
                   last: bool) -> bool:
        """Evaluate when due (every ``eval_every`` steps and at the last), log it, and keep an improvement as
        the BEST checkpoint; returns whether early stopping says stop."""
        cfg = self.cfg
        if self.eval_fn is None or not ((cfg.eval_every and self.step % cfg.eval_every == 0) or last):
            return False
        metrics = self.evaluate()
        result.evals.append({"step": self.step, **metrics})
        logs.scalars("eval", metrics, self.step)
        improved, stop = self._early_stop_update(metrics)
        if lines is not None:
            lines.evaluated(self.step, metrics, improved)
        if self.info.is_main:
            logs.append(logs.evals, {"step": self.step, **metrics, "best": improved})
        if improved:
            result.last_checkpoint = self._checkpoint(window, result, mark_best=True)
        return stop

    def _checkpoint(self, window: LogWindow, result: TrainResult, mark_best: bool = False) -> Path | None:
        """:meth:`save`, with every rank's open log window summed into the state it writes (all ranks call it)."""
        window.absorb(result.history)
        self._log_window = window.state(self.info)
        return self.save(mark_best=mark_best)

    def _interrupted(self, interrupts: Interrupts) -> bool:
        """Whether a signal asks the loop to stop after this step -- on every rank at the same step: with
        several processes the flag is all-reduced, on a GPU at log boundaries only (a host sync per step would
        stall the stream; its steps take milliseconds), on the CPU every step (a slow step x log_every can outlast
        the 30 s torchrun gives its workers after a Ctrl-C before killing them, checkpoint unwritten)."""
        if self.info.world_size <= 1:
            return interrupts.caught is not None
        if self.device.type != "cpu" and not (self.cfg.log_every and self.step % self.cfg.log_every == 0):
            return False
        return any_rank(interrupts.caught is not None, self.info)
