"""Small synthetic stand-ins for the shared datasets, written in each dataset's real on-disk format, so that tests
which only need *some* MovieLens- or Amazon-shaped data run in a clone without ``../shared/datasets``.

Each writer fills ``<root>/<folder>/`` with the files genrec's ingestor for that dataset reads -- the same names,
delimiters, encodings and quirks as the GroupLens / P5 / Tianchi files (see ``src/genrec/data/ingest/``) -- from a
seeded RNG, and a ``SYNTHETIC.json`` beside them holding the counts the writer itself produced (what a test
compares an ingest against: counted here from the arrays written, not by genrec). The real folders carry a
``PROVENANCE.md`` instead; :func:`is_synthetic` tells the two apart.

The shapes the tests lean on:

* ``movielens-100k``: ML-100K's id space (users 1..943, movies 1..1682, every movie rated at least once, every
  user at least 20 ratings; user 1 has 272, as in the real file), ``u.data`` tab-separated in shuffled order with
  many ratings of one user in the same second (ties), ``u.item`` Latin-1 with some accented titles, ``u.genre``.
* ``movielens-latest-small``: ``ratings.csv`` (half stars, sorted by user then movie) and ``movies.csv`` with
  sparse movie ids, quoted titles holding commas, ``(no genres listed)`` and some movies nobody rated.
* ``amazon-beauty-2014``: a 5-core ``sequential_data.txt`` (items numbered in order of first appearance),
  ``datamaps.json.gz`` and ``item_text.jsonl.gz`` with brands (some missing) and HTML entities in titles.
* ``taobao-userbehavior-sample``: ``UserBehavior_head.csv`` (no header; pv/cart/fav/buy).
* ``movielens-1m``: ``movies.dat`` and no ratings, like the shared copy.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

MARKER = "SYNTHETIC.json"
GENRES_100K = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
               "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
               "War", "Western"]
RATING_SHARES_100K = np.array([6_110, 11_370, 27_145, 34_174, 21_201]) / 100_000  # ratings 1..5 in ML-100K
ML100K_WINDOW = (874_724_710, 893_286_638)  # first and last timestamp of u.data
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
ADJ = ["Silent", "Broken", "Golden", "Last", "Hidden", "Red", "Lonely", "Wild", "Dark", "Bright", "Lost", "Frozen",
       "Secret", "Little", "Endless", "Crimson", "Distant", "Sweet", "Fallen", "Electric", "Quiet", "Burning",
       "Paper", "Iron", "Velvet", "Savage", "Midnight", "Forgotten", "Restless", "Hollow"]
NOUN = ["River", "Garden", "Empire", "Stranger", "Harbor", "Summer", "Machine", "Kingdom", "Mirror", "Highway",
        "Island", "Promise", "Shadow", "Winter", "Dance", "Letter", "Storm", "Circus", "Frontier", "Detective",
        "Orchard", "Voyage", "Station", "Witness", "Carnival", "Lantern", "Canyon", "Symphony", "Bandit", "Comet"]
ACCENTED = ["Café", "Amélie", "Señor", "Crème", "Déjà vu", "Fiancée", "Noël", "Über", "Année", "Château"]
BRANDS = ["Lumina", "Verde", "Rosewell", "Nordic Glow", "Aqua Pura", "Velour", "Skinfolk", "Mirabel", "Opaline",
          "Bramble & Co", "Halcyon", "Petal Lab"]
CATEGORIES = [["Beauty", "Makeup", "Nails", "Nail Polish"], ["Beauty", "Makeup", "Lips", "Lipstick"],
              ["Beauty", "Skin Care", "Face", "Creams & Moisturizers"], ["Beauty", "Hair Care", "Shampoos"],
              ["Beauty", "Fragrance", "Women's", "Eau de Parfum"], ["Beauty", "Makeup", "Eyes", "Mascara"],
              ["Beauty", "Tools & Accessories", "Brushes"], ["Beauty", "Skin Care", "Body", "Lotions"]]
PRODUCTS = ["Nail Lacquer", "Lipstick", "Moisturizing Cream", "Shampoo", "Eau de Parfum", "Mascara", "Brush Set",
            "Body Lotion"]
SHADES = ["Rose", "Coral", "Ivory", "Plum", "Amber", "Sage", "Pearl", "Cocoa", "Berry", "Sand", "Mint", "Ruby"]


def is_synthetic(folder: Path) -> bool:
    """``folder`` (``<root>/<dataset folder>``) holds a stand-in written here, not the real dataset."""
    return (Path(folder) / MARKER).is_file()


def stats(folder: Path) -> dict[str, Any]:
    """The counts the writer recorded for the stand-in in ``folder``."""
    return json.loads((Path(folder) / MARKER).read_text())


def _mark(folder: Path, **counts: Any) -> None:
    (folder / MARKER).write_text(json.dumps({"synthetic": True, **counts}, indent=1) + "\n")


def _name(rng: np.random.Generator) -> str:
    """A made-up proper name of 2-3 syllables ("Dravelin"): real titles are mostly names, and their many distinct
    character n-grams give TF-IDF a vocabulary of the real data's size (so it takes the same randomized SVD)."""
    onset = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "st", "th", "ch"]
    vowel = ["a", "e", "i", "o", "u", "ai", "ou", "ie"]
    coda = ["", "", "n", "r", "l", "s", "x", "nd", "rk"]
    parts = [onset[rng.integers(len(onset))] + vowel[rng.integers(len(vowel))] + coda[rng.integers(len(coda))]
             for _ in range(int(rng.integers(2, 4)))]
    return "".join(parts).capitalize()


def _titles(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct movie titles without the year; every 40th holds a Latin-1 accented word."""
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        a, b, c = ADJ[rng.integers(len(ADJ))], NOUN[rng.integers(len(NOUN))], _name(rng)
        t = [f"The {a} {b} of {c}", f"{c} and the {a} {b}", f"{c} {_name(rng)}", f"{c}'s {b} {rng.integers(2, 5)}",
             f"{a} {c}"][int(rng.integers(5))]
        if len(out) % 40 == 7:
            t = f"{ACCENTED[len(out) // 40 % len(ACCENTED)]} {t}"
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def _choose(rng: np.random.Generator, weights: np.ndarray, k: int) -> np.ndarray:
    """``k`` distinct indices drawn with probability proportional to ``weights`` (without replacement)."""
    return rng.choice(len(weights), size=k, replace=False, p=weights / weights.sum())


def _sessions(rng: np.random.Generator, n: int, start: int, end: int) -> np.ndarray:
    """``n`` non-decreasing epoch seconds in [start, end]: sessions of ratings, most of a session's ratings in the
    same second as the previous one (ML-100K's users rated in bursts: three quarters of its events tie)."""
    gaps = np.where(rng.random(n) < 0.7, 0, rng.exponential(40.0, n).astype(np.int64) + 1)
    new_session = rng.random(n) < 0.08
    gaps = np.where(new_session, rng.exponential(5 * 86_400.0, n).astype(np.int64) + 3_600, gaps)
    gaps[0] = 0
    t = np.cumsum(gaps)
    t0 = int(rng.integers(start, max(start + 1, end - int(t[-1]))))
    return np.minimum(t0 + t, end)


def write_movielens_100k(root: Path, seed: int = 0, users: int = 943, items: int = 1682) -> Path:
    """``u.data``, ``u.item``, ``u.genre``, ``u.info`` under ``root/movielens-100k``."""
    rng = np.random.default_rng(seed)
    d = root / "movielens-100k"
    d.mkdir(parents=True)
    genre_of = np.zeros((items, len(GENRES_100K)), dtype=np.int8)  # [I, G] flags
    for i in range(items):
        genre_of[i, 1 + rng.choice(len(GENRES_100K) - 1, size=int(rng.integers(1, 4)), replace=False)] = 1
    genre_of[rng.choice(items, size=2, replace=False)] = 0
    genre_of[genre_of.sum(1) == 0, 0] = 1  # a few movies of "unknown" genre only, as in u.item
    pop = 1.0 / (1.0 + rng.permutation(items)) ** 0.9  # [I] Zipf-like popularity, random ranks
    lengths = np.minimum(20 + rng.lognormal(2.4, 1.0, users).astype(np.int64), 500)  # [U] >= 20 ratings
    lengths[0] = 272  # user 1, whose long history tests read
    rated: list[np.ndarray] = []
    for u in range(users):
        likes = rng.choice(np.arange(1, len(GENRES_100K)), size=2, replace=False)
        w = pop * (1.0 + 4.0 * genre_of[:, likes].any(1))  # [I] taste: the user's two genres
        rated.append(_choose(rng, w, int(lengths[u])))
    unrated = np.setdiff1d(np.arange(items), np.concatenate(rated))
    for i in unrated:  # GroupLens's u.item lists rated movies only: give each a rater
        u = int(rng.integers(1, users))
        rated[u] = np.append(rated[u], i)
    user_col, item_col, ts_col = [], [], []
    for u, its in enumerate(rated):
        its = rng.permutation(its)
        user_col.append(np.full(len(its), u + 1))
        item_col.append(its + 1)
        ts_col.append(_sessions(rng, len(its), *ML100K_WINDOW))
    user, item, ts = (np.concatenate(c).astype(np.int64) for c in (user_col, item_col, ts_col))
    rating = rng.choice(5, size=len(user), p=RATING_SHARES_100K) + 1
    order = rng.permutation(len(user))  # u.data is shuffled
    with open(d / "u.data", "w", newline="\n") as f:
        f.writelines(f"{a}\t{b}\t{c}\t{t}\n" for a, b, c, t in zip(user[order].tolist(), item[order].tolist(),
                                                                    rating[order].tolist(), ts[order].tolist()))
    titles = _titles(rng, items)
    lines = []
    for i in range(items):
        year = int(rng.integers(1930, 1999))
        day, month = int(rng.integers(1, 29)), MONTHS[int(rng.integers(12))]
        url = "http://us.imdb.com/M/title-exact?" + titles[i].replace(" ", "%20")
        lines.append("|".join([str(i + 1), f"{titles[i]} ({year})", f"{day:02d}-{month}-{year}", "", url,
                               *map(str, genre_of[i].tolist())]))
    (d / "u.item").write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    (d / "u.genre").write_text("".join(f"{g}|{k}\n" for k, g in enumerate(GENRES_100K)) + "\n")
    (d / "u.info").write_text(f"{users} users\n{items} items\n{len(user)} ratings\n")
    counts = np.bincount(rating, minlength=6)[1:].tolist()
    _mark(d, users=users, items=items, ratings=len(user), ratings_by_value=counts,
          user_events={"min": int(lengths.min()), "user_1": int(len(rated[0]))})
    return d


def write_movielens_latest_small(root: Path, seed: int = 1, users: int = 60, movies: int = 400,
                                 unrated: int = 9) -> Path:
    """``ratings.csv`` and ``movies.csv`` under ``root/movielens-latest-small`` (GroupLens's CSV layout)."""
    rng = np.random.default_rng(seed)
    d = root / "movielens-latest-small"
    d.mkdir(parents=True)
    ids = np.sort(rng.choice(np.arange(1, 200_000), size=movies, replace=False))  # sparse, as in the real file
    genres = ["Action", "Adventure", "Animation", "Children", "Comedy", "Drama", "Fantasy", "Horror", "Romance",
              "Sci-Fi", "Thriller", "IMAX"]
    titles = _titles(rng, movies)
    rows = []
    for k, (mid, t) in enumerate(zip(ids.tolist(), titles)):
        if k % 25 == 3:  # "American President, The (1995)": a comma inside a quoted field
            t = f"{t.removeprefix('The ')}, The"
        g = "(no genres listed)" if k % 97 == 5 else "|".join(rng.choice(genres, int(rng.integers(1, 4)), False))
        title = f"{t} ({rng.integers(1930, 2019)})"
        rows.append(f"{mid},\"{title}\",{g}" if "," in title else f"{mid},{title},{g}")
    (d / "movies.csv").write_text("movieId,title,genres\n" + "\n".join(rows) + "\n")
    rated_pool = rng.choice(ids, size=movies - unrated, replace=False)
    pop = 1.0 / (1.0 + np.arange(len(rated_pool))) ** 0.8
    per_user = np.minimum(20 + rng.lognormal(3.0, 1.0, users).astype(np.int64), len(rated_pool))
    per_user[-1] = len(rated_pool)  # one user rated every rated movie: each of them is rated
    lines = []
    n = 0
    for u in range(users):
        got = np.sort(rated_pool[_choose(rng, pop, int(per_user[u]))])
        ts = rng.integers(828_124_615, 1_537_799_250, len(got))
        stars = rng.integers(1, 11, len(got)) / 2
        lines += [f"{u + 1},{m},{s:.1f},{t}" for m, s, t in zip(got.tolist(), stars.tolist(), ts.tolist())]
        n += len(got)
    (d / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + "\n".join(lines) + "\n")
    _mark(d, users=users, movies=movies, rated_movies=movies - unrated, ratings=n)
    return d


def _five_core(seqs: list[list[int]], k: int = 5) -> list[list[int]]:
    """Drop items with fewer than ``k`` users and users with fewer than ``k`` items until both hold."""
    while True:
        count: dict[int, int] = {}
        for s in seqs:
            for i in s:
                count[i] = count.get(i, 0) + 1
        kept = [[i for i in s if count[i] >= k] for s in seqs]
        kept = [s for s in kept if len(s) >= k]
        if kept == seqs:
            return kept
        seqs = kept


def write_amazon_beauty(root: Path, seed: int = 2, users: int = 3000, items: int = 900) -> Path:
    """``sequential_data.txt``, ``datamaps.json.gz``, ``item_text.jsonl.gz`` under ``root/amazon-beauty-2014``."""
    rng = np.random.default_rng(seed)
    d = root / "amazon-beauty-2014"
    d.mkdir(parents=True)
    cat = rng.integers(len(CATEGORIES), size=items)  # [I] each product's category
    pop = 1.0 / (1.0 + rng.permutation(items)) ** 0.7
    raw = []
    for _ in range(users):
        n = int(min(5 + rng.geometric(0.3) - 1 + rng.poisson(1.0), 40))
        fav = rng.integers(len(CATEGORIES))
        raw.append(_choose(rng, pop * np.where(cat == fav, 6.0, 1.0), n).tolist())
    seqs = _five_core(raw)
    number: dict[int, int] = {}  # the P5 file numbers items in order of first appearance
    for s in seqs:
        for i in s:
            number.setdefault(i, len(number) + 1)
    lines = [" ".join([str(u + 1), *(str(number[i]) for i in s)]) for u, s in enumerate(seqs)]
    (d / "sequential_data.txt").write_text("\n".join(lines) + "\n")
    alnum = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
    asins = {n: "B00" + "".join(rng.choice(alnum, 7)) for n in number.values()}
    reviewers = {u + 1: "A" + "".join(rng.choice(alnum, 13)) for u in range(len(seqs))}
    maps = {"user2id": {r: str(u) for u, r in reviewers.items()}, "item2id": {a: str(n) for n, a in asins.items()},
            "id2user": {str(u): r for u, r in reviewers.items()}, "id2item": {str(n): a for n, a in asins.items()}}
    (d / "datamaps.json.gz").write_bytes(gzip.compress(json.dumps(maps).encode()))
    rows = []
    escaped = 0
    for raw_id, n in sorted(number.items(), key=lambda kv: kv[1]):
        c = int(cat[raw_id])
        brand = BRANDS[(raw_id * 7) % len(BRANDS)]
        shade, size = SHADES[raw_id % len(SHADES)], f"{(raw_id % 9 + 1) * 0.5:.1f} oz"
        line = f"{_name(rng)} {_name(rng)}"  # a product line's made-up name
        title = f"{brand} {line} {PRODUCTS[c]}, {shade} No. {raw_id}, {size}"
        if raw_id % 11 == 0:  # as in the real file: '&' arrives HTML-escaped
            title = f"{brand} {line} {PRODUCTS[c]} &amp; Travel Case, {shade} No. {raw_id}"
            escaped += 1
        row: dict[str, Any] = {"asin": asins[n], "item_id": n, "title": title, "categories": [CATEGORIES[c]]}
        if raw_id % 6:  # about one product in six has no brand
            row["brand"] = brand
        rows.append(json.dumps(row))
    (d / "item_text.jsonl.gz").write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    _mark(d, users=len(seqs), items=len(number), events=sum(map(len, seqs)), escaped_titles=escaped)
    return d


def write_taobao(root: Path, seed: int = 3, users: int = 40) -> Path:
    """``UserBehavior_head.csv`` (user,item,category,behavior,timestamp; no header) under the sample's folder."""
    rng = np.random.default_rng(seed)
    d = root / "taobao-userbehavior-sample"
    d.mkdir(parents=True)
    item_ids = rng.choice(np.arange(1, 5_000_000), size=1500, replace=False)
    cats = rng.choice(np.arange(1, 5_000_000), size=60, replace=False)[rng.integers(60, size=1500)]
    lines, counts = [], {"pv": 0, "cart": 0, "fav": 0, "buy": 0}
    for u in np.sort(rng.choice(np.arange(1, 1000), size=users, replace=False)).tolist():
        n = int(rng.integers(20, 160))
        picks = rng.integers(len(item_ids), size=n)
        ts = np.sort(rng.integers(1_511_539_200, 1_512_316_800, n))
        acts = rng.choice(list(counts), size=n, p=[0.9, 0.045, 0.035, 0.02])
        for p, t, a in zip(picks.tolist(), ts.tolist(), acts.tolist()):
            lines.append(f"{u},{item_ids[p]},{cats[p]},{a},{t}")
            counts[a] += 1
    (d / "UserBehavior_head.csv").write_text("\n".join(lines) + "\n")
    _mark(d, users=users, events=len(lines), actions=counts)
    return d


def write_movielens_1m_movies(root: Path, seed: int = 4, movies: int = 50) -> Path:
    """``movies.dat`` (MovieID::Title::Genres, UTF-8) with no ``ratings.dat``, as in the shared copy."""
    rng = np.random.default_rng(seed)
    d = root / "movielens-1m"
    d.mkdir(parents=True)
    titles = _titles(rng, movies)
    (d / "movies.dat").write_text("".join(f"{k + 1}::{t} ({1950 + k})::{GENRES_100K[1 + k % 18]}\n"
                                          for k, t in enumerate(titles)), encoding="utf-8")
    _mark(d, movies=movies, ratings=0)
    return d


WRITERS: dict[str, Callable[[Path], Path]] = {
    "movielens-100k": write_movielens_100k,
    "movielens-latest-small": write_movielens_latest_small,
    "movielens-1m": write_movielens_1m_movies,
    "amazon-beauty-2014": write_amazon_beauty,
    "taobao-userbehavior-sample": write_taobao,
}
"""Each stand-in's folder (the default folder of its dataset under the data root) and its writer."""


def write_all(root: Path) -> Path:
    """Every stand-in of :data:`WRITERS` under ``root``; returns ``root``."""
    for write in WRITERS.values():
        write(root)
    return root
