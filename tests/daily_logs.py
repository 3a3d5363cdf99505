"""Two "days" of MovieLens-form logs (``u.data`` + ``u.item`` + ``u.genre``) for the daily-cycle tests.

:func:`split_by_time` cuts a MovieLens 100K folder (or a part of it: the movies above an id, to keep the
tests quick) at a timestamp quantile: day 1 is the earlier events, day 2 the rest; day 1's ``u.item`` lists
only the movies day 1 rates, day 2's the whole catalogue, so day 2 brings new items. :func:`fake_movielens`
writes a log of the same form from nothing (for a checkout without ``../shared/datasets``): topic-coherent
users, titles that share words within a topic (for TF-IDF), movies coming out over time, events at distinct
times.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from genrec.data.ingest.movielens import GENRES_100K


def split_by_time(src: Path, out: Path, *, frac: float = 0.8, min_item: int = 0) -> tuple[Path, Path]:
    """``out/day1`` (the first ``frac`` of the events by timestamp; ties keep file order) and ``out/day2``, of the
    movies with an id above ``min_item``."""
    rows = [line.split("\t") for line in (src / "u.data").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if int(r[1]) > min_item]
    ts = np.array([int(r[3]) for r in rows])
    order = np.argsort(ts, kind="stable")
    cut = int(frac * len(rows))
    day1, day2 = out / "day1", out / "day2"
    lines = [x for x in (src / "u.item").read_bytes().split(b"\n") if x.strip()]
    for d, idx in ((day1, order[:cut]), (day2, order[cut:])):
        d.mkdir(parents=True)
        (d / "u.data").write_text("".join("\t".join(rows[i]) + "\n" for i in sorted(idx)))
        rated = {rows[i][1] for i in order[:cut]}
        keep = [x for x in lines
                if int(x.split(b"|")[0]) > min_item and (d == day2 or x.split(b"|")[0].decode() in rated)]
        (d / "u.item").write_bytes(b"\n".join(keep) + b"\n")  # day 2's items file: the whole catalogue
        if (src / "u.genre").exists():
            shutil.copy(src / "u.genre", d / "u.genre")
    return day1, day2


_TOPIC_WORDS = [
    ["space", "star", "galaxy", "planet", "orbit", "alien"], ["love", "heart", "kiss", "wedding", "romance", "bride"],
    ["murder", "detective", "crime", "gun", "heist", "police"], ["dragon", "magic", "sword", "quest", "wizard", "king"],
    ["laugh", "party", "crazy", "funny", "weekend", "buddy"], ["war", "soldier", "battle", "army", "front", "general"],
]


def fake_movielens(out: Path, *, users: int = 150, items: int = 240, per_user: int = 20, seed: int = 0) -> Path:
    """A MovieLens-100K-form folder ``out`` (``u.data``, ``u.item``, ``u.genre``) with no dataset needed: about
    ``per_user`` ratings a user, each of a movie of the user's two topics, at distinct times; half the movies
    are there from the start, the others come out one by one over the log's time (so a later part of it has
    movies an earlier part lacks)."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True)
    n_topics = len(_TOPIC_WORDS)
    topic = rng.integers(0, n_topics, size=items)  # [I]
    release = np.sort(rng.uniform(0.0, 1.0, size=items))  # [I] when each movie comes out, as a share of the log
    release[rng.permutation(items)[: items // 2]] = 0.0
    item_lines = []
    for i in range(items):
        words = rng.choice(_TOPIC_WORDS[topic[i]], size=2, replace=False)
        flags = ["0"] * len(GENRES_100K)
        flags[1 + topic[i]] = "1"
        title = f"{words[0].title()} {words[1].title()} {i} ({1970 + i % 30})"
        item_lines.append("|".join([str(i + 1), title, "01-Jan-1995", "", "http://example.org", *flags]))
    (out / "u.item").write_text("\n".join(item_lines) + "\n", encoding="latin-1")
    (out / "u.genre").write_text("".join(f"{g}|{j}\n" for j, g in enumerate(GENRES_100K)))
    likes = [set(rng.choice(n_topics, size=2, replace=False).tolist()) for _ in range(users)]
    rated: list[set[int]] = [set() for _ in range(users)]
    total = users * per_user
    data = []
    for k in range(total):
        u = int(rng.integers(users))
        pool = [i for i in range(items) if topic[i] in likes[u] and release[i] <= k / total and i not in rated[u]]
        if not pool:
            continue
        it = int(rng.choice(pool))
        rated[u].add(it)
        data.append(f"{u + 1}\t{it + 1}\t{int(rng.integers(1, 6))}\t{880_000_000 + 37 * k}\n")
    (out / "u.data").write_text("".join(data))
    return out
