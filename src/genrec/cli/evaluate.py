"""``genrec eval``, ``genrec fusion`` (tune, show) and ``genrec cold-start``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from genrec.cli._app import CHECKPOINT, app, echo_json, floats, friendly, fusion_app, working
from genrec.cli.serve import SID_MODE_OVERRIDE_HELP


@app.command("eval")
@friendly
def eval_cmd(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    split: str = typer.Option("test", help="valid | test (test: touch once; choose models on valid)."),
    max_users: int = typer.Option(0, help="Evaluate a random subset of this many cases (0 = all)."),
    beam_width: int = typer.Option(20, help="SID beam width (HTTP: beam_width)."),
    diversity_lambda: float = typer.Option(0.0, help="PinGER prefix-depth diversity penalty for the SID and L0+L1 "
                                                     "paths (HTTP: diversity_lambda)."),
    overretrieve: int = typer.Option(3, help="L0 over-retrieval factor r."),
    action_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: a * utility(action heads) + ... (default: the stored choice, else 1)."),
    retrieval_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: ... + w * (user . candidate vector) + ... (default: stored, else 0)."),
    sid_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: ... + v * log P(candidate's SID) under the beams (default: stored, else 0)."),
    transition_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: ... + t * log P(candidate | the history's last item), from the pairs of the "
                   "events before the split's targets (default: stored, else 0)."),
    history_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: ... + h * [candidate in the history], either sign (default: stored, else 0)."),
    sweep_lambda: Optional[str] = typer.Option(None, help="e.g. 0,0.5,1,2: SID recall + distinct codes per λ."),
    sweep_beam: Optional[str] = typer.Option(None, help="e.g. 10,20,50: SID recall per beam width."),
    sweep_context: Optional[str] = typer.Option(None, help="e.g. 5,10,20,50: recall per context length."),
    ranking: bool = typer.Option(True, help="The feedview ranking metrics (--no-ranking: skip them)."),
    slate_negatives: int = typer.Option(8, help="Sampled impression-only candidates added to each held-out "
                                                "ranking slate (as training's data.neg_cands)."),
    checkpoint: Optional[str] = CHECKPOINT,
    sid_mode: Optional[str] = typer.Option(None, help=SID_MODE_OVERRIDE_HELP),
    dump_recs: Optional[Path] = typer.Option(
        None, help="Also write every evaluated user's ranked top-K (K = 20, the largest reported) per path as "
                   "JSON lines {\"user\": id, \"items\": [ids]} with the source data's ids, one file per path: "
                   "recs.jsonl -> recs.sid.jsonl, recs.ann.jsonl, recs.l0l1.jsonl, recs.popularity.jsonl "
                   "(the paths this model has). Each reproduces the report's Recall/NDCG@K under an outside "
                   "scorer, e.g. ../shared/yardstick/score.py (with --max-users, the users left out count as "
                   "misses there)."),
) -> None:
    """Leave-one-out (or temporal) full-catalogue evaluation of every path + popularity; writes reports/."""
    from genrec.eval.evaluate import EvalConfig, run_eval

    cfg = EvalConfig(split=split, max_users=max_users, beam_width=beam_width, diversity_lambda=diversity_lambda,
                     overretrieve=overretrieve, checkpoint=checkpoint, sid_mode=sid_mode, ranking=ranking,
                     slate_negatives=slate_negatives, dump_recs=None if dump_recs is None else str(dump_recs),
                     retrieval_weight=retrieval_weight, sid_weight=sid_weight, action_weight=action_weight,
                     transition_weight=transition_weight, history_weight=history_weight, sweep_lambda=floats(sweep_lambda or "", "--sweep-lambda"),
                     sweep_beam=tuple(int(x) for x in floats(sweep_beam or "", "--sweep-beam")),
                     sweep_context=tuple(int(x) for x in floats(sweep_context or "", "--sweep-context")))
    report, files = run_eval(workdir, cfg)
    from genrec.eval.report import markdown

    typer.echo(markdown(report))
    if report.get("previous_test_reports"):
        typer.secho(f"warning: this run dir already had test reports {report['previous_test_reports']}; "
                    "the test split is meant to be measured once", fg=typer.colors.YELLOW, err=True)
    for name, path in files.items():
        typer.echo(f"{name}: {path}")
    for name, path in (report.get("dumped_recs") or {}).items():
        typer.echo(f"recs {name}: {path}")


@fusion_app.command("tune")
@friendly
def fusion_tune(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    checkpoint: Optional[str] = CHECKPOINT,
    max_users: int = typer.Option(0, help="Validation cases to choose on (0 = all, as `genrec eval`)."),
    beam_width: int = typer.Option(20, help="SID beam width inside L0 (genrec eval's default; recorded with the "
                                            "weights)."),
    overretrieve: int = typer.Option(3, help="L0 over-retrieval factor r."),
    metric: str = typer.Option("recall@10", help="recall@K or ndcg@K, K in 5, 10, 20."),
    utility: Optional[str] = typer.Option(
        None, help="The action utility the heads' term ranks by, chosen under and then served, e.g. "
                   "'like=1,view=1,dislike=-1' (actions left out weigh 0). Default: every action 1 (the "
                   "leave-one-out target is any interaction), so a predicted dislike counts for, not against."),
) -> None:
    """Choose the L1 score-fusion weights (a * heads + w * dense logit + v * log P(SID)) on the
    validation split and store them for this checkpoint: recommend, eval and serve then use them."""
    from genrec.eval.fusion_tune import tune_fusion
    from genrec.infer.fusion import parse_utility

    util = None if utility is None else parse_utility(utility)
    with working(f"choosing the L1 fusion weights on {max_users or 'all'} validation cases ..."):
        out = tune_fusion(workdir, checkpoint=checkpoint, max_users=max_users, beam_width=beam_width,
                          overretrieve=overretrieve, metric=metric, utility=util)
    top = sorted(out["grid"], key=lambda r: -r[metric])[:8]
    typer.echo(f"| a | w | v | t | h | {metric} (valid) |\n|---|---|---|---|---|---|")
    for r in top:
        typer.echo(f"| {r['a']:g} | {r['w']:g} | {r['v']:g} | {r['t']:g} | {r['h']:g} | {r[metric]:.4f} |")
    no_t = max((r for r in out["grid"] if r["t"] == 0 and r["h"] == 0), key=lambda r: r[metric], default=None)
    if no_t is not None:
        typer.echo(f"best without the transition and history terms: a={no_t['a']:g} w={no_t['w']:g} v={no_t['v']:g}, {metric} "
                   f"{no_t[metric]:.4f}")
    h = out["heads_only_valid"]
    c = out["chosen"]
    typer.echo(f"chosen: a={c['action_weight']:g} w={c['retrieval_weight']:g} v={c['sid_weight']:g} "
               f"t={c['transition_weight']:g} h={c['history_weight']:g}, {metric} {out['valid'][metric]:.4f} on {out['chosen_on']['cases']} "
               "validation cases"
               + ("" if h is None else f" (heads alone: {h[metric]:.4f})"))
    typer.echo(f"utility: {', '.join(f'{k}={v:g}' for k, v in out['chosen_on']['utility'].items())} "
               "(served with these weights)")
    typer.echo(f"stored: {out['path']}")


@fusion_app.command("show")
@friendly
def fusion_show(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    checkpoint: Optional[str] = CHECKPOINT,
) -> None:
    """The L1 fusion weights the Recommender uses for this checkpoint, and where they come from."""
    from dataclasses import asdict

    from genrec.infer.recommender import Recommender

    rec = Recommender.from_checkpoint(workdir, checkpoint)
    echo_json({"checkpoint": str(rec.checkpoint), "step": rec.step, "weights": asdict(rec.fusion),
                "stored": None if rec.fusion_path is None else str(rec.fusion_path)})


@app.command("cold-start")
@friendly
def cold_start(
    base: Path = typer.Argument(..., help="A run dir with prepared tables (the full data)."),
    out: Path = typer.Argument(..., help="Where to build the cold-start run."),
    frac: float = typer.Option(0.05, help="Share of the catalogue withheld from training."),
    seed: int = typer.Option(0, help="Random seed choosing the withheld items."),
    preset: str = typer.Option("quickstart", help="Run preset of the training (as `genrec train --preset`)."),
    assign: str = typer.Option("after", help="When the withheld items get codes: after (training on the warm "
                                             "catalogue; then `sid assign`, served without retraining) or before "
                                             "(in the training catalogue)."),
    beam_width: int = typer.Option(20, help="SID beams (full-code, and over levels 1..L-1 for the prefix paths)."),
    source: Optional[str] = typer.Option(None, help="What the SIDs quantise: content, or content+engagement (the "
                                                    "withheld items' engagement block imputed from their nearest "
                                                    "warm items by content, as `genrec sid assign` does). Default: "
                                                    "`genrec sid build`'s default (content+engagement)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value training overrides"),
) -> None:
    """Cold-start items: withhold some from training, code them with the frozen SID codebook, score them.

    Reports Recall@K per path (ann; sid full-code; sid_prefix and sid_merged, the served coarse-prefix
    retrieval) on the test cases whose target is a withheld item, and on those whose target is warm."""
    from genrec.recipes.coldstart import run_cold_start

    r = run_cold_start(base, out, frac=frac, seed=seed, preset=preset, overrides=list(overrides or []),
                       assign=assign, beam_width=beam_width, source=source)
    echo_json({k: v for k, v in r.items() if k != "cold_item_ids"})
