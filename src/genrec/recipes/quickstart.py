"""``genrec quickstart``: the whole pipeline on the default data, with a one-screen summary.

prepare (Iceberg tables) -> features (content + engagement) -> SIDs (codes, trie, index)
-> train (quickstart preset, a few minutes on 2 CPU cores) -> the L1 fusion weights chosen on
validation users -> validation metrics beside the popularity baseline -> recommendations for one
user from one history encode.

The validation users are split once, at random with a fixed seed, into tuning users (the fusion
weights are chosen on them) and reporting users: every row of the summary (ANN, SID, L0+L1,
popularity) is measured on the same reporting users, none of whom the weights were chosen on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from genrec.data.ingest.options import IngestOptions
from genrec.eval.baselines import Popularity
from genrec.eval.evaluate import EvalConfig, l0l1_pass, load_eval_data, served_sid_stage
from genrec.eval.fusion_tune import tune_fusion
from genrec.eval.metrics import topk_metrics
from genrec.eval.retrieval import evaluate_retrieval, split_eval_set
from genrec.infer.cases import user_history
from genrec.infer.recommender import Recommender
from genrec.infer.results import RecommendationList
from genrec.infer.show import print_recommendations
from genrec.recipes import pipeline
from genrec.recipes.training import train_run
from genrec.train.run import RunConfig


def run_quickstart(workdir: str | Path, *, dataset: str = "movielens-100k", data_dir: str | Path | None = None,
                   download: bool = False, steps: int = 0, fusion_users: int = 500, report_users: int = 0,
                   split_seed: int = 0, console: Console | None = None) -> dict[str, Any]:
    """The whole pipeline and its summary. ``fusion_users`` validation users choose the L1 fusion weights;
    every summary row is measured on the other validation users (``report_users`` of them at random; 0: all);
    the split is drawn once, with ``split_seed``."""
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
        sb = pipeline.build_semantic_ids(wd)
    step(f"sid build {sb.version}: codebooks {sb.codebook_sizes}, "
         f"collisions before disambiguation {sb.stats.get('collision_rate', float('nan')):.2f}", t)
    t = time.perf_counter()
    overrides = [f"train.total_steps={steps}"] if steps else []
    cfg = RunConfig.from_name("quickstart", overrides)
    res = train_run(wd, cfg, resume=False)
    step(f"train {res['step']} steps ({cfg.variant}, preset quickstart)", t)

    t = time.perf_counter()
    rec = Recommender.from_checkpoint(wd)
    data = load_eval_data(rec, wd, EvalConfig(split="valid", max_users=0))  # every validation case
    tune_es, report_es = split_eval_set(data.es, fusion_users, report_users, split_seed)
    tuning = [int(ex.user_id) for ex in tune_es.examples]
    reporting = [int(ex.user_id) for ex in report_es.examples]
    step(f"validation users: {len(data.es)}, split once (seed {split_seed}): {len(tuning)} tuning users choose "
         f"the fusion weights, {len(reporting)} other users report every row", t)

    t = time.perf_counter()
    with con.status("choosing the L1 score-fusion weights on the tuning users ..."):
        fusion = tune_fusion(wd, rec=rec, eval_set=tune_es, beam_width=20, transitions=data.transitions)
    c = fusion["chosen"]
    step(f"fusion tune: a={c['action_weight']:g} w={c['retrieval_weight']:g} v={c['sid_weight']:g} "
         f"t={c['transition_weight']:g} h={c['history_weight']:g} on "
         f"{fusion['chosen_on']['cases']} tuning users (stored for this checkpoint)", t)

    # every row on the same reporting users (same split, same cases), none of whom the weights were chosen on
    t = time.perf_counter()
    ks = (5, 10, 20)
    rows: dict[str, dict[str, float]] = {}
    with con.status(f"measuring every path on the {len(reporting)} reporting users ..."):
        paths = tuple(p for p in ("ann", "sid") if (p == "ann" and rec.ann is not None)
                      or (p == "sid" and rec.trie is not None))
        if paths:
            ret = evaluate_retrieval(rec.catalog_model, report_es, paths=paths, ks=ks, beam_width=20,
                                     context_len=rec.context_len, **served_sid_stage(rec))  # the SID stage as served
            rows.update({f"genrec {p}": ret[p] for p in paths if p in ret})
        rows["genrec L0+L1"] = l0l1_pass(rec, report_es, ks=ks, beam_width=20, diversity_lambda=0.0,
                                         overretrieve=int(fusion["chosen_on"]["overretrieve"]),
                                         utility=fusion["chosen_on"]["utility"], action_weight=c["action_weight"],
                                         retrieval_weight=c["retrieval_weight"], sid_weight=c["sid_weight"],
                                         transition_weight=c["transition_weight"], transitions=data.transitions,
                                         history_weight=c["history_weight"])
        pop = Popularity(rec.catalog.item_ids, data.train_item_ids)
        pop_m = topk_metrics(pop.target_ranks(report_es.target_rows), ks)
        rows["popularity"] = pop_m
    step(f"validation metrics on the {len(reporting)} reporting users", t)

    table = Table(title=f"validation (leave-one-out, full catalogue): every row on the same {len(reporting)} "
                        f"reporting users; the fusion weights were chosen on {len(tuning)} other users")
    for col in ("path", "users", "Recall@10", "NDCG@10", "Recall@20"):
        table.add_column(col)
    for name, m in rows.items():
        table.add_row(name, f"{int(m['n'])}", f"{m['recall@10']:.4f}", f"{m['ndcg@10']:.4f}", f"{m['recall@20']:.4f}")
    con.print(table)

    t = time.perf_counter()
    user = int(pipeline.open_store(wd).read_events(columns=["user_id"]).column("user_id")[0].as_py())
    recs = cast(RecommendationList, rec.recommend(user_history(wd, user), k=10))  # one history -> one list
    print_recommendations(recs, who=f"user {user}", step=rec.step, console=con)
    step(f"recommend for user {user} (one history encode: SID beams + ANN -> L1 ranking)", t)
    timings["total"] = round(time.perf_counter() - t0, 1)
    con.print(f"[bold]quickstart done in {timings['total']} s[/bold] — run dir: {wd}")
    return {"timings": timings, "train": res, "popularity": pop_m, "fusion": fusion, "recommendations": recs.to_dict(),
            "users": {"split_seed": split_seed, "validation": len(data.es), "tuning": tuning, "reporting": reporting},
            "report": rows}
