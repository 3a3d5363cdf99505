"""The item-vector store: item ids + content and engagement matrices, saved atomically.

On disk (a WorkDir's ``features/`` folder)::

    item_ids.npy      int64 [n]
    content.npy       float32 [n, dc]
    engagement.npy    float32 [n, de]
    manifest.json     kind "features": inputs, params, counts, versions, sha256 of each file,
                      text_quality (coverage / distinct ratio / verdict of the item text)

Plain ``.npy`` rather than safetensors so :meth:`ItemVectors.load` can memory-map the
matrices (safetensors' numpy loader copies). The folder is written through
:func:`genrec.workdir.atomic_dir`: a crash or kill mid-save leaves the previous folder
intact. PinGER's dense history token reads :meth:`ItemVectors.concat`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from genrec.errors import DataError, MissingDataError
from genrec.workdir import MANIFEST, atomic_dir, atomic_write_json, manifest, read_json

KIND = "features"
FILES = {"item_ids": "item_ids.npy", "content": "content.npy", "engagement": "engagement.npy"}


def _write_array(path: Path, arr: np.ndarray) -> str:
    """Write one ``.npy`` and return its sha256."""
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
    return _sha256(path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class ItemVectors:
    """Content and engagement vectors for a catalogue, row ``i`` = ``item_ids[i]``."""

    item_ids: np.ndarray  # int64 [n]
    content: np.ndarray  # float32 [n, dc]
    engagement: np.ndarray  # float32 [n, de]
    meta: dict[str, Any] = field(default_factory=dict)
    """Provenance: ``inputs``, ``params`` and ``text_quality`` go to the manifest as is; anything else under
    ``extra``."""

    def __post_init__(self) -> None:
        ids = np.asarray(self.item_ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise DataError(f"item_ids must be a 1-D integer array, got {ids.dtype} {ids.shape}", field="item_ids")
        self.item_ids = ids.astype(np.int64, copy=False)
        n = len(self.item_ids)
        for name in ("content", "engagement"):
            arr = getattr(self, name)
            if arr.ndim != 2 or arr.shape[0] != n:
                raise DataError(f"{name} must be [{n}, d] to match item_ids, got {arr.shape}", field=name)
            if arr.dtype != np.float32:
                setattr(self, name, arr.astype(np.float32))
        self._sorter = np.argsort(self.item_ids, kind="stable")  # [n]
        s = self.item_ids[self._sorter]
        if n > 1 and (s[1:] == s[:-1]).any():
            raise DataError(f"duplicate item_id {int(s[1:][s[1:] == s[:-1]][0])}", field="item_ids")
        self._sorted = s

    # ------------------------------------------------------------------ access

    def __len__(self) -> int:
        return len(self.item_ids)

    def index_of(self, item_ids: np.ndarray | list[int] | int) -> np.ndarray:
        """Rows of ``item_ids`` (any shape) -> int64 array of the same shape; unknown id -> DataError."""
        q = np.asarray(item_ids, dtype=np.int64)
        flat = q.ravel()  # [m]
        if len(self._sorted) == 0:
            if flat.size:
                raise DataError(f"unknown item_id {int(flat[0])}: the store is empty", field="item_id")
            return np.zeros(q.shape, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted, flat), len(self._sorted) - 1)  # [m]
        bad = self._sorted[pos] != flat
        if bad.any():
            first = int(flat[np.flatnonzero(bad)[0]])
            raise DataError(f"{int(bad.sum())} unknown item_id(s), first {first}", field="item_id")
        return self._sorter[pos].astype(np.int64).reshape(q.shape)

    def concat(self) -> np.ndarray:
        """``[content ‖ engagement]`` [n, dc + de] float32 (a new in-memory array)."""
        return np.concatenate([self.content, self.engagement], axis=1)

    # ------------------------------------------------------------------ persistence

    def counts(self) -> dict[str, int]:
        return {
            "items": len(self),
            "content_dim": int(self.content.shape[1]),
            "engagement_dim": int(self.engagement.shape[1]),
            "zero_content": int((~np.any(self.content != 0, axis=1)).sum()),
            "zero_engagement": int((~np.any(self.engagement != 0, axis=1)).sum()),
        }

    def save(self, folder: str | Path) -> Path:
        """Write the store to ``folder`` atomically (replacing an existing one). Returns the folder."""
        folder = Path(folder)
        with atomic_dir(folder, overwrite=True) as tmp:
            sums = {}
            for key, name in FILES.items():
                sums[name] = _write_array(tmp / name, getattr(self, key))
            extra = {k: v for k, v in self.meta.items() if k not in ("inputs", "params", "manifest", "text_quality")}
            top = {"text_quality": self.meta["text_quality"]} if self.meta.get("text_quality") is not None else {}
            body = manifest(KIND, inputs=self.meta.get("inputs", {}), params=self.meta.get("params", {}),
                            counts=self.counts(), files=sums, extra=extra, **top)
            atomic_write_json(tmp / MANIFEST, body)
        return folder

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = True, verify: bool = False) -> "ItemVectors":
        """Read a saved store; matrices are memory-mapped read-only when ``mmap``.

        ``verify`` re-hashes every file against the manifest.
        """
        folder = Path(folder)
        mpath = folder / MANIFEST
        if not mpath.exists():
            raise MissingDataError(f"{folder} holds no item vectors ({mpath} missing): run `genrec features build`")
        body = read_json(mpath)
        if body.get("kind") != KIND:
            raise DataError(f"manifest kind is {body.get('kind')!r}, expected {KIND!r}", path=mpath, field="kind")
        arrays = {}
        for key, name in FILES.items():
            p = folder / name
            if not p.exists():
                raise MissingDataError(f"{p} missing (listed in {mpath})")
            if verify and body.get("files", {}).get(name) != _sha256(p):
                raise DataError(f"checksum mismatch for {name}", path=p)
            arrays[key] = np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
        meta = {"inputs": body.get("inputs", {}), "params": body.get("params", {}), **body.get("extra", {}),
                "text_quality": body.get("text_quality"), "manifest": body}
        out = cls(item_ids=np.asarray(arrays["item_ids"]), content=arrays["content"],
                  engagement=arrays["engagement"], meta=meta)
        counts = body.get("counts", {})
        if counts.get("items", len(out)) != len(out):
            raise DataError(f"manifest says {counts['items']} items, files hold {len(out)}", path=mpath,
                            field="counts.items")
        return out
