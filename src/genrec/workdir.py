"""The run directory: everything one pipeline makes, each part with a JSON manifest.

Layout (created lazily)::

    WORKDIR/
      tables/            Iceberg warehouse + SQLite catalog (events, feedviews, items)
      tables/manifest.json
      features/          item vectors (content, engagement) + manifest.json
      sid/v0001/ ...     versioned SID builds (codes, trie, index, stats.json, manifest.json)
      sid/CURRENT        name of the version in use
      checkpoints/       safetensors weights + optimizer state + config
      reports/           eval JSON / Markdown / PNG

Every write that a crash could leave half done goes through :func:`atomic_write_bytes`
or :func:`atomic_dir`: readers see the old version or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib.metadata as md
import json
import os
import platform
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrec._version import __version__
from genrec.errors import ConfigError, GenrecError

MANIFEST = "manifest.json"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder + fsync + rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes, remembered per (path, size, mtime) for this process: loading
    a checkpoint names its ANN cache and its fusion file by its weights without hashing twice."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@contextlib.contextmanager
def atomic_dir(final: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp folder beside ``final``; on success rename it to ``final``.

    On any exception (or a kill) the temp folder is what is left, never a partial
    ``final``. Leftover ``.tmp-*`` folders are removed by :func:`clean_stale_tmp`.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists")
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        for root, _dirs, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    os.fsync(f.fileno())
        if final.exists():
            old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def clean_stale_tmp(folder: str | Path) -> int:
    """Remove ``.tmp-*`` / ``.old-*`` leftovers of killed writers; returns how many."""
    folder = Path(folder)
    n = 0
    if folder.is_dir():
        for p in folder.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                n += 1
    return n


def versions() -> dict[str, str]:
    """Versions of Python and the main libraries, recorded in every manifest."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    out["genrec"] = __version__
    for pkg in ("torch", "numpy", "pyarrow", "pyiceberg", "faiss-cpu", "scikit-learn"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def manifest(kind: str, *, inputs: dict[str, Any], params: dict[str, Any], counts: dict[str, Any],
             **extra: Any) -> dict[str, Any]:
    """The standard manifest body: what was read, with which parameters, what came out."""
    return {
        "kind": kind,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "inputs": inputs,
        "params": params,
        "counts": counts,
        "versions": versions(),
        **extra,
    }


@dataclass(frozen=True)
class WorkDir:
    """Paths inside one run directory."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root).expanduser().resolve())

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def features(self) -> Path:
        return self.root / "features"

    @property
    def sid(self) -> Path:
        return self.root / "sid"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def ensure(self) -> "WorkDir":
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file in the way, no permission, read-only disk
            raise ConfigError(f"work directory {self.root}: cannot create it ({e.strerror or e})") from None
        return self

    def dataset_manifest(self) -> dict[str, Any]:
        p = self.tables / MANIFEST
        if not p.exists():
            raise GenrecError(f"{self.root} has no prepared data ({p} missing): run `genrec data prepare` first")
        return read_json(p)
