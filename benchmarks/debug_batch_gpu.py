"""Debug aid (GPU): batched recommend() on the graphed path vs one request at a time, from one
thread and from four at once. Prints tracebacks and mismatches.

    python benchmarks/debug_batch_gpu.py WORKDIR
"""

from __future__ import annotations

import random
import sys
import threading
import traceback

import torch

from genrec.retrieve.recommender import Recommender
from genrec.serve.loadgen import sample_histories


def main() -> None:
    wd = sys.argv[1]
    rec = Recommender.from_checkpoint(wd, device="cuda" if torch.cuda.is_available() else "cpu")
    print("graphs", rec.cuda_graphs, "warmup", rec.warmup(beam_width=60), flush=True)
    hs = sample_histories(wd, 16, 1000, exact=True)
    hs = [h[-n:] for h, n in zip(hs, [1000, 1000, 700, 1000, 300, 1000, 1000, 999] * 2)]
    hist = [[{"item_id": int(i)} for i in h] for h in hs]
    single = [[r.item_id for r in rec.recommend(h, k=10, beam_width=60)] for h in hist]
    bad = 0
    for bsz in (2, 3, 4, 8):
        try:
            out = rec.recommend(hist[:bsz], k=10, beam_width=60)
            got = [[r.item_id for r in o] for o in out]
            same = [g == s for g, s in zip(got, single[:bsz])]
            print(f"batch {bsz}: same as single {same}", flush=True)
        except Exception:  # noqa: BLE001
            bad += 1
            print(f"batch {bsz}: FAILED", flush=True)
            traceback.print_exc()
    errors: list[str] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(25):
            bsz = rnd.choice([1, 2, 3, 4])
            idx = rnd.sample(range(len(hist)), bsz)
            try:
                out = rec.recommend([hist[i] for i in idx], k=10, beam_width=60)
                for i, o in zip(idx, out):
                    if [r.item_id for r in o] != single[i]:
                        errors.append(f"mismatch row {i} batch {bsz}")
            except Exception:  # noqa: BLE001
                errors.append(traceback.format_exc())

    ts = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"threads: {len(errors)} errors", flush=True)
    for e in errors[:3]:
        print(e, flush=True)


if __name__ == "__main__":
    main()
