"""MovieLens ingestors: 100K (``u.data``/``u.item``), 1M/10M (``::`` ``.dat``), latest/20M/25M/32M (CSV).

Explicit ratings become actions through :class:`~genrec.data.ingest.common.RatingRule`
(vocabulary ["view", "like", "dislike"]; "view" and "like" are positive: a rated movie was
watched, a low rating is a negative for "like"). One surface, "movielens". Items come from
the movies file (title, year parsed from the title, genres); every rated movie must be in it,
otherwise a DataError names the ratings line. Encodings: ``u.item`` is Latin-1, the 1M copy
shipped here is UTF-8 (GroupLens's original is Latin-1), 10M mixes them: each text file is
decoded as UTF-8 first, then Latin-1 (the one used is recorded in ``source``).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genrec.data.ingest.build import ItemRows, build_dataset, check_unique_ids
from genrec.data.ingest.common import (
    Column,
    Parsed,
    decode_text,
    file_record,
    finite,
    int_col,
    iter_lines,
    read_delimited,
    record_line,
)
from genrec.data.ingest.download import fetch_movielens, url_for
from genrec.data.ingest.options import IngestOptions
from genrec.data.schema import Dataset, DatasetInfo
from genrec.errors import DataError, MissingDataError

SURFACE = "movielens"

# u.genre order of the 100K release (used when u.genre is absent).
GENRES_100K = [
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
]

_YEAR = re.compile(r"\s*\((\d{4})(?:\s*[-\u2013]\s*(?:\d{4})?)?\)\s*$")


@dataclass(frozen=True)
class Variant:
    """File layout of one MovieLens release."""

    name: str
    folder: str
    """Default folder under the data root."""
    zip_name: str
    """GroupLens archive (see :mod:`.download`)."""
    layout: str
    """"100k", "dat" or "csv"."""

    @property
    def ratings_file(self) -> str:
        return {"100k": "u.data", "dat": "ratings.dat", "csv": "ratings.csv"}[self.layout]

    @property
    def movies_file(self) -> str:
        return {"100k": "u.item", "dat": "movies.dat", "csv": "movies.csv"}[self.layout]


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("movielens-100k", "movielens-100k", "ml-100k.zip", "100k"),
        Variant("movielens-latest-small", "movielens-latest-small", "ml-latest-small.zip", "csv"),
        Variant("movielens-1m", "movielens-1m", "ml-1m.zip", "dat"),
        Variant("movielens-10m", "movielens-10m", "ml-10m.zip", "dat"),
        Variant("movielens-20m", "movielens-20m", "ml-20m.zip", "csv"),
        Variant("movielens-25m", "movielens-25m", "ml-25m.zip", "csv"),
        Variant("movielens-32m", "movielens-32m", "ml-32m.zip", "csv"),
    ]
}


def split_title(title: str) -> tuple[str, int | None]:
    """"Toy Story (1995)" -> ("Toy Story", 1995); no year -> (title, None)."""
    m = _YEAR.search(title)
    if m is None:
        return title.strip(), None
    return title[: m.start()].strip(), int(m.group(1))


def item_text(title: str, genres: list[str], year: int | None) -> str:
    """What content encoders read: "Toy Story. Genres: Animation, Comedy. Year: 1995"."""
    base, _ = split_title(title)
    parts = [base or title]
    if genres:
        parts.append("Genres: " + ", ".join(genres))
    if year is not None:
        parts.append(f"Year: {year}")
    return ". ".join(parts)


def _genres_from_field(value: str) -> list[str]:
    if value.strip() in ("", "(no genres listed)"):
        return []
    return [g.strip() for g in value.split("|") if g.strip()]


def _add_movie(rows: ItemRows, movie_id: int, title: str, genres: list[str], extra: dict[str, Any]) -> None:
    _, year = split_title(title)
    attrs: dict[str, Any] = {"genres": genres, "year": year, **extra}
    rows.add(movie_id, title, item_text(title, genres, year), attrs)


def _parse_int(value: str, *, path: Path, line: int, field: str) -> int:
    v = value.strip()
    if not v.isdigit():
        raise DataError(f"not an integer: {value!r}", path=path, line=line, field=field)
    return int(v)


def read_u_item(path: Path, genre_path: Path | None) -> tuple[ItemRows, str]:
    """100K ``u.item``: id|title|release date|video release date|IMDb URL|19 genre flags (Latin-1)."""
    genres = GENRES_100K
    if genre_path is not None and genre_path.exists():
        gtext, _ = decode_text(genre_path, ("latin-1",))
        pairs = []
        for line, s in iter_lines(gtext):
            name, _, idx = s.rpartition("|")
            pairs.append((_parse_int(idx, path=genre_path, line=line, field="index"), name))
        genres = [n for _, n in sorted(pairs)]
    text, enc = decode_text(path, ("latin-1",))
    n_fields = 5 + len(genres)
    rows, ids, lines = ItemRows.empty(), [], []
    for line, s in iter_lines(text):
        f = s.split("|")
        if len(f) != n_fields:
            raise DataError(f"expected {n_fields} '|'-separated fields, found {len(f)}", path=path, line=line,
                            field="genre flags" if len(f) > 5 else "title")
        mid = _parse_int(f[0], path=path, line=line, field="movie id")
        flags = f[5:]
        for g, v in zip(genres, flags):
            if v not in ("0", "1"):
                raise DataError(f"genre flag must be 0 or 1, got {v!r}", path=path, line=line, field=g)
        gs = [g for g, v in zip(genres, flags) if v == "1"]
        _add_movie(rows, mid, f[1], gs, {"release_date": f[2] or None, "imdb_url": f[4] or None})
        ids.append(mid)
        lines.append(line)
    if not ids:
        raise DataError("file is empty: expected at least one movie", path=path, line=1, field="movie id")
    check_unique_ids(ids, lines, path=path, field="movie id")
    return rows, enc


def read_movies_dat(path: Path) -> tuple[ItemRows, str]:
    """1M/10M ``movies.dat``: MovieID::Title::Genres (UTF-8 or Latin-1, LF or CRLF)."""
    text, enc = decode_text(path)
    rows, ids, lines = ItemRows.empty(), [], []
    for line, s in iter_lines(text):
        f = s.split("::")
        if len(f) != 3:
            raise DataError(f"expected 3 '::'-separated fields, found {len(f)}", path=path, line=line,
                            field=["MovieID", "Title", "Genres"][min(len(f), 2)] if len(f) < 3 else None)
        mid = _parse_int(f[0], path=path, line=line, field="MovieID")
        _add_movie(rows, mid, f[1], _genres_from_field(f[2]), {})
        ids.append(mid)
        lines.append(line)
    if not ids:
        raise DataError("file is empty: expected at least one movie", path=path, line=1, field="MovieID")
    check_unique_ids(ids, lines, path=path, field="MovieID")
    return rows, enc


def read_movies_csv(path: Path) -> tuple[ItemRows, str]:
    """latest/20M/25M/32M ``movies.csv``: header movieId,title,genres; quoted CSV, UTF-8."""
    text, enc = decode_text(path)
    if not text.strip():
        raise DataError("file is empty: expected a header movieId,title,genres", path=path, line=1, field="movieId")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = [h.strip() for h in next(reader)]
        need = ["movieId", "title", "genres"]
        for c in need:
            if c not in header:
                raise DataError(f"header lacks column {c!r}; header has {header}", path=path, line=1, field=c)
        pos = [header.index(c) for c in need]
        rows, ids, lines = ItemRows.empty(), [], []
        for rec in reader:
            line = reader.line_num
            if not rec or (len(rec) == 1 and not rec[0].strip()):
                continue
            if len(rec) != len(header):
                missing = [c for c, p in zip(need, pos) if p >= len(rec)]
                raise DataError(f"expected {len(header)} comma-separated fields, found {len(rec)}", path=path,
                                line=line, field=missing[0] if missing else None)
            mid = _parse_int(rec[pos[0]], path=path, line=line, field="movieId")
            _add_movie(rows, mid, rec[pos[1]], _genres_from_field(rec[pos[2]]), {})
            ids.append(mid)
            lines.append(line)
    except csv.Error as e:
        raise DataError(f"malformed CSV: {e}", path=path, line=reader.line_num) from None
    if not ids:
        raise DataError("file has a header but no movies", path=path, line=2, field="movieId")
    check_unique_ids(ids, lines, path=path, field="movieId")
    return rows, enc


def read_ratings(path: Path, layout: str) -> tuple[Parsed, tuple[str, str, str, str], bool]:
    """Ratings file -> parsed columns, the (user, item, rating, timestamp) names, quoted flag."""
    if layout == "100k":
        names, delim, header, quoted = ("user_id", "item_id", "rating", "timestamp"), "\t", False, False
    elif layout == "dat":
        names, delim, header, quoted = ("UserID", "MovieID", "Rating", "Timestamp"), "::", False, False
    else:
        names, delim, header, quoted = ("userId", "movieId", "rating", "timestamp"), ",", True, True
    cols = [int_col(names[0]), int_col(names[1]), Column(names[2], "float", finite, "a finite number"),
            int_col(names[3])]
    return read_delimited(path, cols, delimiter=delim, header=header, quoted=quoted), names, quoted


def missing_message(variant: Variant, folder: Path, missing: list[str]) -> str:
    files = ", ".join(missing)
    return (
        f"{variant.name}: {files} not found in {folder}. Put GroupLens's file(s) there "
        f"(e.g. {folder / missing[0]}), or run `genrec data prepare` with --download to fetch "
        f"{url_for(variant.zip_name)} from GroupLens and unpack it into {folder}."
    )


def ingest_movielens(name: str, folder: Path, options: IngestOptions) -> Dataset:
    """Ingest one MovieLens release found in ``folder``."""
    if name not in VARIANTS:
        raise ValueError(f"unknown MovieLens variant {name!r}; known: {sorted(VARIANTS)}")
    variant = VARIANTS[name]
    folder = Path(folder)
    needed = [variant.ratings_file, variant.movies_file]
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing and options.download:
        fetch_movielens(variant, folder)
        missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        raise MissingDataError(missing_message(variant, folder, missing))

    ratings_path, movies_path = folder / variant.ratings_file, folder / variant.movies_file
    if variant.layout == "100k":
        items, enc = read_u_item(movies_path, folder / "u.genre")
    elif variant.layout == "dat":
        items, enc = read_movies_dat(movies_path)
    else:
        items, enc = read_movies_csv(movies_path)
    parsed, names, quoted = read_ratings(ratings_path, variant.layout)

    rule = options.rating_rule
    rating = parsed[names[2]]
    action_idx = rule.apply(rating)
    files = [file_record(ratings_path, checksum=options.checksum), file_record(movies_path, checksum=options.checksum)]
    files[1]["encoding"] = enc
    if variant.layout == "100k" and (folder / "u.genre").exists():
        files.append(file_record(folder / "u.genre", checksum=options.checksum))
    info = DatasetInfo(
        name=name,
        actions=list(rule.ACTIONS),
        positive_actions=["view", "like"],
        surfaces=[SURFACE],
        feedview_rule="",
        action_rule=rule.describe(),
        has_timestamps=True,
        extra={"rating_rule": {"like_min": rule.like_min, "dislike_max": rule.dislike_max}},
    )

    def missing_item(r: int) -> DataError:
        line = record_line(parsed, r, quoted=quoted)
        return DataError(f"movie {int(parsed[names[1]][r])} is not in {movies_path}", path=ratings_path, line=line,
                         field=names[1])

    return build_dataset(
        info,
        user=parsed[names[0]],
        item=parsed[names[1]],
        timestamp=parsed[names[3]],
        action_idx=action_idx,
        surface_idx=np.zeros(parsed.n, dtype=np.int8),
        items=items,
        source={"dataset": name, "folder": str(folder), "files": files},
        slate_size=options.slate_size,
        missing_item=missing_item,
    )
