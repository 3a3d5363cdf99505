"""What a training run shows and hears while it runs: plain progress lines on stderr when it is not a
terminal (:class:`ProgressLines`; the tqdm bar otherwise) and SIGINT / SIGTERM handling that stops after the
step in progress with a checkpoint (:class:`Interrupts`)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from genrec.train.config import TrainConfig

__all__ = ["Interrupts", "ProgressLines", "open_progress"]


class Interrupts:
    """SIGINT / SIGTERM during :meth:`genrec.train.trainer.Trainer.fit`: the first one is noted and the loop stops at the end of
    the step in progress, after a checkpoint (preemption, Ctrl-C); a second one interrupts at once. Only the
    main thread can take signals; elsewhere this does nothing."""

    def __init__(self) -> None:
        self.caught: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.caught is not None:  # the second one: do not wait for the step
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.caught = signal.Signals(signum).name
        print(f"[genrec.train] {self.caught}: stopping after this step with a checkpoint (again to stop at once)",
              file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
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


class ProgressLines:
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


def open_progress(cfg: TrainConfig, is_main: bool, step: int) -> tuple[Any, ProgressLines | None]:
    """(a tqdm bar, plain progress lines): the bar on a terminal (or with progress="on"), the lines when
    stderr is not a terminal and progress="auto", neither with "off"; rank 0 only."""
    if cfg.progress == "off" or not is_main:
        return None, None
    if cfg.progress == "auto" and not sys.stderr.isatty():
        return None, ProgressLines(cfg.total_steps, step, cfg.progress_every_s, cfg.early_stopping.metric)
    from tqdm.auto import tqdm  # local: the bar is drawn on a terminal only

    return tqdm(total=cfg.total_steps, initial=step, desc="train", dynamic_ncols=True), None
