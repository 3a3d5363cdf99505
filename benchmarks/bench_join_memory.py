"""Peak memory and time of one full BucketJoinReader pass: 1 bucket vs 16 (UniPinRec §3.2).

The point of bucketing is that the trainer holds one bucket of events + feedviews at a
time. This builds a realistic table -- MovieLens-100K ``u.data`` replicated with shifted
user ids (default 15x = 1.5M events), feedviews = consecutive slates of 10 events with a
``like`` bit for ratings >= 4 -- writes it to an Iceberg store per bucket count, then runs
a full train pass of the reader in a *fresh subprocess* per bucket count and reports
that child's peak RSS and wall time.

Peak RSS is the child's ``VmHWM`` (``/proc/self/status``), not ``ru_maxrss``: Linux carries
``ru_maxrss`` over from the parent across fork/vfork + exec, so a child spawned by a parent
holding the 1.5M-row dataset would report the parent's size. ``ru_maxrss`` is printed too
(it is the max of the two) where ``/proc`` is missing.

    python benchmarks/bench_join_memory.py [--replicas 15] [--buckets 1 16] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

if TYPE_CHECKING:
    from genrec.data.schema import Dataset

ACTIONS = ["rate", "like"]
SLATE = 10


def build_dataset(u_data: Path, replicas: int) -> Dataset:
    from genrec.data.schema import EVENTS_SCHEMA, FEEDVIEWS_SCHEMA, ITEMS_SCHEMA, Dataset, DatasetInfo

    raw = pacsv.read_csv(u_data, read_options=pacsv.ReadOptions(column_names=["u", "i", "r", "t"]),
                         parse_options=pacsv.ParseOptions(delimiter="\t"))
    u0 = raw.column("u").to_numpy().astype(np.int64)
    shift = int(u0.max()) + 1
    u = np.concatenate([u0 + k * shift for k in range(replicas)])  # [N]
    i = np.tile(raw.column("i").to_numpy().astype(np.int64), replicas)
    r = np.tile(raw.column("r").to_numpy(), replicas)
    t = np.tile(raw.column("t").to_numpy().astype(np.int64), replicas)
    order = np.lexsort((np.arange(u.size), t, u))  # by user, time, line
    u, i, r, t = u[order], i[order], r[order], t[order]
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    seq = (np.arange(u.size) - np.repeat(starts, np.diff(np.r_[starts, u.size]))).astype(np.int32)
    like = r >= 4
    events = pa.table({
        "user_id": u, "item_id": i, "surface": pa.array(["web"] * u.size),
        "action": pa.DictionaryArray.from_arrays(like.astype(np.int32), ACTIONS).cast(pa.string()),
        "timestamp": t, "seq": seq,
    }, schema=EVENTS_SCHEMA)
    req = np.flatnonzero(seq % SLATE == 0)  # [F] first row of each slate
    offsets = pa.array(np.r_[req, u.size].astype(np.int32))
    labels = (1 | (like.astype(np.int32) << 1)).astype(np.int32)  # bit 0 rate, bit 1 like
    feedviews = pa.table({
        "user_id": u[req], "request_ts": t[req], "request_seq": seq[req], "surface": pa.array(["web"] * req.size),
        "item_ids": pa.ListArray.from_arrays(offsets, pa.array(i)),
        "labels": pa.ListArray.from_arrays(offsets, pa.array(labels)),
    }, schema=FEEDVIEWS_SCHEMA)
    ids = np.unique(i)
    items = pa.table({"item_id": ids, "title": [None] * ids.size, "text": [f"movie {x}" for x in ids],
                      "attributes": ["{}"] * ids.size}, schema=ITEMS_SCHEMA)
    info = DatasetInfo("ml-100k-x%d" % replicas, actions=ACTIONS, positive_actions=["like"], surfaces=["web"],
                       feedview_rule=f"consecutive slates of {SLATE} events per user")
    return Dataset(info, events, items, feedviews, source={"path": str(u_data), "replicas": replicas})


def peak_rss_kib() -> int:
    """This process's own peak resident set (KiB): VmHWM, else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(tables: str, context_len: int) -> None:
    """One full train pass; prints JSON with peak RSS and time."""
    from genrec.data.join import BucketJoinReader
    from genrec.data.splits import SplitSpec
    from genrec.data.store import TableStore

    store = TableStore(tables)
    reader = BucketJoinReader(store, split=SplitSpec("loo"), role="train", context_len=context_len, seed=0)
    base = peak_rss_kib()
    t0 = time.perf_counter()
    n_ex = n_ev = n_fv = 0
    for ex in reader:
        n_ex += 1
        n_ev += ex.items.size
        n_fv += len(ex.feedviews)
    dt = time.perf_counter() - t0
    peak = peak_rss_kib()
    print(json.dumps({"peak_kib": peak, "base_kib": base,
                      "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "seconds": dt, "examples": n_ex,
                      "history_events": n_ev, "feedviews": n_fv}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=15)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--context-len", type=int, default=200)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.context_len)
        return

    from genrec.data.store import TableStore
    from genrec.paths import data_root

    u_data = data_root(args.data_dir) / "movielens-100k" / "u.data"
    sample = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "movielens-100k" / "u.data"
    if not u_data.exists() and args.data_dir is None and sample.exists():
        u_data = sample  # the checkout's sibling datasets folder (same default as tests/conftest.py)
    if not u_data.exists():
        sys.exit(f"{u_data} not found: set $GENREC_DATA_DIR or --data-dir to the folder holding movielens-100k/")
    t0 = time.perf_counter()
    ds = build_dataset(u_data, args.replicas)
    print(f"data: {ds.events.num_rows:,} events, {ds.feedviews.num_rows:,} feedviews, "
          f"{ds.events.column('user_id').unique().__len__():,} users ({time.perf_counter() - t0:.1f}s to build)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp:
        for nb in args.buckets:
            tables = Path(tmp) / f"b{nb}"
            t1 = time.perf_counter()
            TableStore(tables).write(ds, n_buckets=nb)
            wt = time.perf_counter() - t1
            out = subprocess.run([sys.executable, __file__, "--child", str(tables), "--context-len",
                                  str(args.context_len)], check=True, capture_output=True, text=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            res["buckets"], res["write_s"] = nb, wt
            rows.append(res)
    ref = rows[0]["peak_kib"]
    print(f"\ncontext_len={args.context_len}, role=train, loo split, keep_no_interaction=0.1")
    print(f"{'buckets':>7} | {'peak RSS MiB':>12} | {'after init MiB':>14} | {'pass s':>7} | {'write s':>7} | "
          f"{'examples':>8} | {'feedviews':>9} | {'peak / first':>12}")
    for r in rows:
        print(f"{r['buckets']:>7} | {r['peak_kib'] / 1024:>12.0f} | {r['base_kib'] / 1024:>14.0f} | "
              f"{r['seconds']:>7.1f} | {r['write_s']:>7.1f} | {r['examples']:>8,} | {r['feedviews']:>9,} | "
              f"{r['peak_kib'] / ref:>12.2f}")
    if len({(r["examples"], r["history_events"], r["feedviews"]) for r in rows}) != 1:
        sys.exit("ERROR: bucket counts disagree on the output")


if __name__ == "__main__":
    main()
