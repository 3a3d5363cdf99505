"""Diagnosis (GPU): what invalidates a CUDA-graph capture when request threads capture, replay and run
eager forwards at once (tests/model/test_graphs_static.py::test_captures_from_several_threads_at_once).

Runs that test's body several times per variant and counts failures:
  as_test      4 threads: eager forwards + graphed encoder/ranker (the test);
  graphs_only  the eager references computed first, serially; threads only call the graphed paths;
  no_gc        as_test with Python's cyclic GC off during the threads;
  eager_locked as_test with each eager forward holding graphs._CAPTURE_LOCK (no eager work during a capture).

    python benchmarks/debug_capture_threads.py [--reps 4]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "model"))
import test_graphs_static as tgs  # noqa: E402

from genrec.model import graphs  # noqa: E402
from genrec.model.graphs import GraphedEncoder, GraphedRanker  # noqa: E402


def once(variant: str, seed: int) -> list[str]:
    model = tgs.eqv.make_model(5 + seed, layout="pinger", sid_fusion=True, max_items=100).cuda()
    cfg = model.config
    enc = GraphedEncoder(model, min_bucket=8)
    rnk = GraphedRanker(model, min_bucket=8, min_cand_bucket=4)
    start = threading.Barrier(4)
    errors: list[str] = []
    inputs = {}
    for t in range(4):
        for rep in range(3):
            b = 1 + (t + rep) % 4
            inputs[t, rep] = (tgs._serving_batch(cfg, [40] * b, 40, 100 * t + rep, "cuda"), tgs._cands(cfg, b, 7, t + rep, "cuda"))
    wants = {}
    if variant == "graphs_only":
        with torch.no_grad():
            for key, (batch, (vecs, codes, surf)) in inputs.items():
                c, u, _ = model.encode_history(batch)
                wants[key] = (u, model.rank(c, vecs, codes, surf))
    lock = graphs._CAPTURE_LOCK if variant == "eager_locked" else contextlib.nullcontext()

    def worker(t: int) -> None:
        try:
            start.wait()
            for rep in range(3):
                batch, (vecs, codes, surf) = inputs[t, rep]
                with torch.no_grad():
                    if variant == "graphs_only":
                        want_user, want_rank = wants[t, rep]
                        got_cache, got_user, _ = enc(batch)
                    else:
                        with lock:
                            want_cache, want_user, _ = model.encode_history(batch)
                        got_cache, got_user, _ = enc(batch)
                        with lock:
                            want_rank = model.rank(want_cache, vecs, codes, surf)
                    torch.testing.assert_close(got_user, want_user, atol=2e-5, rtol=0)
                    torch.testing.assert_close(rnk(got_cache, vecs, codes, surf), want_rank, atol=2e-5, rtol=0)
        except BaseException as e:  # noqa: BLE001
            errors.append(f"thread {t}: {type(e).__name__}: {str(e).splitlines()[0][:160]}\n"
                          + "".join(traceback.format_tb(e.__traceback__)[-4:]))

    if variant == "no_gc":
        gc.disable()
    try:
        ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    finally:
        gc.enable()
    torch.cuda.synchronize()
    return errors


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--variants", default="as_test,graphs_only,no_gc,eager_locked")
    a = ap.parse_args()
    for variant in a.variants.split(","):
        fails = 0
        first = None
        for r in range(a.reps):
            try:
                errs = once(variant, r)
            except Exception as e:  # noqa: BLE001 - a poisoned context: report and stop this variant
                errs = [f"outside threads: {type(e).__name__}: {str(e)[:200]}"]
            if errs:
                fails += 1
                first = first or errs[0]
        print(f"{variant:14s} failed {fails}/{a.reps}", flush=True)
        if first:
            print("   first error: " + first.replace("\n", "\n   "), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
