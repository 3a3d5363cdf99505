"""Training input at scale: peak memory and examples/s of today's in-memory loader, streaming, and Ray (issue 40).

For each run directory (tables from ``genrec data synth``) and each loader, a *fresh subprocess* builds the
loader and draws ``--steps`` training batches (default: one epoch) of ``--batch`` examples, as one rank of one:

* ``memory``: today's loader -- the join over every bucket materialised, then ``BatchStream``;
* ``stream``: ``data.stream=true`` -- the stream index (per-bucket counts; built, not read from its cache), then
  ``StreamBatches`` reading ``--window`` buckets at a time in the trainer's process;
* ``ray``: ``data.engine=ray`` -- the same order, the windows read, joined and collated by ``--ray-workers`` Ray
  Data actors of a local Ray (``num_cpus`` = the machine's cores); needs ``pip install 'ray[data]'``.

Reported: start-up seconds (materialise / index + Ray start), the steady examples/s over the drawn batches, the
examples/s of start-up + those batches together, the trainer process's peak RSS (``VmHWM``) and, sampled every
0.2 s, the peak summed RSS of the trainer and every process under it (Ray's raylet, workers and object store
pages they map: shared pages count once per process, so this over-counts). A child whose summed RSS passes
``--max-rss-gib`` stops itself and is reported as such.

    python benchmarks/bench_stream.py RUN_DIR [RUN_DIR ...] [--modes memory,stream,ray] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(root: int) -> list[int]:
    """``root`` and every process under it (from /proc's parent ids)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


class TreeSampler(threading.Thread):
    """Peak summed RSS of this process and its descendants; exits the process past ``limit_kib``."""

    def __init__(self, limit_kib: int) -> None:
        super().__init__(daemon=True)
        self.limit, self.peak, self.stop = limit_kib, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            total = sum(_rss_kib(p) for p in _tree(os.getpid()))
            self.peak = max(self.peak, total)
            if total > self.limit:
                print(json.dumps({"exceeded_kib": total}), flush=True)
                os._exit(3)


def child(mode: str, workdir: str, steps: int, batch: int, window: int, workers: int, max_rss_kib: int) -> None:
    import torch

    from genrec.catalog import ItemCatalog
    from genrec.data.join import BucketJoinReader
    from genrec.data.splits import SplitSpec
    from genrec.data.store import TableStore
    from genrec.data.stream_index import build_stream_index
    from genrec.train.batches import BatchStream, materialise
    from genrec.train.run import DataConfig
    from genrec.train.stream import CollateOptions, EmbeddedEngine, StreamBatches, WindowPlan, WindowReader

    sampler = TreeSampler(max_rss_kib)
    sampler.start()
    store = TableStore(Path(workdir) / "tables")
    info = store.info()
    ids = store.read_items().column("item_id").to_numpy()
    catalog = ItemCatalog(item_ids=ids, feats=torch.zeros(len(ids), 0), codes=None)
    d = DataConfig()  # the training defaults: context 50, p_rank .5, 16 slate + 8 sampled candidates, pad 8
    opts: dict[str, Any] = dict(context_len=d.context_len, n_actions=len(info.actions), p_rank=d.p_rank,
                                max_cands=d.max_cands, neg_cands=d.neg_cands, n_catalog=len(catalog),
                                pad_multiple=d.pad_multiple)
    base = _rss_kib(os.getpid(), "VmHWM")
    t0 = time.perf_counter()
    engine: Any = None
    if mode == "memory":
        reader = BucketJoinReader(store, split=SplitSpec("loo"), role="train", context_len=10 ** 9, seed=0)
        bs = BatchStream(materialise(reader, catalog), batch_size=batch, seed=0, **opts)
        it, spe = bs.iter_from(0), bs.steps_per_epoch
    else:
        index = build_stream_index(store, SplitSpec("loo"))
        plan = WindowPlan(index.examples, batch_size=batch, seed=0, window_buckets=window)
        if mode == "ray":
            from genrec.train.ray_engine import RayEngine

            engine = RayEngine(store.tables_dir, None, SplitSpec("loo"), ids, seed=0, workers=workers,
                               num_cpus=os.cpu_count()).__enter__()
        else:
            engine = EmbeddedEngine(WindowReader(store, SplitSpec("loo"), catalog, seed=0))
        it = StreamBatches(engine, plan, CollateOptions(**opts)).iter_from(0)
        spe = plan.steps_per_epoch
    startup = time.perf_counter() - t0
    n = min(steps, spe) if steps else spe
    t1 = time.perf_counter()
    examples = 0
    for _ in range(n):
        examples += int(next(it).lengths.shape[0])
    dt = time.perf_counter() - t1
    if mode == "ray":
        engine.__exit__(None, None, None)
    sampler.stop.set()
    print(json.dumps({"mode": mode, "startup_s": startup, "steps": n, "steps_per_epoch": spe, "examples": examples,
                      "seconds": dt, "peak_kib": _rss_kib(os.getpid(), "VmHWM"), "base_kib": base,
                      "tree_peak_kib": sampler.peak}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workdirs", nargs="*")
    ap.add_argument("--modes", default="memory,stream,ray")
    ap.add_argument("--steps", type=int, default=0, help="batches drawn per loader (0: one epoch)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--window", type=int, default=1, help="data.window_buckets")
    ap.add_argument("--ray-workers", type=int, default=2)
    ap.add_argument("--max-rss-gib", type=float, default=14.0)
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    limit = int(args.max_rss_gib * 1024 ** 2)
    if args.child:
        child(args.child[0], args.child[1], args.steps, args.batch, args.window, args.ray_workers, limit)
        return
    if not args.workdirs:
        ap.error("name at least one run directory (`genrec data synth RUN_DIR --users U --items I --events N`)")
    rows = []
    for wd in args.workdirs:
        man = json.loads((Path(wd) / "tables" / "manifest.json").read_text())
        for mode in args.modes.split(","):
            t = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--child", mode, wd, "--steps", str(args.steps),
                                  "--batch", str(args.batch), "--window", str(args.window), "--ray-workers",
                                  str(args.ray_workers), "--max-rss-gib", str(args.max_rss_gib)],
                                 capture_output=True, text=True)
            lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
            if out.returncode not in (0, 3) or not lines:
                sys.exit(f"{mode} on {wd} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            r = {**lines[-1], "mode": mode, "events": man["counts"]["events"], "buckets": man["n_buckets"],
                 "wall_s": time.perf_counter() - t}
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    print(f"\nbatch {args.batch}, window_buckets {args.window}, ray workers {args.ray_workers}, one rank; "
          f"batches drawn: {args.steps or 'one epoch'}")
    print(table(rows, args.max_rss_gib))


def table(rows: list[dict[str, Any]], max_rss_gib: float) -> str:
    """The markdown table of the children's JSON rows (``first epoch s`` is projected from the drawn batches'
    pace when fewer than an epoch were drawn)."""
    out = ["| events | buckets | loader | start-up s | batches drawn | examples/s | first epoch s | "
           "peak RSS MiB (trainer) | peak RSS MiB (all processes) |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "exceeded_kib" in r:
            out.append(f"| {r['events']:,} | {r['buckets']} | {r['mode']} | stopped: summed RSS passed "
                       f"{max_rss_gib:g} GiB | | | | | |")
            continue
        epoch = r["startup_s"] + r["seconds"] * r["steps_per_epoch"] / r["steps"]
        out.append(f"| {r['events']:,} | {r['buckets']} | {r['mode']} | {r['startup_s']:.1f} | {r['steps']:,} | "
                   f"{r['examples'] / r['seconds']:,.0f} | {epoch:,.0f} | {r['peak_kib'] / 1024:,.0f} | "
                   f"{r['tree_peak_kib'] / 1024:,.0f} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
