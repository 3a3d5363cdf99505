"""Download helpers without the network: URLs, unpacking a local archive, refusing unsafe members."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from genrec.data.ingest.download import KNOWN_MD5, unpack, url_for
from genrec.data.ingest.movielens import VARIANTS
from genrec.errors import DataError


def test_urls_are_official() -> None:
    assert url_for("ml-1m.zip") == "https://files.grouplens.org/datasets/movielens/ml-1m.zip"
    for v in VARIANTS.values():
        assert url_for(v.zip_name).startswith("https://files.grouplens.org/datasets/movielens/ml-")
    with pytest.raises(ValueError):
        url_for("ml-2m.zip")
    assert KNOWN_MD5 == {}  # no invented checksums


def test_unpack_nested_folder_keeps_existing(tmp_path: Path) -> None:
    z = tmp_path / "ml-10m.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("ml-10M100K/ratings.dat", "1::1::5::1\n")
        f.writestr("ml-10M100K/movies.dat", "1::A (1990)::Drama\n")
    dest = tmp_path / "movielens-10m"
    dest.mkdir()
    (dest / "movies.dat").write_text("keep me")
    moved = unpack(z, dest, "ratings.dat")
    assert moved == ["ratings.dat"]
    assert (dest / "movies.dat").read_text() == "keep me"
    assert (dest / "ratings.dat").read_text() == "1::1::5::1\n"
    assert not [p for p in dest.iterdir() if p.name.startswith(".unpack-")]


def test_unpack_refuses_escaping_members(tmp_path: Path) -> None:
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("../../ratings.dat", "x")
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(DataError, match="escapes"):
        unpack(z, dest, "ratings.dat")
