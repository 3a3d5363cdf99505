"""Tune on validation, then score the test split once: genrec against its baselines, same run.

    python benchmarks/tune_quality.py WORKDIR --grid configs/grids/beauty.json [--parallel 8]

WORKDIR holds prepared tables, features and SIDs. The grid names configurations, each with a
family (``sasrec`` / ``genrec`` / ``tiger`` ...), the validation metric that selects within the
family, and ``key=value`` overrides on top of the grid's common ones. Every configuration
trains in its own run directory ``WORKDIR-tune/<name>`` (tables/features/sid linked), all of
them at once on the one GPU (``--parallel`` processes), with periodic validation, early
stopping and a wall-time cap (``train.max_minutes``); the trainer marks the best validation
checkpoint. Then, per family, the configuration with the best validation score is chosen and
only that one touches the test split: full catalogue, history items not excluded, Recall/NDCG
@5/10/20 for its SID and ANN paths (and L0+L1 when it was trained with the action loss).
Popularity is scored on the same cases. Finally a token-efficiency sweep on the validation
cases: SID-path recall of the chosen genrec and TIGER models against serving history tokens.

L0+L1: every configuration marked ``"l0l1": true`` runs the L0 (SID beams ∪ ANN, over-retrieved)
-> L1 path once on the validation cases, recording each candidate's score parts; the L1 fusion
weights (a * action utility + w * dense logit + v * log P(SID), see ``Recommender.run_batch``)
are chosen on validation over a grid (``genrec.eval.evaluate.choose_fusion``), across those
configurations, and only the chosen (configuration, weights) runs on the test split. The SID
path's beam width is likewise chosen on validation among ``--sid-beams``.

Prints Markdown tables; everything to ``$OUT/tune.json`` when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.infer.fusion import FUSION_GRID  # the grid `genrec fusion tune` uses


def _link_parts(base: Path, d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for part in ("tables", "features", "sid"):
        if not (d / part).exists():
            (d / part).symlink_to((base / part).resolve())


def worker(run_dir: str, preset: str, overrides: list[str]) -> None:
    from genrec.recipes.training import train_run
    from genrec.train.run import RunConfig

    cfg = RunConfig.from_name(preset, overrides)
    t0 = time.perf_counter()
    res = train_run(run_dir, cfg, resume=False)
    res["train_seconds"] = time.perf_counter() - t0
    res["overrides"] = overrides
    tmp = Path(run_dir) / "tune_result.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(Path(run_dir) / "tune_result.json")


def best_valid(run_dir: Path) -> tuple[float | None, int | None]:
    """The trainer's best validation value (of the run's selection metric) and its step."""
    from genrec.train.checkpoint import resolve_checkpoint
    from genrec.workdir import read_json

    try:
        ckpt = resolve_checkpoint(run_dir / "checkpoints", "BEST")
    except Exception:
        return None, None
    if ckpt is None:
        return None, None
    st = read_json(ckpt / "extra.json").get("_trainer", {})
    return st.get("best_metric"), st.get("best_step")


def choose_on_validation(a: argparse.Namespace, configs: list[dict[str, Any]], chosen: dict[str, dict[str, Any]],
                         root: Path, valid_set: Any, ks: tuple[int, ...], dev: str
                         ) -> tuple[dict[str, int], dict[str, Any]]:
    """Validation only: the genrec SID path's beam width, and the L0+L1 (configuration, fusion
    weights) -- one recorded L0+L1 pass per configuration, re-weighted offline over FUSION_GRID."""
    from genrec.eval.evaluate import choose_fusion, l0l1_pass
    from genrec.eval.retrieval import evaluate_retrieval
    from genrec.infer.recommender import Recommender

    sid_beam: dict[str, int] = {}
    beams = [int(x) for x in a.sid_beams.split(",") if x.strip()]
    for fam in [f for f in chosen if f.startswith("genrec")] if beams else []:
        rec = Recommender.from_checkpoint(root / chosen[fam]["name"], "BEST", device=dev)
        scores = {}
        for bw in beams:
            m = evaluate_retrieval(rec.catalog_model, valid_set, paths=("sid",), beam_width=bw, context_len=rec.context_len,
                                   trie=rec.trie, leaf_rows=rec.leaf_rows, batch_size=256, ks=ks)["sid"]
            scores[bw] = m["recall@10"]
            print(f"valid SID beam {bw} ({fam}): R@10 {m['recall@10']:.4f}", flush=True)
        sid_beam[fam] = max(beams, key=lambda bw: (scores[bw], -bw))
        del rec
    rows: list[dict[str, Any]] = []
    for c in configs:
        if not c.get("l0l1") or not (root / c["name"] / "tune_result.json").exists():
            continue
        rec = Recommender.from_checkpoint(root / c["name"], "BEST", device=dev)
        parts: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        l0l1_pass(rec, valid_set, ks=ks, beam_width=a.l0l1_beam, diversity_lambda=0.0, overretrieve=3,
                  utility={x: 1.0 for x in rec.actions}, batch_size=256, parts=parts)
        best, mine = choose_fusion(parts, ks, FUSION_GRID)
        rows += [{"config": c["name"], **r} for r in mine]
        at = {(r["a"], r["w"], r["v"]): r["recall@10"] for r in mine}
        print(f"valid L0+L1 {c['name']} ({time.perf_counter() - t0:.0f}s): best R@10 {best['recall@10']:.4f} at "
              f"a={best['a']:g} w={best['w']:g} v={best['v']:g}; a=1,w=v=0 (heads alone) {at[(1.0, 0.0, 0.0)]:.4f}; "
              f"w=1 only (dense) {at[(0.0, 1.0, 0.0)]:.4f}; v only (SID) {at[(0.0, 0.0, 1.0)]:.4f}",
              flush=True)
        del rec
    out: dict[str, Any] = {"grid": rows}
    if rows:  # ties: the earlier configuration, then the earlier (simpler) weighting
        out["chosen"] = max(rows, key=lambda r: r["recall@10"])
    return sid_beam, out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--grid", required=True)
    ap.add_argument("--preset", default="gpu-base")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--only", default="", help="comma-separated config names (default: all)")
    ap.add_argument("--beam", type=int, default=20)
    ap.add_argument("--no-test", action="store_true", help="stop after validation")
    ap.add_argument("--sid-beams", default="", help="e.g. 20,50: the genrec SID path's beam, chosen on validation")
    ap.add_argument("--l0l1-beam", type=int, default=50, help="SID beam width inside the L0+L1 path")
    ap.add_argument("--no-token-sweep", action="store_true")
    ap.add_argument("--valid-cases", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads per training process (0: the cores / the processes this run starts)")
    ap.add_argument("--test-cases", type=int, default=0, help="0 = every test case (a smaller number: smoke runs only)")
    a = ap.parse_args()
    base = Path(a.workdir).resolve()
    grid = json.loads(Path(a.grid).read_text())
    configs = [c for c in grid["configs"] if not a.only or c["name"] in a.only.split(",")]
    root = Path(f"{base}-tune")
    out_dir = Path(os.environ.get("OUT", root))
    out_dir.mkdir(parents=True, exist_ok=True)

    # ---- train every configuration, --parallel at a time
    queue = list(configs)
    running: list[tuple[dict[str, Any], subprocess.Popen[bytes], Any]] = []
    t_start = time.perf_counter()
    while queue or running:
        while queue and len(running) < a.parallel:
            c = queue.pop(0)
            d = root / c["name"]
            _link_parts(base, d)
            # eager unless the grid asks (train.compile=true): older grids keep their meaning
            ov = ["train.compile=false", *grid.get("common", []), f"train.early_stopping.metric={c['select']}", *c["overrides"]]
            log = open(d / "train.log", "wb")
            # each process gets its share of the cores (torch's default, all cores each, oversubscribes)
            threads = str(a.threads or max(1, (os.cpu_count() or 1) // max(1, min(a.parallel, len(configs)))))
            env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
            p = subprocess.Popen([sys.executable, __file__, "--worker", str(d), a.preset, *ov],
                                 stdout=log, stderr=subprocess.STDOUT, env=env)
            running.append((c, p, log))
            print(f"[{time.perf_counter() - t_start:6.0f}s] started {c['name']}: {' '.join(ov)}", flush=True)
        time.sleep(2)
        for item in list(running):
            c, p, log = item
            if p.poll() is not None:
                log.close()
                running.remove(item)
                print(f"[{time.perf_counter() - t_start:6.0f}s] {c['name']} exited {p.returncode}", flush=True)

    # ---- validation table, choice per family
    rows: list[dict[str, Any]] = []
    for c in configs:
        d = root / c["name"]
        res = json.loads((d / "tune_result.json").read_text()) if (d / "tune_result.json").exists() else {}
        v, step = best_valid(d)
        rows.append({"name": c["name"], "family": c["family"], "select": c["select"], "best_valid": v,
                     "best_step": step, "steps": res.get("step"), "train_seconds": res.get("train_seconds"),
                     "overrides": c["overrides"], "failed": not res})
    print("\n| config | family | overrides | selection metric | best valid | at step | steps run | train s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        bv = "failed" if r["best_valid"] is None else f"{r['best_valid']:.4f}"
        ts = "" if r["train_seconds"] is None else f"{r['train_seconds']:.0f}"
        print(f"| {r['name']} | {r['family']} | `{' '.join(r['overrides'])}` | {r['select']} | {bv} | "
              f"{r['best_step']} | {r['steps']} | {ts} |")
    chosen: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["best_valid"] is not None and (r["family"] not in chosen or r["best_valid"] > chosen[r["family"]]["best_valid"]):
            chosen[r["family"]] = r
    report: dict[str, Any] = {"grid": grid, "validation": rows, "chosen": {f: r["name"] for f, r in chosen.items()}}
    if a.no_test:
        (out_dir / "tune.json").write_text(json.dumps(report, indent=1, default=str))
        return

    # ---- the test split, once, for the chosen configuration of each family
    from genrec.catalog import load_catalog, open_store
    from genrec.data.join import BucketJoinReader
    from genrec.data.splits import SplitSpec, train_events
    from genrec.eval.baselines import Popularity
    from genrec.eval.evaluate import history_tokens_per_item, l0l1_pass
    from genrec.eval.metrics import rank_of_targets, topk_metrics
    from genrec.eval.retrieval import evaluate_retrieval, make_eval_set
    from genrec.infer.recommender import Recommender

    store = open_store(base)
    catalog = load_catalog(base)
    split = SplitSpec("loo")
    test_set = make_eval_set(list(BucketJoinReader(store, split=split, role="test", context_len=10 ** 6)), catalog,
                             max_cases=a.test_cases, seed=0)
    valid_set = make_eval_set(list(BucketJoinReader(store, split=split, role="valid", context_len=10 ** 6)), catalog,
                              max_cases=a.valid_cases, seed=0)
    pop = Popularity(catalog.item_ids, train_events(store.read_events(), split).column("item_id").to_numpy())
    ks = (5, 10, 20)
    pop_ranks = rank_of_targets(lambda idx: pop.score(len(idx)), len(test_set), test_set.target_rows)
    test: dict[str, dict[str, dict[str, float]]] = {"popularity": {"pop": topk_metrics(pop_ranks, ks)}}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    token_sweep: dict[str, list[dict[str, float]]] = {}
    test_ranks: dict[str, np.ndarray] = {"popularity/pop": np.asarray(pop_ranks)}  # family/path -> per-case ranks
    (out_dir / "tune.json").write_text(json.dumps(report, indent=1, default=str))  # partial: a cut-off run keeps it
    sid_beam, fusion = choose_on_validation(a, configs, chosen, root, valid_set, ks, dev)
    report["sid_beam_valid"], report["fusion_valid"] = sid_beam, fusion
    (out_dir / "tune.json").write_text(json.dumps(report, indent=1, default=str))
    for fam, r in chosen.items():
        d = root / r["name"]
        rec = Recommender.from_checkpoint(d, "BEST", device=dev)
        ctx = rec.context_len
        paths = ("ann",) if fam in sid_beam else ("ann", "sid")  # (the SID path then runs below at its beam)
        ro: dict[str, np.ndarray] = {}
        res = evaluate_retrieval(rec.catalog_model, test_set, paths=paths, beam_width=a.beam, context_len=ctx,
                                 trie=rec.trie, leaf_rows=rec.leaf_rows, batch_size=256, ks=ks, ranks_out=ro)
        if fam in sid_beam and rec.trie is not None:  # the SID path at the beam chosen on validation
            res["sid"] = evaluate_retrieval(rec.catalog_model, test_set, paths=("sid",), beam_width=sid_beam[fam],
                                            context_len=ctx, trie=rec.trie, leaf_rows=rec.leaf_rows,
                                            batch_size=256, ks=ks, ranks_out=ro)["sid"]
            res["sid"]["beam"] = sid_beam[fam]
        test_ranks.update({f"{fam}/{p}": r for p, r in ro.items() if p in res})
        test[f"{fam} ({r['name']}, step {rec.step})"] = res
        print(fam, r["name"], json.dumps({p: {k: round(v, 4) for k, v in m.items()} for p, m in res.items()}),
              flush=True)
        if rec.trie is not None and not a.no_token_sweep:  # serving history tokens vs SID recall, validation cases
            tpi = history_tokens_per_item(rec.config.layout, rec.config.sid_levels)
            pts = []
            for c in (1, 2, 3, 5, 8, 12, 20, 50):
                if c > ctx:
                    continue
                m = evaluate_retrieval(rec.catalog_model, valid_set, paths=("sid",), beam_width=a.beam, context_len=c,
                                       trie=rec.trie, leaf_rows=rec.leaf_rows, batch_size=256, ks=ks)["sid"]
                pts.append({"context_items": c, "serving_tokens": c * tpi, "recall@10": m["recall@10"],
                            "ndcg@10": m["ndcg@10"]})
            token_sweep[fam] = pts
        del rec
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if fusion.get("chosen"):  # the L0+L1 path, once, with the (configuration, weights) chosen on validation
        ch = fusion["chosen"]
        rec = Recommender.from_checkpoint(root / ch["config"], "BEST", device=dev)
        # store the choice for that checkpoint, as `genrec fusion tune` would: serving it then uses it
        from genrec.infer.fusion import FusionWeights

        rec.store_fusion(FusionWeights(ch["a"], ch["w"], ch["v"]), {x: 1.0 for x in rec.actions},
                         {"metric": "recall@10", "valid": {k: v for k, v in ch.items() if k not in ("config", "a", "w", "v")},
                          "chosen_on": {"split": "valid", "cases": len(valid_set), "beam_width": a.l0l1_beam}})
        kw = dict(ks=ks, beam_width=a.l0l1_beam, diversity_lambda=0.0, overretrieve=3,
                  utility={x: 1.0 for x in rec.actions}, batch_size=256)
        ro = {}
        l0l1 = l0l1_pass(rec, test_set, action_weight=ch["a"], retrieval_weight=ch["w"], sid_weight=ch["v"],
                         ranks_out=ro, **kw)
        test_ranks[f"{fam_of(configs, ch['config'])}/l0l1"] = ro["l0l1"]
        test[f"genrec L0+L1 ({ch['config']}, step {rec.step}, a={ch['a']:g} w={ch['w']:g} v={ch['v']:g})"] = {"l0l1": l0l1}
        print("l0l1 test", json.dumps({k: round(v, 4) for k, v in l0l1.items()}), flush=True)
        del rec
    report.update({"test": test, "test_cases": len(test_set), "token_sweep_valid": token_sweep,
                   "test_paired": paired_table(test_ranks),
                   "total_seconds": time.perf_counter() - t_start})
    (out_dir / "tune.json").write_text(json.dumps(report, indent=1, default=str))
    print("\n| model (chosen on validation) | path | Recall@5 | NDCG@5 | Recall@10 | NDCG@10 | Recall@20 |")
    print("|---|---|---|---|---|---|---|")
    for name, paths in test.items():
        for p, m in paths.items():
            print(f"| {name} | {p} | {m['recall@5']:.4f} | {m['ndcg@5']:.4f} | {m['recall@10']:.4f} | "
                  f"{m['ndcg@10']:.4f} | {m['recall@20']:.4f} |")
    print("\n| family | context items | serving tokens | valid SID Recall@10 |\n|---|---|---|---|")
    for fam, pts in token_sweep.items():
        for pt in pts:
            print(f"| {fam} | {pt['context_items']} | {pt['serving_tokens']} | {pt['recall@10']:.4f} |")


def fam_of(configs: list[dict[str, Any]], name: str) -> str:
    return next((c["family"] for c in configs if c["name"] == name), name)


def paired_table(test_ranks: dict[str, np.ndarray], n_boot: int = 2000) -> dict[str, dict[str, float]]:
    """Every genrec path's test Recall@10 against every baseline path's, paired over the same test
    cases (``genrec.eval.significance.paired_topk``); printed as a table and returned."""
    from genrec.eval.significance import paired_topk

    if len(test_ranks) < 2:
        return {}
    out = {}
    print("\n| test Recall@10, paired | difference | 95% interval | P(> 0) |\n|---|---|---|---|")
    for (x, y), d in paired_topk(test_ranks, "recall@10", n_boot=n_boot).items():
        if x.startswith("genrec") and not y.startswith("genrec"):
            print(f"| {x} − {y} | {d.cells()} |")
            out[f"{x} - {y}"] = vars(d)
    return out


if __name__ == "__main__":
    main()
