"""The ``genrec`` command: a thin layer over public library functions (see genrec.pipeline)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="genrec: one transformer for SID beams, ANN retrieval and ranking.")
data_app = typer.Typer(no_args_is_help=True, help="Ingest raw logs into canonical tables.")
features_app = typer.Typer(no_args_is_help=True, help="Item vectors: content and engagement.")
sid_app = typer.Typer(no_args_is_help=True, help="Semantic IDs: codes, prefix trie, SID->item index.")
app.add_typer(data_app, name="data")
app.add_typer(features_app, name="features")
app.add_typer(sid_app, name="sid")

WORKDIR = typer.Argument(..., help="Run directory (created if missing).")


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print genrec's own errors as one clear line (exit 2) instead of a traceback."""

    @wraps(fn)
    def inner(*a: Any, **k: Any) -> Any:
        from genrec.errors import GenrecError

        try:
            return fn(*a, **k)
        except (GenrecError, FileNotFoundError, KeyError) as e:
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return inner


def _echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@app.command()
def version() -> None:
    """Print the genrec version."""
    from genrec import __version__

    typer.echo(__version__)


# ----------------------------------------------------------------------------- data
@data_app.command("list")
def data_list() -> None:
    """List the datasets genrec can ingest."""
    from genrec.data.ingest import list_datasets

    for d in list_datasets():
        typer.echo(f"{d.name:24s} {d.description}")


@data_app.command("prepare")
@_friendly
def data_prepare(
    dataset: str = typer.Argument(..., help="movielens-100k, movielens-latest-small, amazon-beauty-2014, taobao, "
                                            "generic, ... (see `genrec data list`)"),
    workdir: Path = WORKDIR,
    source: Optional[Path] = typer.Option(None, help="Folder (or file, for generic) with the raw files."),
    data_dir: Optional[Path] = typer.Option(None, help="Root holding one folder per dataset "
                                                       "(default $GENREC_DATA_DIR, then ~/.cache/genrec/datasets)."),
    download: bool = typer.Option(False, help="Download missing MovieLens files from GroupLens."),
    buckets: int = typer.Option(16, help="Hash buckets of user_id for the events/feedviews tables."),
    slate_size: int = typer.Option(8, help="Interactions per synthesised feedview (no dataset has impressions)."),
    like_min: float = typer.Option(4.0, help="MovieLens: rating >= this is 'like'."),
    dislike_max: float = typer.Option(2.0, help="MovieLens: rating <= this is 'dislike' (else 'view')."),
    user_col: str = typer.Option("user_id", help="generic: user column."),
    item_col: str = typer.Option("item_id", help="generic: item column."),
    time_col: Optional[str] = typer.Option("timestamp", help="generic: timestamp column ('' = file order)."),
    action_col: Optional[str] = typer.Option("action", help="generic: action column ('' = none)."),
    map_ids: bool = typer.Option(False, help="generic: map string ids to integers."),
) -> None:
    """Ingest DATASET into Iceberg tables (events, feedviews, items) under WORKDIR/tables."""
    from genrec.data.ingest.common import RatingRule
    from genrec.data.ingest.options import ColumnMapping, IngestOptions
    from genrec.pipeline import prepare

    cols = ColumnMapping(user=user_col, item=item_col, timestamp=time_col or None, action=action_col or None)
    opts = IngestOptions(rating_rule=RatingRule(like_min=like_min, dislike_max=dislike_max), slate_size=slate_size,
                         download=download, columns=cols, map_ids=map_ids)
    m = prepare(workdir, dataset, source=source, data_dir=data_dir, n_buckets=buckets, options=opts)
    _echo_json({"tables": str(Path(workdir) / "tables"), "counts": m["counts"],
                "feedview_rule": m.get("info", {}).get("feedview_rule")})


# ----------------------------------------------------------------------------- features
@features_app.command("build")
@_friendly
def features_build(
    workdir: Path = WORKDIR,
    content: str = typer.Option("tfidf", help="tfidf | st:<sentence-transformers name or local path> | "
                                              "file:<parquet or npy of item vectors>"),
    content_dim: int = typer.Option(64),
    engagement_dim: int = typer.Option(64),
    seed: int = typer.Option(0),
) -> None:
    """Content vectors from item text + engagement vectors from the train split's co-interactions."""
    from genrec.pipeline import build_item_features

    v = build_item_features(workdir, content=content, content_dim=content_dim, engagement_dim=engagement_dim,
                            seed=seed)
    _echo_json({"items": len(v), "content_dim": int(v.content.shape[1]),
                "engagement_dim": int(v.engagement.shape[1]), "folder": str(Path(workdir) / "features")})


# ----------------------------------------------------------------------------- sid
@sid_app.command("build")
@_friendly
def sid_build(
    workdir: Path = WORKDIR,
    levels: int = typer.Option(3, help="Semantic levels (a disambiguation level is added)."),
    codebook_size: Optional[int] = typer.Option(None, help="Codes per level (default: suits the catalogue)."),
    method: str = typer.Option("rqkmeans", help="rqkmeans | rqvae"),
    seed: int = typer.Option(0),
) -> None:
    """Quantise content vectors into a new SID version (codes, trie, index, stats)."""
    from genrec.pipeline import build_semantic_ids

    sb = build_semantic_ids(workdir, levels=levels, codebook_size=codebook_size, method=method, seed=seed)
    _echo_json({"version": sb.version, "codebook_sizes": sb.codebook_sizes, "items": len(sb.item_ids),
                "stats": {k: sb.stats.get(k) for k in ("collision_rate", "max_group", "unique_rate")}})


@sid_app.command("assign")
@_friendly
def sid_assign(
    workdir: Path = WORKDIR,
    vectors: Path = typer.Option(..., help="Parquet (item_id + vector) or .npy with item_ids.npy beside it: "
                                           "content vectors of NEW items."),
) -> None:
    """Give new items codes with the frozen codebook; writes a new SID version."""
    import numpy as np

    from genrec.features import content as fc
    from genrec.sid.build import assign_sids

    reader = fc._read_npy_vectors if vectors.suffix == ".npy" else fc._read_parquet_vectors
    ids, vecs = reader(vectors)
    sb = assign_sids(Path(workdir) / "sid", np.asarray(vecs, dtype=np.float32), np.asarray(ids, dtype=np.int64))
    _echo_json({"version": sb.version, "items": len(sb.item_ids), "codebook_sizes": sb.codebook_sizes})


@sid_app.command("lookup")
@_friendly
def sid_lookup(workdir: Path = WORKDIR, prefix: list[int] = typer.Argument(None, help="SID prefix codes"),
               limit: int = typer.Option(20)) -> None:
    """Items whose SID starts with PREFIX (any depth), from the current index."""
    from genrec.sid.build import open_current

    sb = open_current(Path(workdir) / "sid")
    items = sb.index.lookup(list(prefix or []))
    _echo_json({"version": sb.version, "prefix": list(prefix or []), "n": int(len(items)),
                "items": [int(i) for i in items[:limit]]})


# ----------------------------------------------------------------------------- train
@app.command()
@_friendly
def train(
    workdir: Path = WORKDIR,
    preset: str = typer.Option("cpu-small", help="Run preset: quickstart, cpu-tiny, cpu-small, gpu-base."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value overrides, e.g. variant=tiger "
                                                              "train.lr=3e-4 model.d_model=128"),
    no_resume: bool = typer.Option(False, help="Start from scratch even if checkpoints exist."),
) -> None:
    """Train the joint model (SID + dense retrieval + action heads) on WORKDIR's tables."""
    from genrec.train.run import RunConfig, train_run

    cfg = RunConfig.from_name(preset, list(overrides or []))
    _echo_json(train_run(workdir, cfg, resume=not no_resume))


# ----------------------------------------------------------------------------- quickstart
@app.command()
@_friendly
def quickstart(
    workdir: Path = WORKDIR,
    dataset: str = typer.Option("movielens-100k"),
    data_dir: Optional[Path] = typer.Option(None),
    download: bool = typer.Option(False, help="Download MovieLens from GroupLens if missing."),
    steps: int = typer.Option(0, help="Training steps (0 = the quickstart preset's)."),
) -> None:
    """Prepare -> features -> SIDs -> train -> evaluate -> recommend, on the default data."""
    from genrec.quickstart import run_quickstart

    run_quickstart(workdir, dataset=dataset, data_dir=data_dir, download=download, steps=steps)


if __name__ == "__main__":
    app(sys.argv[1:])
