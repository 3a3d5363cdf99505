"""Amazon Beauty (12,101 items): timing of TF-IDF + engagement vectors and a quality sanity check.

Reads titles from item_text.jsonl.gz and sequences from sequential_data.txt directly (no
ingester needed); the engagement graph uses the leave-one-out TRAIN part (all but the last
two items of each user). Prints the seconds; run with ``-s`` to see them.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from genrec.features import content_vectors, engagement_vectors


def load_beauty(root: Path) -> tuple[pa.Table, pa.Table, list[str | None], dict[int, list[int]]]:
    d = root / "amazon-beauty-2014"
    if not (d / "item_text.jsonl.gz").exists() or not (d / "sequential_data.txt").exists():
        pytest.skip(f"Amazon Beauty not found in {d}")
    ids, texts, brands = [], [], []
    with gzip.open(d / "item_text.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            cats = " ".join(" ".join(c) for c in r.get("categories") or [])
            ids.append(int(r["item_id"]))
            texts.append(f"{r.get('title') or ''} | {r.get('brand') or ''} | {cats}")
            brands.append(r.get("brand") or None)
    items = pa.table({"item_id": pa.array(ids, pa.int64()), "text": texts})
    users, its, seqs, full = [], [], [], {}
    with open(d / "sequential_data.txt", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            u, hist = int(parts[0]), [int(x) for x in parts[1:]]
            full[u] = hist
            train = hist[:-2]
            users += [u] * len(train)
            its += train
            seqs += range(len(train))
    ev = pa.table({"user_id": pa.array(users, pa.int64()), "item_id": pa.array(its, pa.int64()),
                   "seq": pa.array(seqs, pa.int32())})
    return items, ev, brands, full


@pytest.mark.slow
def test_beauty_timing_and_sanity(datasets_root: Path) -> None:
    items, ev, brands, full = load_beauty(datasets_root)
    assert items.num_rows == 12101
    t0, p0 = time.perf_counter(), time.process_time()
    c = content_vectors(items, "tfidf", dim=64, seed=0)
    t1, p1 = time.perf_counter(), time.process_time()
    e = engagement_vectors(ev, items["item_id"].to_numpy(), dim=64, window=5, seed=0)
    t2, p2 = time.perf_counter(), time.process_time()
    print(f"\nBeauty: {items.num_rows} items, {ev.num_rows} train events; "
          f"tfidf {t1 - t0:.2f}s wall / {p1 - p0:.2f}s cpu, engagement {t2 - t1:.2f}s wall / {p2 - p1:.2f}s cpu, "
          f"zero engagement rows {int((~e.any(1)).sum())}")
    assert c.shape == (12101, 64) and e.shape == (12101, 64)
    assert t1 - t0 < 120 and t2 - t1 < 120  # generous: the CI box is shared

    rng = np.random.default_rng(0)
    # content: the nearest neighbour shares the brand far more often than chance
    b = np.array([x or "" for x in brands])
    q = rng.choice(np.flatnonzero(b != ""), size=500, replace=False)
    sim = c[q] @ c.T  # [500, n]
    sim[np.arange(len(q)), q] = -np.inf
    nn = sim.argmax(axis=1)
    same_brand = float((b[nn] == b[q]).mean())
    chance = float((b[rng.integers(0, len(b), 500)] == b[q]).mean())
    assert same_brand > 0.5 and same_brand > 10 * max(chance, 0.01)
    # engagement: the held-out validation item is far closer to the last train item than a random item
    us = rng.choice(list(full), size=2000, replace=False)
    last = np.array([full[u][-3] for u in us]) - 1  # item ids are 1..n in row order
    valid = np.array([full[u][-2] for u in us]) - 1
    rand = rng.integers(0, len(b), len(us))
    cos_valid = (e[last] * e[valid]).sum(1).mean()
    cos_rand = (e[last] * e[rand]).sum(1).mean()
    assert cos_valid > cos_rand + 0.1
