"""A training run's bookkeeping beside its checkpoints: the log files (cut back to the checkpoint a run
resumes from), what a resume may change in the configuration, the previous run set aside on a fresh start,
and the open log window (per-step terms queued on the device, summed by items, saved with each checkpoint
so that a resumed run logs the window the uninterrupted run logs)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from genrec.errors import ConfigError
from genrec.train import checkpoint as ckpt
from genrec.train.distributed import DistInfo, all_reduce_weighted
from genrec.workdir import WorkDir, atomic_write_bytes

__all__ = ["RUN_FILES", "LogWindow", "RunLogs", "archive_previous_run", "check_resume_config", "config_changes",
           "global_record", "truncate_log"]


def truncate_log(path: Path, step: int) -> None:
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


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
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


def check_resume_config(found: Path, changed: list[str]) -> None:
    """Refuse a resume of checkpoint ``found`` when ``changed`` (:func:`config_changes`) holds a model key that
    changes the parameters or the function, or a run key that changes what the model learns from."""
    model_keys = [k for k in changed if k.startswith("model.") and k not in _RESUME_FREE_MODEL]
    fixed = [k for k in changed if k in _RESUME_FIXED]
    if model_keys or fixed:
        raise ConfigError(f"cannot resume {found}: {', '.join(model_keys + fixed)} changed since it was written "
                          f"(the model's shape or the meaning of its training data would change mid-run); "
                          f"keep the run's values, or start afresh with --no-resume (the old run is kept)")


@dataclass
class RunLogs:
    """The run's JSON-lines logs (``train`` per log step, ``evals`` per evaluation; rank 0 writes) and the
    TensorBoard writer (with ``train.tensorboard``)."""

    train: Path
    evals: Path
    is_main: bool
    writer: Any = None

    @staticmethod
    def append(path: Path, record: Mapping[str, Any]) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        if self.writer is not None:
            for k, v in values.items():
                self.writer.add_scalar(f"{prefix}/{k}", v, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class LogWindow:
    """The log window open since the last log step: each step's scalar terms queued on the device (one host
    sync per window, not per step), their sums weighted by the step's item count, and the throughput
    counters. Starts from a checkpoint's saved window (global sums, held by rank 0 alone so that the
    all-reduce at the next log step counts them once)."""

    def __init__(self, saved: Mapping[str, Any], is_main: bool) -> None:
        self.pending: list[tuple[int, dict[str, torch.Tensor], float]] = []
        self.sum: dict[str, float] = dict(saved.get("sum", {})) if is_main else {}
        self.n = float(saved.get("n", 0.0)) if is_main else 0.0
        self.items = self.tokens = 0.0

    def add(self, step: int, terms: dict[str, torch.Tensor], n_items: float, n_tokens: float, *,
            weight: float | None = None) -> None:
        """Queue a step's terms, weighted in the window by ``weight`` (default ``n_items``); the items and tokens
        count towards the throughput."""
        self.pending.append((step, terms, n_items if weight is None else weight))
        self.items += n_items
        self.tokens += n_tokens

    def absorb(self, history: list[dict[str, float]]) -> None:
        """The queued steps into ``history`` and the window's sums (one host sync)."""
        for r in drain(self.pending):
            n = r.pop("_n")
            history.append(r)
            for k, v in r.items():
                if k != "step":
                    self.sum[k] = self.sum.get(k, 0.0) + v * n
            self.n += n

    def means(self, info: DistInfo) -> tuple[dict[str, float], float]:
        """(every rank's item-weighted mean of each term, the items they sum over)."""
        return all_reduce_weighted({k: v / max(self.n, 1e-12) for k, v in sorted(self.sum.items())}, self.n, info)

    def state(self, info: DistInfo) -> dict[str, Any]:
        """The window summed over every rank, as a checkpoint saves it (all ranks call it)."""
        means, total = self.means(info)
        return {"sum": {k: m * total for k, m in means.items()}, "n": total} if total > 0 else {}

    def clear(self) -> None:
        self.sum.clear()
        self.n, self.items, self.tokens = 0.0, 0.0, 0.0


def global_record(record: Mapping[str, float], weight: float, info: DistInfo) -> dict[str, float]:
    """A step's record in a rank's history over every rank: the ``weight``-weighted mean of each value (the
    weight the step had in the log window); the record itself in one process. All ranks call it."""
    if not info.is_distributed:
        return dict(record)
    means, _ = all_reduce_weighted({k: v for k, v in record.items() if k != "step"}, weight, info)
    return {"step": record["step"], **means}


def drain(pending: list[Any]) -> list[dict[str, float]]:
    """Materialise queued per-step terms (one host sync per log window, not per step)."""
    rows = []
    for step, terms, n in pending:
        vals = torch.stack(list(terms.values())).cpu().tolist()
        rows.append({"step": step, **dict(zip(terms.keys(), vals)), "_n": n})
    pending.clear()
    return rows
