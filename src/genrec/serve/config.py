"""``genrec serve``'s configuration (:class:`ServeConfig`) and the machine defaults for its threads."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from genrec.errors import ConfigError

__all__ = ["DEFAULT_MICRO_BATCH", "DEFAULT_MICRO_BATCH_POLICY", "ServeConfig", "default_fronts", "default_threads",
           "default_torch_threads"]

DEFAULT_MICRO_BATCH = 32
"""Concurrent requests grouped into one forward by default (``--micro-batch``; 1 = off): the largest
default batch bucket (:mod:`genrec.infer.buckets`), so every batch replays a captured graph on the GPU."""
DEFAULT_MICRO_BATCH_POLICY = "busy"
"""The default grouping (:mod:`genrec.serve.batcher`): a lone request runs at once; requests that queue while a
batch runs form the next batch; one forward at a time. Measured on the CPU box only (``python benchmarks/bench_serve.py
RUN --clients 1,16,64 --modes one,default,batch32``): level with no batching at one client, 6-7x its QPS at 64
clients, where the timed policy (groups running side by side) gave no more than no batching. On a GPU the load
captures a graph per batch size and history bucket up front (a longer start)."""


def default_threads(device: str = "cpu") -> int:
    """How many requests run inference at once when ``--threads`` is not given: ``min(4, os.cpu_count())``.

    Not 1 where there are 2 cores or more: on the 2-core CPU box one request thread (with torch's 2
    intra-op threads) stalled under other load, 1-25 QPS; a few request threads also keep a GPU fed while
    others do their host work. Beyond 4 they only queue on the GIL. The threads inside each forward are
    :func:`default_torch_threads`'s."""
    return min(4, max(1, os.cpu_count() or 1))


def default_fronts(device: str, *, workers: int = 1, micro_batch: int = DEFAULT_MICRO_BATCH,
                   micro_batch_policy: str = DEFAULT_MICRO_BATCH_POLICY, cpus: int | None = None) -> int:
    """``genrec serve``'s front processes when ``--fronts`` is not given: on a CUDA server whose engine micro-batches
    under the busy policy (``--workers 1``, ranking here or, with ``--two-process``, in its own process: the
    configurations measured), ``min(4, cores // 4)`` (at least 1); else 0 (one process does HTTP and the model).

    Measured on an H200 (2026-12-07; MovieLens 100K gpu-base model, 1,000-item histories, beam 60, 64 clients): 1,188
    requests a second with 4 fronts against 668 without. On a CPU server they stay opt-in: measured only on the 2-core
    box at 64 clients (2 fronts 760-772 against 600-624 QPS), not at one client nor on a larger machine. Not beside
    ``--workers`` (which fronts replace). Two-process mode on one H100 (Beauty gpu-base model, same shapes):
    1,252 requests a second behind 4 fronts (2026-12-07, 78e15b2), 539-635 without (2026-12-08)."""
    if (not str(device).startswith("cuda") or workers > 1 or micro_batch <= 1
            or micro_batch_policy != "busy"):
        return 0
    n = (os.cpu_count() if cpus is None else cpus) or 1
    return max(1, min(4, n // 4))


def default_linger_ms(device: str, fronts: int, micro_batch_policy: str = DEFAULT_MICRO_BATCH_POLICY) -> float:
    """``--micro-batch-linger-ms`` when not given: 3 ms on a CUDA server with front processes micro-batching under
    the busy policy (the configuration measured), else 0 (off).

    Measured as ``fronts4l3`` against ``fronts4`` (1,000-item histories, beam 60, bf16, 64 clients, one run each): on
    an H200 with the MovieLens 100K gpu-base model 1,334 against 1,188 requests a second, p99 77 against 99 ms
    (2026-12-07); on an H100 with the Beauty gpu-base model 1,483 against 1,202, p99 70 against 91 ms (2026-12-07,
    two bench invocations of one call). Level on the 2-core CPU box, where the model holds the engine 93% of the run:
    a lingering batch there only waits."""
    return 3.0 if str(device).startswith("cuda") and fronts > 0 and micro_batch_policy == "busy" else 0.0


def default_torch_threads(device: str = "cpu", threads: int | None = None, workers: int = 1) -> int:
    """torch's intra-op threads in a serving process when ``--torch-threads`` is not given; 0 = leave torch's
    default (a thread per core).

    CPU: ``os.cpu_count() // (threads * workers)``, at least 1, so that the forwards running side by side
    together use each core once instead of each spreading over every core. Measured on the 2-core CPU box
    (quickstart model, loopback, closed-loop clients, issue 38): 2 request threads x 1 torch thread gave
    75-106 QPS at 1 to 4 clients; the earlier 2 x 2 (torch's default) 41-46 QPS at 1 client and 75-83 at
    2 and 4. Re-measure: ``genrec bench serve RUN --duration 20 --concurrency 2`` against the same with
    ``--torch-threads 2`` (and ``--client httpx``). CUDA: 0, the forward runs on the GPU."""
    if str(device).startswith("cuda"):
        return 0
    t = default_threads(device) if threads is None else max(1, threads)
    return max(1, max(1, os.cpu_count() or 1) // (t * max(1, workers)))


DEFAULT_SWITCH_INTERVAL_MS = 0.5


def _switch_interval_ms() -> float:
    """``$GENREC_SWITCH_INTERVAL_MS``, else :data:`DEFAULT_SWITCH_INTERVAL_MS`; not a number: a :class:`ConfigError`
    naming the variable."""
    raw = os.environ.get("GENREC_SWITCH_INTERVAL_MS", "").strip()
    if not raw:
        return DEFAULT_SWITCH_INTERVAL_MS
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"$GENREC_SWITCH_INTERVAL_MS must be a number, got {raw!r}") from None


@dataclass
class ServeConfig:
    workdir: Path
    checkpoint: str | Path | None = None  # genrec.infer.load.find_checkpoint's rule (a name is re-read on reload)
    device: str = "cpu"
    two_process: bool = False
    max_body_bytes: int = 1 << 20
    threads: int = 0  # requests running inference at once; 0 = default_threads(device)
    # torch.set_num_threads in the serving process (serve(), app_from_env), 0 = leave torch's; the CLI's
    # default is default_torch_threads(device, threads, workers)
    torch_threads: int = 0
    # two-process KV-pool slots; a micro-batch is ranked in calls of this many rows. 0: max(16, micro_batch), one
    # ranking call a batch (with 16 slots a batch of 32 took two calls, one after the other)
    pool_slots: int = 0
    # two-process K/V pool: "cpu" = shared memory, the ranking process ranks on the CPU; "cuda" = the
    # pool on the server's GPU, shared through CUDA IPC handles, ranked there; "auto" = the server's device
    kv_pool_device: str = "auto"
    rank_timeout_s: float = 2.0
    stale_retries: int = 3
    pool_dir: Path | None = None
    micro_batch: int = DEFAULT_MICRO_BATCH  # > 1: group up to this many concurrent requests, 1: off
    # "busy": batch only requests that queued while a batch ran, no timer; "timed": the first request
    # of a group waits up to micro_batch_wait_ms for more (see genrec.serve.batcher)
    micro_batch_policy: str = DEFAULT_MICRO_BATCH_POLICY
    micro_batch_wait_ms: float = 2.0  # timed policy only
    # busy policy: a batch smaller than the batch two before it (its cohort's last) waits up to this long for more
    micro_batch_linger_ms: float = 0.0
    # micro-batched requests parse their histories before they queue and format their answers after, in their own
    # threads (the batch runs only the model); off: the batch does all three. It cost 10% at 64 clients on the
    # 2-core CPU box and 12% on an H100 (the moved work shares the engine's interpreter lock with the model's Python)
    host_overlap: bool = False
    # busy policy, one process: a batch hands the batcher on once it holds the model (if the next batch's cohort is
    # queued already), so the next batch forms and parses while this one runs and this one formats its answers while
    # the next one runs ($GENREC_PIPELINE=1; off: hand on when the batch ends)
    pipeline: bool = dataclasses.field(default_factory=lambda: os.environ.get("GENREC_PIPELINE", "") == "1")
    # the interpreter's thread switch interval in the engine process, ms ($GENREC_SWITCH_INTERVAL_MS; None: leave
    # Python's 5 ms): how long a thread that wants the lock (a batch back from waiting on the GPU) waits for one that
    # holds it. 0.5 ms gave 1.07-1.13x the QPS of Python's 5 ms at 64 clients on an H100 (two calls), level on a CPU
    switch_interval_ms: float | None = dataclasses.field(default_factory=_switch_interval_ms)
    gc_freeze: bool = True  # move the loaded bundle out of the GC's sight (see freeze_heap)
    # SID beam widths whose CUDA graphs (and the ranking shapes their unions give) are captured before serving, at
    # every batch bucket and history bucket: the widths the clients ask for. A width met first under load captures
    # its shapes then, each capture a stall of every batch queued behind it
    warm_beams: tuple[int, ...] = (20,)
    # /admin/reload needs "Authorization: Bearer <admin_token>" when set (default: $GENREC_ADMIN_TOKEN); unset,
    # it is open to whoever reaches the port (loopback by default)
    admin_token: str | None = dataclasses.field(default_factory=lambda: os.environ.get("GENREC_ADMIN_TOKEN") or None)
    workers: int = 1  # uvicorn worker processes (serve()'s argument): > 1 refuses /admin/reload (SIGHUP the main one)
    # print start-up lines on stderr (what was loaded, on which device, when it is ready): `genrec serve` does;
    # serve() sets the URL it listens on here, for the lines of --workers > 1 (each worker says when it is ready)
    announce: bool = False
    url: str | None = None

    @property
    def kv_slots(self) -> int:
        """The KV pool's slots: ``pool_slots``, or where that is 0, enough for a whole micro-batch (at least 16)."""
        return self.pool_slots if self.pool_slots > 0 else max(16, self.micro_batch)
