"""Cross-process KV pool with leased slots and seqlock reads (UniPinRec §4 serving; issue 6 item 3).

UniPinRec serves retrieval and ranking in separate processes that share one preallocated KV
pool (CUDA IPC handles exported to a file) whose slots are reused round-robin. Round-robin
reuse alone lets a slow reader copy a slot that a newer request has already overwritten. Here
every slot carries a **generation** counter in shared memory:

* ``lease()`` (under a process-shared lock: ``threading.Lock`` + ``fcntl.flock`` on the
  per-instance lock file) bumps the slot's generation to ``g`` and marks it not-ready; the
  caller owns ``(slot, g)``;
* ``write(lease, cache)`` claims the slot for writing (under the lock, only if ``gen`` is still
  ``g``; ``writer[slot]`` = pid), copies one request's K/V + metadata, then publishes
  ``ready[slot] = g``. ``lease`` never hands out a slot that is being written, so two writers
  never share a slot (found by the thread stress test: without the claim a superseded writer
  kept scribbling over the new lease's KV); a writer that died mid-write frees its slot;
* ``read(slot, g)`` checks ``gen == ready == g`` BEFORE copying and ``gen == g`` AFTER copying
  (a seqlock); any mismatch raises :class:`StaleSlotError`. A writer can only touch slot data
  after its lease bumped ``gen``, so a copy that overlaps a write always fails the second
  check: a reader never returns another request's KV. (x86 keeps stores and loads in order;
  weaker memory models would need explicit fences around the counter accesses.)

Non-standard: the pool is described by a per-instance JSON file (``pool.json``) so any process
can :meth:`KVPool.attach` by path — on CPU it names a ``multiprocessing.shared_memory``
block, on CUDA it carries the K/V storages' IPC handles (base64); the counters always live in
CPU shared memory. Layout ``K, V: [layers, slots, kv_heads, n_max, head_dim]``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.errors import ConfigError, GenrecError
from genrec.model.kv_cache import KVCache
from genrec.model.layout import TokenMeta
from genrec.workdir import atomic_write_json, read_json

__all__ = ["KVPool", "PoolSpec", "Lease", "StaleSlotError"]


class StaleSlotError(GenrecError):
    """The slot was re-leased (or not yet written) for this generation: retry or re-encode."""


@dataclass(frozen=True)
class PoolSpec:
    layers: int
    slots: int
    kv_heads: int
    n_max: int
    head_dim: int
    d_model: int
    dtype: str = "float32"
    device: str = "cpu"

    def validate(self) -> None:
        for f in ("layers", "slots", "kv_heads", "n_max", "head_dim", "d_model"):
            if int(getattr(self, f)) < 1:
                raise ConfigError(f"kv pool: {f} must be >= 1, got {getattr(self, f)}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ConfigError(f"kv pool: dtype must be float32|float16|bfloat16, got {self.dtype!r}")

    @property
    def kv_shape(self) -> tuple[int, int, int, int, int]:
        return (self.layers, self.slots, self.kv_heads, self.n_max, self.head_dim)


@dataclass(frozen=True)
class Lease:
    slot: int
    gen: int


# counters block (int64): gen, ready, active, n_tokens, length, has_ts, last_ts, writer (pid) [S] each; rr[1]
_CTR = ("gen", "ready", "active", "n_tokens", "length", "has_ts", "last_ts", "writer")


def _ctr_words(slots: int) -> int:
    return len(_CTR) * slots + 1


def _meta_words(spec: PoolSpec) -> int:
    return 3 * spec.slots * spec.n_max  # pos, kind, tok: [S, n_max] each


def _f32_words(spec: PoolSpec) -> int:
    return spec.slots * spec.d_model  # last_hidden [S, D]


def _kv_bytes(spec: PoolSpec) -> int:
    el = torch.empty((), dtype=getattr(torch, spec.dtype)).element_size()
    return 2 * int(np.prod(spec.kv_shape)) * el


class KVPool:
    """A preallocated K/V pool shared between processes; see the module docstring for the protocol."""

    def __init__(self, spec: PoolSpec, path: Path, shm: shared_memory.SharedMemory, owner: bool,
                 kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self.spec, self.path, self._shm, self.owner = spec, path, shm, owner
        buf = shm.buf
        s = spec.slots
        off = 0
        ctr = np.ndarray((_ctr_words(s),), dtype=np.int64, buffer=buf, offset=off)
        off += ctr.nbytes
        self._c = {name: ctr[i * s:(i + 1) * s] for i, name in enumerate(_CTR)}
        self._rr = ctr[len(_CTR) * s:]
        meta = np.ndarray((3, s, spec.n_max), dtype=np.int64, buffer=buf, offset=off)
        off += meta.nbytes
        self._meta = torch.from_numpy(meta)  # [3, S, n_max]
        hid = np.ndarray((s, spec.d_model), dtype=np.float32, buffer=buf, offset=off)
        off += hid.nbytes
        self._hidden = torch.from_numpy(hid)  # [S, D]
        if kv is None:  # CPU: K and V live in the same shared block
            dt = getattr(torch, spec.dtype)
            n = int(np.prod(spec.kv_shape))
            raw = torch.frombuffer(buf, dtype=torch.uint8, count=_kv_bytes(spec), offset=off)
            flat = raw.view(dt)
            kv = (flat[:n].view(spec.kv_shape), flat[n:].view(spec.kv_shape))
        self.k, self.v = kv  # [layers, slots, kv_heads, n_max, head_dim]
        self._tlock = threading.Lock()
        self._lock_path = path.with_suffix(".lock")

    # ------------------------------------------------------------------ create / attach / close
    @classmethod
    def create(cls, spec: PoolSpec, path: str | Path) -> "KVPool":
        """Allocate a pool and write its description to ``path`` (per instance; attach by path)."""
        spec.validate()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cuda = spec.device.startswith("cuda")
        nbytes = 8 * (_ctr_words(spec.slots) + _meta_words(spec)) + 4 * _f32_words(spec)
        nbytes += 0 if cuda else _kv_bytes(spec)
        name = f"genrec-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        np.ndarray((nbytes,), dtype=np.uint8, buffer=shm.buf)[:] = 0
        kv = None
        desc: dict[str, Any] = {"format": "genrec.kv_pool/1", "spec": asdict(spec), "shm": name}
        if cuda:
            dt = getattr(torch, spec.dtype)
            kv = (torch.zeros(spec.kv_shape, dtype=dt, device=spec.device),
                  torch.zeros(spec.kv_shape, dtype=dt, device=spec.device))
            desc["cuda_ipc"] = [_export_cuda(t) for t in kv]
        Path(path).with_suffix(".lock").touch()
        atomic_write_json(path, desc)
        return cls(spec, path, shm, owner=True, kv=kv)

    @classmethod
    def attach(cls, path: str | Path) -> "KVPool":
        """Open the pool described by ``path`` (written by :meth:`create` in another process)."""
        path = Path(path)
        desc = read_json(path)
        if desc.get("format") != "genrec.kv_pool/1":
            raise ConfigError(f"{path}: not a genrec KV pool description (format {desc.get('format')!r})")
        spec = PoolSpec(**desc["spec"])
        reg = resource_tracker.register
        resource_tracker.register = lambda *a, **k: None  # type: ignore[assignment]  # the creator owns its lifetime
        try:
            shm = shared_memory.SharedMemory(name=desc["shm"], create=False)
        finally:
            resource_tracker.register = reg  # type: ignore[assignment]
        kv: tuple[torch.Tensor, torch.Tensor] | None = None
        if "cuda_ipc" in desc:
            k_t, v_t = (_import_cuda(h, spec) for h in desc["cuda_ipc"])
            kv = (k_t, v_t)
        return cls(spec, path, shm, owner=False, kv=kv)

    def close(self) -> None:
        """Drop this process's mapping; the creator also unlinks the block and the description."""
        self._c = {}
        self.k = self.v = self._meta = self._hidden = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):
            self._shm.close()
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
            for p in (self.path, self._lock_path):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()

    # ------------------------------------------------------------------ leasing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock, open(self._lock_path, "a+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def lease(self, timeout: float = 10.0) -> Lease:
        """Take the next free slot round-robin (if all are leased, the next one not being written)."""
        s = self.spec.slots
        t_end = time.monotonic() + timeout
        while True:
            with self._locked():
                slot = self._pick(s)
                if slot >= 0:
                    return self._take(slot)
            if time.monotonic() > t_end:
                raise StaleSlotError(f"kv pool: every one of {s} slots is being written (timeout {timeout}s)")
            time.sleep(0.0005)

    def _writing(self, slot: int) -> bool:
        pid = int(self._c["writer"][slot])
        if pid == 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:  # the writer died mid-write: the slot is free again (never published)
            self._c["writer"][slot] = 0
            return False
        except PermissionError:
            pass
        return True

    def _pick(self, s: int) -> int:
        start = int(self._rr[0])
        fallback = -1
        for i in range(s):
            cand = (start + i) % s
            if self._writing(cand):
                continue  # never two writers on one slot: a superseded writer could scribble on the new KV
            if not self._c["active"][cand]:
                return cand
            if fallback < 0:
                fallback = cand
        return fallback

    def _take(self, slot: int) -> Lease:
        self._rr[0] = slot + 1
        self._c["ready"][slot] = 0  # not readable until written
        g = int(self._c["gen"][slot]) + 1
        self._c["gen"][slot] = g  # bumped BEFORE any data write: the seqlock's guard
        self._c["active"][slot] = 1
        return Lease(slot, g)

    def release(self, lease: Lease) -> None:
        """The lease holder is done with the slot (it may be reused first). Idempotent."""
        with self._locked():
            if int(self._c["gen"][lease.slot]) == lease.gen:
                self._c["active"][lease.slot] = 0

    def occupancy(self) -> int:
        """Slots currently leased and not released."""
        return int(self._c["active"].sum())

    def generation(self, slot: int) -> int:
        return int(self._c["gen"][slot])

    # ------------------------------------------------------------------ write / read
    def write(self, lease: Lease, cache: KVCache) -> None:
        """Copy one request's cache (batch 1) into the leased slot, then publish it."""
        if cache.batch_size != 1:
            raise ValueError(f"kv pool write: one request per slot (batch 1), got batch {cache.batch_size}")
        self.write_rows([lease], cache)

    def write_rows(self, leases: list[Lease], cache: KVCache, lo: int = 0) -> None:
        """Rows ``lo .. lo + len(leases) - 1`` of a batch's cache, row j into ``leases[j]``'s slot, then each
        published: the copies of all rows, then one device synchronisation (not one per row)."""
        sp, c = self.spec, self._c
        for lease in leases:
            self._check_slot(lease.slot)
        if len({x.slot for x in leases}) != len(leases):
            raise ValueError("kv pool write: one slot per row (the leases repeat a slot)")
        if cache.meta is None or cache.lengths is None or cache.last_hidden is None:
            raise ValueError("kv pool write: cache was not filled by encode_history")
        if not leases or lo < 0 or lo + len(leases) > cache.batch_size:
            raise ValueError(f"kv pool write: rows {lo}..{lo + len(leases) - 1} of a batch of {cache.batch_size}")
        n = cache.n_tokens
        if n > sp.n_max or cache.n_layers != sp.layers:
            raise ValueError(f"kv pool write: cache has {cache.n_layers} layers x {n} tokens; pool holds "
                             f"{sp.layers} x {sp.n_max}")
        with self._locked():  # claim the slots for writing only if our leases are still the current ones
            for lease in leases:
                s = lease.slot
                if int(c["gen"][s]) != lease.gen:
                    raise StaleSlotError(f"slot {s}: lease gen {lease.gen} was superseded by {int(c['gen'][s])}")
                if int(c["ready"][s]) == lease.gen:
                    raise ValueError(f"slot {s} gen {lease.gen}: already written (one write per lease)")
            for lease in leases:
                c["writer"][lease.slot] = os.getpid()
        try:
            self._write_data(leases, cache, lo, n)
        finally:
            for lease in leases:
                c["writer"][lease.slot] = 0

    def _write_data(self, leases: list[Lease], cache: KVCache, lo: int, n: int) -> None:
        sp, c, m = self.spec, self._c, len(leases)
        slots = [x.slot for x in leases]
        idx = torch.tensor(slots, dtype=torch.int64, device=self.k.device)
        for i in range(sp.layers):
            k, v = cache.k[i][lo:lo + m], cache.v[i][lo:lo + m]  # [m, H, n, Dh]
            if k.shape != (m, sp.kv_heads, n, sp.head_dim):
                raise ValueError(f"kv pool write: layer {i} keys {tuple(k.shape[1:])} != {(sp.kv_heads, n, sp.head_dim)}")
            self.k[i, idx, :, :n] = k.to(self.k.dtype)
            self.v[i, idx, :, :n] = v.to(self.v.dtype)
        assert cache.meta is not None and cache.last_hidden is not None and cache.lengths is not None
        rows = slice(lo, lo + m)
        host = torch.as_tensor(slots)
        self._meta[:, host, :n] = torch.stack([cache.meta.pos[rows], cache.meta.kind[rows], cache.meta.tok[rows]]).cpu()
        self._hidden[host] = cache.last_hidden[rows].float().cpu()
        lengths = cache.lengths[rows].cpu().tolist()
        last_ts = cache.last_ts[rows].cpu().tolist() if cache.last_ts is not None else [0] * m
        if self.k.is_cuda:
            torch.cuda.synchronize(self.k.device)
        for j, lease in enumerate(leases):
            s = lease.slot
            c["n_tokens"][s] = n
            c["length"][s] = int(lengths[j])
            c["has_ts"][s] = int(cache.last_ts is not None)
            c["last_ts"][s] = int(last_ts[j])
        for lease in leases:
            if int(c["gen"][lease.slot]) != lease.gen:  # re-leased while we wrote: never publish
                raise StaleSlotError(f"slot {lease.slot}: re-leased while gen {lease.gen} was being written")
        for lease in leases:
            c["ready"][lease.slot] = lease.gen

    def read(self, slot: int, gen: int, *, device: str | torch.device | None = None,
             layout: str = "pinger") -> KVCache:
        """A private copy of slot ``slot``'s cache if it still holds generation ``gen``; else StaleSlotError."""
        return self.read_rows([slot], [gen], device=device, layout=layout)

    def read_rows(self, slots: list[int], gens: list[int], *, device: str | torch.device | None = None,
                  layout: str = "pinger") -> KVCache:
        """Private copies of the slots' caches as one batch (row j from ``slots[j]``, which must still hold
        generation ``gens[j]``, else StaleSlotError), with one device synchronisation. The rows must hold the
        same number of tokens (the rows of one batched forward do)."""
        c = self._c
        if not slots or len(slots) != len(gens):
            raise ValueError(f"kv pool read: one generation per slot, got {len(slots)} slots, {len(gens)} gens")
        for slot, gen in zip(slots, gens):
            self._check_slot(slot)
            if int(c["gen"][slot]) != gen or int(c["ready"][slot]) != gen:
                raise StaleSlotError(f"slot {slot}: wanted gen {gen}, slot has gen {int(c['gen'][slot])} "
                                     f"(ready {int(c['ready'][slot])})")
        ns = {int(c["n_tokens"][s]) for s in slots}
        if len(ns) != 1:
            raise ValueError(f"kv pool read: the slots hold different token counts {sorted(ns)}")
        n = ns.pop()
        lengths = [int(c["length"][s]) for s in slots]
        has_ts = {int(c["has_ts"][s]) for s in slots}
        last_ts = [int(c["last_ts"][s]) for s in slots]
        dev = self.k.device if device is None else torch.device(device)
        idx = torch.tensor(slots, dtype=torch.int64, device=self.k.device)
        ks = [self.k[i, idx, :, :n].to(dev) for i in range(self.spec.layers)]  # [m, H, n, Dh], a gather: a copy
        vs = [self.v[i, idx, :, :n].to(dev) for i in range(self.spec.layers)]
        host = torch.as_tensor(slots)
        meta = self._meta[:, host, :n].clone()  # [3, m, n]
        hidden = self._hidden[host].clone()  # [m, D]
        if self.k.is_cuda:
            torch.cuda.synchronize(self.k.device)
        for slot, gen in zip(slots, gens):
            if int(c["gen"][slot]) != gen:  # the seqlock's second check
                raise StaleSlotError(f"slot {slot}: re-leased (gen {int(c['gen'][slot])}) while gen {gen} was read")
        if len(has_ts) != 1:
            raise ValueError("kv pool read: some slots carry a request time and some do not")
        return KVCache(ks, vs, TokenMeta(meta[0].to(dev), meta[1].to(dev), meta[2].to(dev)),
                       torch.tensor(lengths, dtype=torch.int64, device=dev), hidden.to(dev), layout,
                       torch.tensor(last_ts, dtype=torch.int64, device=dev) if has_ts.pop() else None)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.spec.slots:
            raise ValueError(f"slot: must be in [0, {self.spec.slots}), got {slot}")


# ---------------------------------------------------------------------------- CUDA IPC (GPU only)
def _export_cuda(t: torch.Tensor) -> dict[str, Any]:
    """IPC handle of a CUDA tensor's storage, JSON-encodable (bytes as base64)."""
    h = t.untyped_storage()._share_cuda_()  # (device, handle, size, offset, ref_handle, ref_offset, event, sync)
    enc = [base64.b64encode(x).decode() if isinstance(x, bytes) else x for x in h]
    kinds = ["b" if isinstance(x, bytes) else "v" for x in h]
    return {"handle": enc, "kinds": kinds, "shape": list(t.shape), "dtype": str(t.dtype).split(".")[-1]}


def _import_cuda(d: dict[str, Any], spec: PoolSpec) -> torch.Tensor:
    args = [base64.b64decode(x) if k == "b" else x for x, k in zip(d["handle"], d["kinds"])]
    # A process that attaches before any CUDA work has no CUDA state yet; torch's own rebuild of a
    # shared CUDA tensor initialises it first (the likely reason the attach never completed on the
    # H200 before this line; not yet re-measured on a GPU).
    torch.cuda.init()
    storage = torch.UntypedStorage._new_shared_cuda(*args)
    dt = getattr(torch, d["dtype"])
    t = torch.empty(0, dtype=dt, device=f"cuda:{int(args[0])}")
    t.set_(storage, 0, tuple(spec.kv_shape))  # type: ignore[call-overload]
    return t


def pool_spec_for(model_config: Any, slots: int, n_max: int, device: str = "cpu") -> PoolSpec:
    """The pool shape that holds one serving-layout history of ``n_max`` tokens per slot."""
    return PoolSpec(layers=int(model_config.n_layers), slots=int(slots), kv_heads=int(model_config.n_heads),
                    n_max=int(n_max), head_dim=int(model_config.head_dim), d_model=int(model_config.d_model),
                    device=device)


def describe(path: str | Path) -> dict[str, Any]:
    """The JSON description of a pool (for logs / debugging)."""
    return json.loads(Path(path).read_text())
