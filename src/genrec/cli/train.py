"""``genrec train`` and ``genrec quickstart``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from genrec.cli._app import RUNDIR, app, echo_json, friendly


# ----------------------------------------------------------------------------- train
@app.command()
@friendly
def train(
    workdir: Path = RUNDIR,
    preset: str = typer.Option("cpu-small", help="Run preset: quickstart, cpu-tiny, cpu-small, gpu-base."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value overrides, e.g. variant=tiger "
                                                              "train.lr=3e-4 model.d_model=128; "
                                                              "--show-config lists every key."),
    no_resume: bool = typer.Option(False, "--no-resume", help="Start from scratch: the previous run's checkpoints, "
                                                             "logs and reports move to WORKDIR/previous-runs/."),
    stage: str = typer.Option("joint", help="joint (the joint objective) or dpo (preference tuning of the SID "
                                            "head from init_from=CHECKPOINT, which stays as DPO's frozen "
                                            "reference; pairs are liked vs disliked or skipped items of one "
                                            "slate)."),
    init_from: Optional[str] = typer.Option(None, "--init-from", help="Warm start (the daily cycle): a new run "
                                                                      "from this checkpoint's weights -- a run "
                                                                      "directory (its best, else last checkpoint), "
                                                                      "a checkpoint folder, or a name of one of "
                                                                      "WORKDIR's (best, last, a step). WORKDIR's "
                                                                      "current run moves to previous-runs/ first. "
                                                                      "A catalogue that grew since (new SID codes, "
                                                                      "new items) is carried over."),
    show_config: bool = typer.Option(False, "--show-config", help="Print every override key with its value under "
                                                                  "--preset and the given overrides, one key=value "
                                                                  "a line, and exit without training (model sizes "
                                                                  "0 and model.dropout -1 stand for the model "
                                                                  "preset's)."),
) -> None:
    """Train the joint model (SID + dense retrieval + action heads) on WORKDIR's prepared tables, features and
    SIDs; resumes from the last checkpoint (--init-from: a new run, warm-started). Ctrl-C or SIGTERM stops after the
    current step with a checkpoint.

    Override keys: `genrec train WORKDIR --preset P --show-config` lists them all with the preset's values;
    they are the fields of RunConfig (genrec/train/run.py: variant, model.*, data.*, objective.* from
    genrec/train/objective.py) and TrainConfig (genrec/train/config.py: train.*), documented there.
    Progress: a bar on a terminal, plain lines on stderr otherwise (train.progress, train.progress_every_s)."""
    from genrec.train.distributed import launched_rank
    from genrec.train.run import RunConfig

    cfg = RunConfig.from_name(preset, list(overrides or []), stage=stage)
    if show_config:
        from genrec.train.config import to_dict

        def lines(d: dict[str, Any], prefix: str = "") -> list[str]:
            out = []
            for k, v in d.items():
                if isinstance(v, dict):
                    out += lines(v, f"{prefix}{k}.")
                else:
                    out.append(f"{prefix}{k}={v if isinstance(v, str) else json.dumps(v)}")
            return out

        typer.echo("\n".join(lines(to_dict(cfg))))
        return
    from genrec.recipes.retrieval_first import train as train_command

    out = train_command(workdir, cfg, resume=not no_resume, init_from=init_from)
    if launched_rank() == 0:  # under torchrun every process returns the same summary: one prints it
        echo_json(out)
    if out.get("interrupted"):
        typer.secho(f"interrupted ({out['interrupted']}) at step {out['step']}, checkpoint written: run the same "
                    "command again to resume", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130 if out["interrupted"] == "SIGINT" else 143)


# ----------------------------------------------------------------------------- quickstart
@app.command()
@friendly
def quickstart(
    workdir: Path = RUNDIR,
    dataset: str = typer.Option("movielens-100k", help="The dataset to run on (see `genrec data list`)."),
    data_dir: Optional[Path] = typer.Option(None, help="Root holding one folder per dataset "
                                                       "(default $GENREC_DATA_DIR, then ~/.cache/genrec/datasets)."),
    download: bool = typer.Option(False, help="Download MovieLens from GroupLens if missing."),
    steps: int = typer.Option(0, help="Training steps (0 = the quickstart preset's)."),
) -> None:
    """Prepare -> features -> SIDs -> train -> evaluate -> recommend, on the default data."""
    from genrec.recipes.quickstart import run_quickstart

    run_quickstart(workdir, dataset=dataset, data_dir=data_dir, download=download, steps=steps)
