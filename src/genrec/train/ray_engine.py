"""``data.engine=ray``: Ray Data workers read, join and batch the bucket windows; the trainer takes the batches.

The streaming order and the window-to-batches step are :mod:`genrec.train.stream`'s; this engine runs
:func:`genrec.train.stream.window_pieces` on a pool of Ray actors (each opens the tables and the join once) over
a Ray Data pipeline of the epoch's windows, with ``preserve_order`` so the pieces come back in the order the
embedded engine makes them: the same batches (tested). Ray Data's streaming executor keeps a bounded number of
windows in flight (its backpressure), and the trainer's process only unpickles finished batches and joins the
few examples of a batch that straddles two windows.

Ray is an optional dependency (``pip install 'genrec[ray]'``). :meth:`RayEngine.__enter__` connects to the
cluster named by ``RAY_ADDRESS`` when one is set (``ray start --head`` on the machine, one connection per
torchrun rank), else starts a local Ray with ``num_cpus`` CPUs, which it shuts down again on exit; a Ray that
the caller already initialised is used as it is. Workers import genrec: a local Ray inherits the trainer's
environment (``PYTHONPATH`` included); a remote cluster needs genrec installed on its nodes.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from genrec.catalog import ItemCatalog
from genrec.data.splits import SplitSpec
from genrec.data.store import TableStore
from genrec.errors import ConfigError
from genrec.train.stream import Piece, StreamSpec, WindowReader, WindowTask, window_pieces

__all__ = ["RayEngine"]

MIN_TASKS = 16
"""Windows per Ray Data pipeline at least (whole epochs are added until there are as many)."""


def _import_ray() -> Any:
    try:
        import ray  # the optional `ray` extra: only data.engine=ray needs it
        import ray.data
    except ImportError as e:
        raise ConfigError("config key 'data.engine': 'ray' needs Ray Data: pip install 'genrec[ray]' "
                          "(or 'ray[data]')") from e
    return ray


class _WindowWorker:
    """One Ray actor: the tables, the join and the catalogue's ids opened once; one window per call."""

    def __init__(self, tables_dir: str, catalog_conf: dict[str, Any] | None, split: SplitSpec, seed: int,
                 item_ids: np.ndarray, min_len: int, spec: StreamSpec) -> None:
        catalog = ItemCatalog(item_ids=item_ids, feats=torch.zeros(len(item_ids), 0), codes=None)
        self.reader = WindowReader(TableStore(tables_dir, catalog_conf), split, catalog, seed=seed, min_len=min_len)
        self.spec = spec

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for raw in batch.column("task").to_pylist():
            task: WindowTask = pickle.loads(raw)
            for piece in window_pieces(task, self.reader.read(task.buckets), self.spec):
                yield pa.table({"piece": pa.array([pickle.dumps(piece, protocol=5)], pa.large_binary())})


class RayEngine:
    """Runs the windows on ``workers`` Ray actors; a context manager around Ray's lifetime (module notes)."""

    def __init__(self, tables_dir: str | Path, catalog_conf: dict[str, Any] | None, split: SplitSpec,
                 item_ids: np.ndarray, *, seed: int, min_len: int = 2, workers: int = 2,
                 num_cpus: int | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"config key 'data.ray_workers': must be >= 1, got {workers}")
        self.worker_args = dict(tables_dir=str(tables_dir), catalog_conf=catalog_conf, split=split, seed=seed,
                                item_ids=np.asarray(item_ids, dtype=np.int64), min_len=min_len)
        self.workers, self.num_cpus = workers, num_cpus
        self._started = False

    def __enter__(self) -> "RayEngine":
        ray = _import_ray()
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS") or None
            ray.init(address=address, num_cpus=None if address else self.num_cpus, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            _import_ray().shutdown()
            self._started = False

    def run(self, epochs: Iterator[list[WindowTask]], spec: StreamSpec) -> Iterator[Piece]:
        """One Ray Data pipeline per run of whole epochs holding at least ``MIN_TASKS`` windows (the actors
        start once per pipeline: small epochs share one)."""
        ray = _import_ray()
        if not ray.is_initialized():
            raise ConfigError("data.engine=ray: Ray is not running (use the RayEngine as a context manager)")
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # the pieces in the tasks' order
        ctx.enable_progress_bars = False
        while True:
            tasks: list[WindowTask] = []
            while len(tasks) < MIN_TASKS:
                tasks += next(epochs)
            ds = ray.data.from_items([{"task": pickle.dumps(t)} for t in tasks], override_num_blocks=len(tasks))
            ds = ds.map_batches(_WindowWorker, batch_size=1, batch_format="pyarrow", num_cpus=1,
                                compute=ray.data.ActorPoolStrategy(size=self.workers),
                                fn_constructor_kwargs={**self.worker_args, "spec": spec})
            for block in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=1):
                for raw in block.column("piece").to_pylist():
                    yield pickle.loads(raw)
