"""Where datasets live: ``--data-dir``, then ``$GENREC_DATA_DIR``, then a user cache dir."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "genrec"


def data_root(data_dir: str | Path | None = None) -> Path:
    """The folder that holds one sub-folder per dataset (e.g. ``movielens-100k``)."""
    if data_dir is not None:
        return Path(data_dir).expanduser().resolve()
    env = os.environ.get("GENREC_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return cache_dir() / "datasets"
