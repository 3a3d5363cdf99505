"""torchrun / DDP plumbing: init from env, wrap, shard batches by rank, reduce metrics by count.

Non-standard: metrics are reduced as ``Σ_r value_r·count_r / Σ_r count_r`` (the global mean
over items), never as a mean of per-rank means; and :func:`count_weighted_loss` rescales each
rank's mean loss by ``count_r·W / Σ count`` so that DDP's gradient *averaging* yields exactly
the gradient of the global per-item mean even when ranks hold different numbers of targets.
gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from genrec.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = ""
    device: torch.device = torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(pref: str = "auto", local_rank: int = 0) -> torch.device:
    if pref == "cpu" or (pref == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("config key 'device': 'cuda' requested but no CUDA device is available")
    return torch.device("cuda", local_rank)


def launched_world_size() -> int:
    """The process count torchrun launched this run with (its WORLD_SIZE; 1 in a plain process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """This process's rank as torchrun launched it (its RANK; 0 in a plain process)."""
    return int(os.environ.get("RANK", "0"))


def group_initialized() -> bool:
    """Whether a process group is up in this process (torchrun's, once :func:`init_distributed` ran)."""
    return dist.is_available() and dist.is_initialized()


def init_distributed(device: str = "auto", *, timeout_s: float = 600.0) -> DistInfo:
    """Read torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK); init the process group if world > 1.

    Safe to call twice and in a plain ``python`` process (returns a single-rank DistInfo).
    """
    world = launched_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    if world <= 1:
        return DistInfo(0, 1, 0, "", dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        timeout = _dt.timedelta(seconds=timeout_s)
        if dev.type == "cuda":
            dist.init_process_group(backend=backend, timeout=timeout, device_id=dev)
        else:
            dist.init_process_group(backend=backend, timeout=timeout)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend, dev)


def current() -> DistInfo:
    """DistInfo of an already initialised process group (or single-process)."""
    if dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend())
        lr = int(os.environ.get("LOCAL_RANK", "0"))
        dev = torch.device("cuda", lr) if backend == "nccl" else torch.device("cpu")
        return DistInfo(r, w, lr, backend, dev)
    return DistInfo()


def cleanup() -> None:
    """Tear the process group down; all ranks meet first (gloo aborts if one leaves early)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(device: str = "auto") -> Iterator[DistInfo]:
    """torchrun's process group for a block: set up here unless one is up, and then torn down when the block ends
    without an error (every rank meets first). One run (:func:`genrec.recipes.training.train_run`) holds it, and so
    can several in a row (a warm start's setting aside and its run; the two phases of ``retrieval_first``), which
    then share it. A plain process: a single-rank DistInfo, nothing set up."""
    own = not group_initialized()
    info = init_distributed(device)
    yield info
    if own:
        cleanup()


def barrier(info: DistInfo) -> None:
    if info.is_distributed:
        dist.barrier()


def wrap_model(module: nn.Module, info: DistInfo, *, find_unused_parameters: bool = False) -> nn.Module:
    """DistributedDataParallel around ``module`` when world > 1 (parameters broadcast from rank 0)."""
    if not info.is_distributed:
        return module
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(module, device_ids=ids, find_unused_parameters=find_unused_parameters)


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous ``[start, end)`` of rank's share of ``n`` rows (first ``n % W`` ranks get one more)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world size {world_size}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_batch(batch: Any, rank: int, world_size: int) -> Any:
    """Slice every tensor (and list) in a nested batch along dim 0 to this rank's share.

    All sliced objects must have the same leading size; non-sequence leaves are passed through.
    """
    if world_size == 1:
        return batch
    sizes: set[int] = set()

    def size_of(x: Any) -> None:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            sizes.add(x.shape[0])
        elif isinstance(x, Mapping):
            for v in x.values():
                size_of(v)
        elif isinstance(x, (list, tuple)) and x and isinstance(x[0], (torch.Tensor, Mapping, list, tuple)):
            for v in x:
                size_of(v)

    size_of(batch)
    if len(sizes) != 1:
        raise ValueError(f"cannot shard a batch whose tensors have different leading sizes {sorted(sizes)}")
    lo, hi = shard_bounds(sizes.pop(), rank, world_size)

    def cut(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return x[lo:hi]
        if isinstance(x, Mapping):
            return {k: cut(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(cut(v) for v in x)
        if isinstance(x, list):
            return [cut(v) for v in x]
        return x

    return cut(batch)


def all_reduce_sum(x: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum over ranks (returns a new tensor; identity on a single process)."""
    y = x.detach().clone()
    if info.is_distributed:
        if info.backend == "nccl":
            y = y.to(info.device)
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def global_sum(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over the ranks of the process group, without gradient; ``x`` itself (no copy, no
    collective) when there is no group or one rank. ``x`` lives on the group's device (CPU for gloo)."""
    if not group_initialized() or dist.get_world_size() == 1:
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def all_reduce_weighted(values: Mapping[str, float], count: float, info: DistInfo) -> tuple[dict[str, float], float]:
    """Global per-item means ``Σ v_r·n_r / Σ n_r`` of each named value, and the global count ``Σ n_r``.

    Every rank must pass the same keys in the same order.
    """
    keys = list(values)
    t = torch.tensor([values[k] * count for k in keys] + [count], dtype=torch.float64)  # [K+1]
    t = all_reduce_sum(t, info).cpu()
    total = float(t[-1])
    if total <= 0:
        return {k: float("nan") for k in keys}, 0.0
    return {k: float(t[i]) / total for i, k in enumerate(keys)}, total


def count_weighted_loss(loss: torch.Tensor, count: torch.Tensor | float, info: DistInfo) -> torch.Tensor:
    """Rescale a rank's mean loss so DDP's gradient average equals the gradient of the global mean.

    ``loss_r · n_r · W / Σ n``: averaging over W ranks gives ``Σ n_r·loss_r / Σ n``.
    """
    if not info.is_distributed:
        return loss
    n = torch.as_tensor(count, dtype=torch.float64).reshape(1)
    total = float(all_reduce_sum(n, info).cpu()[0])
    if total <= 0:
        return loss * 0.0
    return loss * (float(n[0]) * info.world_size / total)


def step_loss(loss: torch.Tensor, n_items: float, n_global: float | None,
              info: DistInfo) -> tuple[torch.Tensor, float, float]:
    """What a training step backpropagates so that DDP's gradient average is the global batch's gradient, the
    factor its logged terms take, and its weight in the log window.

    ``n_global`` None: ``loss`` is one mean over this rank's ``n_items`` targets, count-weighted
    (:func:`count_weighted_loss`); the terms stay as they are, weighted by ``n_items``. Else the step divided its
    sums by their counts over every rank itself and ``n_global`` is Σ_r n_items: ``loss`` is this rank's share
    (Σ over ranks = the global batch's loss), backpropagated × W (DDP averages); its terms × W, weighted by
    ``n_global / W``, so that the window's count-weighted all-reduce adds the shares up.
    """
    if n_global is None:
        return count_weighted_loss(loss, n_items, info), 1.0, n_items
    w = float(info.world_size)
    return (loss * w if w != 1.0 else loss), w, n_global / w


def rank0_value(x: float, info: DistInfo) -> float:
    """Rank 0's ``x`` on every rank (one float64 broadcast; ``x`` itself when not distributed)."""
    if not info.is_distributed:
        return x
    t = torch.tensor([x], dtype=torch.float64, device=info.device)
    dist.broadcast(t, src=0)
    return float(t.item())


def any_rank(flag: bool, info: DistInfo) -> bool:
    """Whether ``flag`` is set on any rank (one all-reduce; ``flag`` itself when not distributed)."""
    if not info.is_distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank. JSON values only (sent as UTF-8 bytes, no pickle)."""
    if not info.is_distributed:
        return obj
    dev = info.device if info.backend == "nccl" else torch.device("cpu")
    data = json.dumps(obj).encode() if info.rank == src else b""
    n = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    dist.broadcast(n, src=src)
    buf = torch.zeros(int(n.item()), dtype=torch.uint8, device=dev)
    if info.rank == src:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src=src)
    return json.loads(bytes(buf.cpu().tolist()).decode())


# ---------------------------------------------------------------------------- a step on the device

def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors, mappings, tuples, lists, dataclasses, anything with ``.to``) on ``device``."""
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


def leading_size(batch: Any) -> int:
    """The leading dimension of a batch's first tensor (its item count when a step does not say)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, Mapping):
        for v in batch.values():
            return leading_size(v)
    if isinstance(batch, (list, tuple)) and batch:
        return leading_size(batch[0])
    return 1


class StepModule(nn.Module):
    """Routes ``forward`` to ``training_step`` so DDP's hooks see the call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        return self.model.training_step(batch)  # type: ignore[operator]
