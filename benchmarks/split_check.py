"""Is a validation -> test drop the model's or the split's? Model-free baselines on both.

    python benchmarks/split_check.py WORKDIR

Checks the leave-one-out split (each test history = the validation history + the validation
target; targets never in their own history) and scores two model-free baselines built from
the training split only on the validation and the test cases: popularity@10 and a first-order
Markov chain (the 10 most frequent successors of the last history item). If they drop as much
as the trained models, the drop belongs to the data, not to training.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import numpy as np

from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.pipeline import open_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    a = ap.parse_args()
    store, spec = open_store(a.workdir), SplitSpec("loo")
    recs = {role: list(BucketJoinReader(store, split=spec, role=role, context_len=10 ** 9))
            for role in ("train", "valid", "test")}
    va = {r.user_id: r for r in recs["valid"]}
    consistent = sum(np.array_equal(np.asarray(t.items[:-1]), np.asarray(va[t.user_id].items))
                     and t.items[-1] == va[t.user_id].target_item for t in recs["test"] if t.user_id in va)
    in_hist = {role: float(np.mean([r.target_item in set(r.items) for r in recs[role]])) for role in ("valid", "test")}
    pop: Counter[int] = Counter()
    succ: dict[int, Counter[int]] = defaultdict(Counter)
    for r in recs["train"]:
        it = [int(x) for x in r.items]
        pop.update(it)
        for x, y in zip(it[:-1], it[1:]):
            succ[x][y] += 1
    top = {i for i, _ in pop.most_common(10)}

    def score(rs: list) -> tuple[float, float, float]:  # type: ignore[type-arg]
        p = np.mean([r.target_item in top for r in rs])
        m = np.mean([r.target_item in {y for y, _ in succ[int(r.items[-1])].most_common(10)} for r in rs])
        unseen = np.mean([pop[int(r.target_item)] == 0 for r in rs])
        return float(p), float(m), float(unseen)

    print(f"test cases consistent with validation (history + target): {consistent} / {len(recs['test'])}")
    print(f"target inside its own history: valid {in_hist['valid']:.4f}  test {in_hist['test']:.4f}")
    print("| split | cases | popularity R@10 | Markov R@10 | target unseen in train |\n|---|---|---|---|---|")
    for role in ("valid", "test"):
        p, m, u = score(recs[role])
        print(f"| {role} | {len(recs[role])} | {p:.4f} | {m:.4f} | {u:.4f} |")


if __name__ == "__main__":
    main()
