"""Explicit download of MovieLens archives from GroupLens (never at import time, never implicit).

Integrity: GroupLens publishes ``<archive>.md5`` beside most archives; when it can be
fetched, the download is checked against it. We ship no hard-coded checksums (none are
invented here); the computed sha256 and md5 are always recorded in
``<folder>/download.json`` so a later run can be compared. The archive is streamed to a
temp file in the target folder and renamed into place only when complete, then unpacked
member by member (paths escaping the folder are refused); files already present are kept.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genrec.errors import DataError, MissingDataError
from genrec.workdir import atomic_write_json

if TYPE_CHECKING:  # the annotation only: movielens imports this module
    from genrec.data.ingest.movielens import Variant

BASE_URL = "https://files.grouplens.org/datasets/movielens/"

ARCHIVES = ("ml-100k.zip", "ml-latest-small.zip", "ml-1m.zip", "ml-10m.zip", "ml-20m.zip", "ml-25m.zip", "ml-32m.zip")

KNOWN_MD5: dict[str, str] = {}
"""Checksums we know for certain (none are hard-coded; the published ``.md5`` is used instead)."""


def url_for(zip_name: str) -> str:
    if zip_name not in ARCHIVES:
        raise ValueError(f"unknown MovieLens archive {zip_name!r}; known: {list(ARCHIVES)}")
    return BASE_URL + zip_name


def _published_md5(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url + ".md5", timeout=timeout) as r:
            text = r.read(4096).decode("ascii", errors="replace")
    except (urllib.error.URLError, OSError):
        return None
    for tok in text.replace("=", " ").split():
        if len(tok) == 32 and all(c in "0123456789abcdefABCDEF" for c in tok):
            return tok.lower()
    return None


def download_file(url: str, dest: Path, *, timeout: float = 60.0) -> dict[str, Any]:
    """Stream ``url`` to ``dest`` atomically; returns {url, bytes, sha256, md5}."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    sha, md5, size = hashlib.sha256(), hashlib.md5(), 0
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as r:
            while chunk := r.read(1 << 20):
                f.write(chunk)
                sha.update(chunk)
                md5.update(chunk)
                size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, (urllib.error.URLError, OSError)):
            raise MissingDataError(f"could not download {url} to {dest}: {e}") from e
        raise
    return {"url": url, "bytes": size, "sha256": sha.hexdigest(), "md5": md5.hexdigest()}


def unpack(archive: Path, folder: Path, needed_file: str) -> list[str]:
    """Move the files of the archive folder holding ``needed_file`` into ``folder``; returns their names."""
    folder = folder.resolve()
    with tempfile.TemporaryDirectory(prefix=".unpack-", dir=folder) as tmpd:
        tmp = Path(tmpd).resolve()
        with zipfile.ZipFile(archive) as z:
            for m in z.infolist():
                target = (tmp / m.filename).resolve()
                if tmp not in target.parents and target != tmp:
                    raise DataError(f"archive member escapes the folder: {m.filename!r}", path=archive)
            z.extractall(tmp)
        hits = sorted(tmp.rglob(needed_file))
        if not hits:
            raise DataError(f"archive has no {needed_file}", path=archive)
        moved = []
        for p in sorted(hits[0].parent.iterdir()):
            if p.is_file() and not (folder / p.name).exists():
                os.replace(p, folder / p.name)
                moved.append(p.name)
        return moved


def fetch_movielens(variant: "Variant", folder: Path, *, timeout: float = 60.0) -> dict[str, Any]:
    """Download + verify + unpack one MovieLens release into ``folder``; writes ``download.json``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    url = url_for(variant.zip_name)
    archive = folder / variant.zip_name
    if archive.exists():
        sha, md5 = hashlib.sha256(), hashlib.md5()
        with open(archive, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                sha.update(chunk)
                md5.update(chunk)
        rec: dict[str, Any] = {"url": url, "bytes": archive.stat().st_size, "sha256": sha.hexdigest(),
                               "md5": md5.hexdigest(), "reused": True}
    else:
        rec = download_file(url, archive, timeout=timeout)
    expected = KNOWN_MD5.get(variant.zip_name) or _published_md5(url, timeout)
    rec["md5_expected"] = expected
    rec["verified"] = expected is not None and expected == rec["md5"]
    if expected is not None and expected != rec["md5"]:
        bad = archive.with_suffix(".zip.corrupt")
        shutil.move(archive, bad)
        raise DataError(f"md5 {rec['md5']} != published {expected}; moved the download to {bad}", path=archive)
    rec["unpacked"] = unpack(archive, folder, variant.ratings_file)
    atomic_write_json(folder / "download.json", rec)
    return rec
