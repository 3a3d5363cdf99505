"""``genrec quickstart``: the whole pipeline on the default data, with a one-screen summary.

prepare (Iceberg tables) -> features (content + engagement) -> SIDs (codes, trie, index)
-> train (quickstart preset, a few minutes on 2 CPU cores) -> the L1 fusion weights chosen on
validation users -> validation metrics beside the popularity baseline -> recommendations for one
user from one history encode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import numpy as np
from rich.console import Console
from rich.table import Table


def run_quickstart(workdir: str | Path, *, dataset: str = "movielens-100k", data_dir: str | Path | None = None,
                   download: bool = False, steps: int = 0, fusion_users: int = 500,
                   console: Console | None = None) -> dict[str, Any]:
    from genrec import pipeline
    from genrec.data.ingest.options import IngestOptions
    from genrec.data.splits import SplitSpec, eval_cases, train_events
    from genrec.eval.baselines import Popularity
    from genrec.eval.metrics import rank_of_targets, topk_metrics
    from genrec.train.run import RunConfig, train_run

    con = console or Console()
    wd = Path(workdir)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def step(name: str, t: float) -> None:
        timings[name] = round(time.perf_counter() - t, 1)
        con.print(f"[green]✓[/green] {name} ({timings[name]} s)")

    t = time.perf_counter()
    with con.status(f"ingesting {dataset} ..."):
        man = pipeline.prepare(wd, dataset, data_dir=data_dir, options=IngestOptions(download=download))
    step(f"data prepare {dataset}: {man['counts']}", t)
    t = time.perf_counter()
    with con.status("building item vectors ..."):
        vecs = pipeline.build_item_features(wd)
    step(f"features: content {vecs.content.shape[1]}-d + engagement {vecs.engagement.shape[1]}-d "
         f"for {len(vecs)} items", t)
    t = time.perf_counter()
    with con.status("building Semantic IDs, trie and index ..."):
        sb = pipeline.build_semantic_ids(wd, levels=3)
    step(f"sid build {sb.version}: codebooks {sb.codebook_sizes}, "
         f"collisions before disambiguation {sb.stats.get('collision_rate', float('nan')):.2f}", t)
    t = time.perf_counter()
    overrides = [f"train.total_steps={steps}"] if steps else []
    cfg = RunConfig.from_name("quickstart", overrides)
    res = train_run(wd, cfg, resume=False)
    step(f"train {res['step']} steps ({cfg.variant}, preset quickstart)", t)

    from genrec.eval.evaluate import tune_fusion

    t = time.perf_counter()
    with con.status("choosing the L1 score-fusion weights on validation users ..."):
        fusion = tune_fusion(wd, max_users=fusion_users, beam_width=20)
    c = fusion["chosen"]
    step(f"fusion tune: a={c['action_weight']:g} w={c['retrieval_weight']:g} v={c['sid_weight']:g} on "
         f"{fusion['chosen_on']['cases']} validation users (stored for this checkpoint)", t)

    # popularity on the same validation cases (same split)
    store = pipeline.open_store(wd)
    events = store.read_events()
    spec = SplitSpec(kind="loo")
    cases = eval_cases(events, spec, "valid")
    cat_ids = np.asarray(vecs.item_ids)
    pop = Popularity(cat_ids, train_events(events, spec).column("item_id").to_numpy())
    tgt_rows = vecs.index_of(cases.target_item)  # rows in catalogue order, like the popularity scores
    pop_m = topk_metrics(rank_of_targets(lambda idx: pop.score(len(idx)), len(cases), tgt_rows), (5, 10, 20))

    table = Table(title=f"validation (leave-one-out, full catalogue, {res['valid_cases']} users sampled)")
    for c in ("path", "Recall@10", "NDCG@10", "Recall@20"):
        table.add_column(c)
    for p in ("ann", "sid"):
        v = res["valid"]
        if f"valid/{p}/recall@10" in v:
            table.add_row(f"genrec {p}", f"{v[f'valid/{p}/recall@10']:.4f}", f"{v[f'valid/{p}/ndcg@10']:.4f}",
                          f"{v[f'valid/{p}/recall@20']:.4f}")
    fv = fusion["valid"]
    table.add_row(f"genrec L0+L1 (weights chosen on these {fusion['chosen_on']['cases']} users)",
                  f"{fv['recall@10']:.4f}", f"{fv['ndcg@10']:.4f}", f"{fv['recall@20']:.4f}")
    table.add_row("popularity (all valid users)", f"{pop_m['recall@10']:.4f}", f"{pop_m['ndcg@10']:.4f}",
                  f"{pop_m['recall@20']:.4f}")
    con.print(table)

    from genrec.retrieve.recommender import RecommendationList, Recommender, user_history
    from genrec.retrieve.show import print_recommendations

    t = time.perf_counter()
    rec = Recommender.from_checkpoint(wd)
    user = int(events.column("user_id")[0].as_py())
    recs = cast(RecommendationList, rec.recommend(user_history(wd, user), k=10))  # one history -> one list
    print_recommendations(recs, who=f"user {user}", step=rec.step, console=con)
    step(f"recommend for user {user} (one history encode: SID beams + ANN -> L1 ranking)", t)
    timings["total"] = round(time.perf_counter() - t0, 1)
    con.print(f"[bold]quickstart done in {timings['total']} s[/bold] — run dir: {wd}")
    return {"timings": timings, "train": res, "popularity": pop_m, "fusion": fusion, "recommendations": recs.to_dict()}
