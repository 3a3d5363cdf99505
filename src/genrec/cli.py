"""The ``genrec`` command: a thin layer over public library functions (see genrec.recipes.pipeline).

Its imports sit inside the commands: ``genrec --help`` and a command start without loading the others' modules."""

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
fusion_app = typer.Typer(no_args_is_help=True, help="L1 score fusion: choose the weights on validation, show them.")
app.add_typer(sid_app, name="sid")
app.add_typer(fusion_app, name="fusion")

WORKDIR = typer.Argument(..., help="Run directory (created if missing).")
RUNDIR = typer.Argument(..., help="Run directory made by `genrec data prepare` (and, before training, `features "
                                   "build` and `sid build`).")


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


def _working(msg: str) -> Any:
    """A spinner on stderr while a step runs (rich shows it only on a terminal)."""
    from rich.console import Console

    return Console(stderr=True).status(msg)


def _echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@app.command()
def version() -> None:
    """Print the genrec version."""
    from genrec._version import __version__

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
    slate_size: int = typer.Option(8, help="Interactions per synthesised feedview (without --impressions)."),
    like_min: float = typer.Option(4.0, help="MovieLens: rating >= this is 'like'."),
    dislike_max: float = typer.Option(2.0, help="MovieLens: rating <= this is 'dislike' (else 'view')."),
    user_col: str = typer.Option("user_id", help="generic: user column."),
    item_col: str = typer.Option("item_id", help="generic: item column."),
    time_col: Optional[str] = typer.Option("timestamp", help="generic: timestamp column ('' = file order)."),
    action_col: Optional[str] = typer.Option("action", help="generic: action column ('' = none)."),
    surface_col: Optional[str] = typer.Option(None, help="generic: surface column (where the event happened: home, "
                                                         "search, ...; default: none, one surface 'default')."),
    time_format: str = typer.Option("auto", help="generic: how --time-col is written: auto (epoch seconds or "
                                                 "milliseconds by magnitude, else ISO 8601), iso (zone-less values "
                                                 "are UTC), epoch-s, epoch-ms, or a strptime pattern such as "
                                                 "'%d/%m/%Y %H:%M'. Parquet timestamp and date columns are read by "
                                                 "type. Stored as epoch seconds."),
    map_ids: Optional[bool] = typer.Option(None, "--map-ids/--no-map-ids", show_default=False,
                                           help="generic: number user and item ids 0..n-1 (recommend then takes "
                                                "and shows the source's ids). Default: when an id is not an "
                                                "integer; --map-ids: always; --no-map-ids: never (refuse them)."),
    items: Optional[Path] = typer.Option(None, help="generic: items file (CSV/Parquet: item_id, optional title and "
                                                    "text, other columns kept as attributes; without a text column "
                                                    "the title and attributes are the text content vectors read). "
                                                    "Default: items.csv|parquet beside the events."),
    delimiter: Optional[str] = typer.Option(None, help="generic: field delimiter of CSV files (default ',' and a "
                                                       "tab for .tsv files; '\\t' is a tab)."),
    impressions: Optional[Path] = typer.Option(None, help="generic: impressions file (CSV/Parquet, one row per shown "
                                                          "item: request_id, user_id, item_id, timestamp, position, "
                                                          "action (empty = shown, not engaged; 'a|b' for several), "
                                                          "optional surface; named like the events' columns). Its "
                                                          "requests replace the synthesised feedviews."),
    request_col: str = typer.Option("request_id", help="generic: request column of the --impressions file."),
    position_col: str = typer.Option("position", help="generic: slate position column of the --impressions file "
                                                      "(an integer; the slate is ordered by it)."),
) -> None:
    """Ingest DATASET into Iceberg tables (events, feedviews, items) under WORKDIR/tables."""
    from genrec.data.ingest.common import RatingRule
    from genrec.data.ingest.options import ColumnMapping, IngestOptions
    from genrec.recipes.pipeline import prepare

    cols = ColumnMapping(user=user_col, item=item_col, timestamp=time_col or None, action=action_col or None,
                         surface=surface_col or None, request=request_col, position=position_col)
    opts = IngestOptions(rating_rule=RatingRule(like_min=like_min, dislike_max=dislike_max), slate_size=slate_size,
                         download=download, columns=cols, map_ids=map_ids, time_format=time_format,
                         items_path=str(items) if items is not None else None,
                         impressions_path=str(impressions) if impressions is not None else None,
                         delimiter=(delimiter or ",").replace("\\t", "\t"))  # "," reads .tsv files with tabs
    with _working(f"ingesting {dataset} into {workdir}/tables ..."):
        m = prepare(workdir, dataset, source=source, data_dir=data_dir, n_buckets=buckets, options=opts)
    info = m.get("info", {})
    for note in (info.get("extra") or {}).get("notes") or []:
        typer.secho(f"note: {note}", fg=typer.colors.YELLOW, err=True)
    _echo_json({"tables": str(Path(workdir) / "tables"), "counts": m["counts"],
                "feedview_rule": info.get("feedview_rule"),
                **({"time_rule": info["time_rule"]} if info.get("time_rule") else {})})


@data_app.command("export-p5")
@_friendly
def data_export_p5(
    dataset: str = typer.Argument(..., help="A dataset name (see `genrec data list`), or a run directory made by "
                                            "`genrec data prepare` (generic data, non-default ingest options)."),
    outdir: Path = typer.Argument(..., help="Folder to write the P5-form files into (created if missing)."),
    source: Optional[Path] = typer.Option(None, help="Folder with the raw files (default: under --data-dir)."),
    data_dir: Optional[Path] = typer.Option(None, help="Root holding one folder per dataset "
                                                       "(default $GENREC_DATA_DIR, then ~/.cache/genrec/datasets)."),
    download: bool = typer.Option(False, help="Download missing MovieLens files from GroupLens."),
    min_events: int = typer.Option(3, help="Leave out users with fewer interactions (leave-one-out needs 3)."),
    overwrite: bool = typer.Option(False, help="Replace an export already in OUTDIR."),
) -> None:
    """Write DATASET in P5 form (sequential_data.txt + item text + README.txt) for the SASRec yardstick and
    `genrec data prepare amazon-p5 WORKDIR --source OUTDIR`: every event is an interaction, ordered as
    genrec's ingest orders it (timestamp, ties by source-file order); ids renumbered 1.. by source id."""
    from genrec.data.ingest.options import IngestOptions
    from genrec.data.p5 import export_p5

    cmd = f"genrec data export-p5 {dataset} {outdir}" + (f" --source {source}" if source else "") + (
        f" --data-dir {data_dir}" if data_dir else "") + (f" --min-events {min_events}" if min_events != 3 else "")
    with _working(f"exporting {dataset} to {outdir} in P5 form ..."):
        r = export_p5(dataset, outdir, source=source, data_dir=data_dir, options=IngestOptions(download=download),
                      min_events=min_events, overwrite=overwrite, made_by=cmd)
    _echo_json(r.to_dict())


# ----------------------------------------------------------------------------- features
@features_app.command("build")
@_friendly
def features_build(
    workdir: Path = RUNDIR,
    content: str = typer.Option("tfidf", help="tfidf | st:<sentence-transformers name or local path> | "
                                              "file:<parquet or npy of item vectors>"),
    content_dim: int = typer.Option(64, help="Most dimensions of the content vectors: tfidf keeps up to this many "
                                              "SVD components; st: / file: vectors wider than this are projected "
                                              "onto their top principal directions."),
    engagement_dim: int = typer.Option(64, help="Dimensions of the engagement vectors (an SVD of the train "
                                                 "split's item co-interaction PPMI matrix)."),
    seed: int = typer.Option(0, help="Seed of the randomized SVDs (same seed and data, same vectors)."),
    split: str = typer.Option("loo", help="The split whose TRAIN events the engagement vectors see: loo | temporal. "
                                          "Use the data.split you will train with (genrec train refuses a mismatch)."),
) -> None:
    """Content vectors from item text + engagement vectors from the train split's co-interactions."""
    from genrec.data.splits import SplitSpec
    from genrec.recipes.pipeline import build_item_features

    import warnings

    from genrec.features.text_quality import DegenerateTextWarning, features_warning

    spec = SplitSpec(kind=split)  # type: ignore[arg-type]  # refuses anything but loo / temporal, naming it
    with _working("building content + engagement item vectors ..."), warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateTextWarning)  # said below, in the command's words
        v = build_item_features(workdir, content=content, content_dim=content_dim, engagement_dim=engagement_dim,
                                seed=seed, split=spec)
    q = v.meta.get("text_quality") or {}
    _echo_json({"items": len(v), "content_dim": int(v.content.shape[1]),
                "engagement_dim": int(v.engagement.shape[1]), "folder": str(Path(workdir) / "features"),
                "text_quality": {k: q.get(k) for k in ("coverage", "distinct_ratio", "duplicate_share", "degenerate")}})
    msg = features_warning(q)
    if msg is not None:
        typer.secho(f"warning: {msg}", fg=typer.colors.YELLOW, err=True)


# ----------------------------------------------------------------------------- sid
@sid_app.command("build")
@_friendly
def sid_build(
    workdir: Path = RUNDIR,
    levels: int = typer.Option(3, help="Semantic levels (a disambiguation level is added)."),
    codebook_size: Optional[int] = typer.Option(None, help="Codes per level (default: suits the catalogue)."),
    method: str = typer.Option("rqkmeans", help="rqkmeans | rqvae"),
    seed: int = typer.Option(0, help="Random seed of the quantiser (same seed and vectors, same codes)."),
    source: Optional[str] = typer.Option(
        None, help="What is quantised: content (PinGER), content+engagement (collaborative SIDs: co-engaged items "
                   "share prefixes) or engagement (the engagement vectors alone). Default: content, or engagement "
                   "when `genrec features build` found the item text degenerate (its manifest's text_quality)."),
    engagement_weight: float = typer.Option(1.0, help="content+engagement: the engagement block's weight."),
) -> None:
    """Quantise item vectors into a new SID version (codes, trie, index, stats)."""
    from genrec.recipes.pipeline import build_semantic_ids

    with _working(f"quantising item vectors into {levels}-level Semantic IDs ..."):
        sb = build_semantic_ids(workdir, levels=levels, codebook_size=codebook_size, method=method, seed=seed,
                                source=source, engagement_weight=engagement_weight)  # says on stderr what it chose
    _echo_json({"version": sb.version, "codebook_sizes": sb.codebook_sizes, "items": len(sb.item_ids),
                "source": sb.stats.get("source", {}).get("used"),
                "stats": {k: sb.stats.get(k) for k in ("collision_rate", "max_collision_group", "unique_rate")}})


@sid_app.command("assign")
@_friendly
def sid_assign(
    workdir: Path = RUNDIR,
    vectors: Path = typer.Option(..., help="Parquet (item_id + vector) or .npy with item_ids.npy beside it: "
                                           "content vectors of NEW items, in the item features' content space."),
    publish: bool = typer.Option(False, "--publish", help="Make the new version CURRENT even when its last level "
                                                          "grew (the served models cannot read it until retrained)."),
) -> None:
    """Give new items codes with the frozen codebook and add them to the served catalogue: a new SID version
    (none when no item is new), CURRENT unless its last level grew (then `genrec sid use` after retraining)."""
    import numpy as np

    from genrec.errors import DataError
    from genrec.features import content as fc
    from genrec.features.store import ItemVectors
    from genrec.sid.build import assign_sids, new_item_vectors, open_current

    ids, vecs = fc.read_vector_file(vectors.expanduser())
    cur = open_current(Path(workdir) / "sid")
    vecs = np.asarray(vecs, dtype=np.float32)
    feat_dim = int(np.asarray(ItemVectors.load(Path(workdir) / "features").content).shape[1]) \
        if (Path(workdir) / "features" / "manifest.json").exists() else None
    try:
        x = new_item_vectors(cur.path, vecs, cur.quantizer.dim)
        sb = assign_sids(Path(workdir) / "sid", x, np.asarray(ids, dtype=np.int64),
                         content=vecs if vecs.ndim == 2 and vecs.shape[1] == feat_dim else None,
                         publish_if_grown=publish)
    except DataError as e:  # name the file the bad vectors came from
        raise (DataError(e.reason, path=vectors, line=e.line, field=e.field) if e.path is None else e) from None
    got = sb.stats.get("assigned", {})
    _echo_json({"version": sb.version, "items": len(sb.item_ids), "codebook_sizes": sb.codebook_sizes,
                "new_items": got.get("new"), "already_present": got.get("already_present"),
                "added_to_catalogue": got.get("added_to_catalogue", 0), "current": bool(got.get("published", True)),
                "unchanged": bool(got.get("unchanged"))})
    if got.get("new") and not got.get("added_to_catalogue"):
        why = (f"the vectors have dimension {vecs.shape[1] if vecs.ndim == 2 else '?'}, the item features' content "
               f"{feat_dim}" if feat_dim is not None else f"{Path(workdir) / 'features'} holds no item features")
        typer.secho(f"warning: {why}: the new items have codes but are not in the served catalogue (give their "
                    "content vectors in the features' space to serve them)", fg=typer.colors.YELLOW, err=True)
    if got.get("unchanged"):
        typer.secho(f"note: every one of the {got.get('requested')} items already had codes in {sb.version}: "
                    f"no new version written", fg=typer.colors.YELLOW, err=True)
    elif got.get("already_present"):
        typer.secho(f"note: {got['already_present']} of the {got.get('requested')} items already had codes in "
                    f"{cur.version}; they keep them (their vectors were not used)", fg=typer.colors.YELLOW, err=True)
    if list(sb.codebook_sizes) != list(cur.codebook_sizes):
        where = (f"it is CURRENT (--publish): run `genrec sid use {workdir} {cur.version}` to serve the models "
                 f"trained on {cur.version} again" if got.get("published") else
                 f"CURRENT stays {cur.version}; after retraining on {sb.version}, `genrec sid use {workdir} "
                 f"{sb.version}` publishes it")
        typer.secho(f"warning: the last SID level grew ({list(cur.codebook_sizes)} -> {list(sb.codebook_sizes)}): "
                    f"models trained on {cur.version} cannot serve {sb.version}; {where}",
                    fg=typer.colors.YELLOW, err=True)


@sid_app.command("use")
@_friendly
def sid_use(workdir: Path = RUNDIR, version: str = typer.Argument(..., help="A complete SID version, e.g. v0002.")
            ) -> None:
    """Point CURRENT at an existing SID version (a server picks it up on reload / SIGHUP)."""
    from genrec.sid.build import open_current, set_current

    before = open_current(Path(workdir) / "sid").version if (Path(workdir) / "sid" / "CURRENT").exists() else None
    sb = set_current(Path(workdir) / "sid", version)
    _echo_json({"current": sb.version, "previous": before, "items": len(sb.item_ids),
                "codebook_sizes": sb.codebook_sizes})


@sid_app.command("list")
@_friendly
def sid_list(workdir: Path = RUNDIR) -> None:
    """The SID versions of WORKDIR, oldest first, with CURRENT marked."""
    from genrec.sid.build import list_versions, open_current, open_version

    root = Path(workdir) / "sid"
    cur = open_current(root).version if (root / "CURRENT").exists() else None
    rows = []
    for v in list_versions(root):
        sb = open_version(root, v)
        a = sb.stats.get("assigned") or {}
        rows.append({"version": v, "current": v == cur, "items": len(sb.item_ids),
                     "codebook_sizes": sb.codebook_sizes, "parent": sb.stats.get("parent_version"),
                     "new_items": a.get("new")})
    _echo_json({"versions": rows})


@sid_app.command("lookup")
@_friendly
def sid_lookup(workdir: Path = RUNDIR, prefix: list[int] = typer.Argument(None, help="SID prefix codes"),
               limit: int = typer.Option(20, help="Print at most this many item ids (`n` counts them all).")
               ) -> None:
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
    workdir: Path = RUNDIR,
    preset: str = typer.Option("cpu-small", help="Run preset: quickstart, cpu-tiny, cpu-small, gpu-base."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value overrides, e.g. variant=tiger "
                                                              "train.lr=3e-4 model.d_model=128; "
                                                              "--show-config lists every key."),
    no_resume: bool = typer.Option(False, "--no-resume", help="Start from scratch: the previous run's checkpoints, "
                                                             "logs and reports move to WORKDIR/previous-runs/."),
    show_config: bool = typer.Option(False, "--show-config", help="Print every override key with its value under "
                                                                  "--preset and the given overrides, one key=value "
                                                                  "a line, and exit without training (model sizes "
                                                                  "0 and model.dropout -1 stand for the model "
                                                                  "preset's)."),
) -> None:
    """Train the joint model (SID + dense retrieval + action heads) on WORKDIR's prepared tables, features and
    SIDs; resumes from the last checkpoint. Ctrl-C or SIGTERM stops after the current step with a checkpoint.

    Override keys: `genrec train WORKDIR --preset P --show-config` lists them all with the preset's values;
    they are the fields of RunConfig (genrec/train/run.py: variant, model.*, data.*, objective.* from
    genrec/train/objective.py) and TrainConfig (genrec/train/config.py: train.*), documented there.
    Progress: a bar on a terminal, plain lines on stderr otherwise (train.progress, train.progress_every_s)."""
    from genrec.recipes.training import train_run
    from genrec.train.run import RunConfig

    cfg = RunConfig.from_name(preset, list(overrides or []))
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
    out = train_run(workdir, cfg, resume=not no_resume)
    _echo_json(out)
    if out.get("interrupted"):
        typer.secho(f"interrupted ({out['interrupted']}) at step {out['step']}, checkpoint written: run the same "
                    "command again to resume", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130 if out["interrupted"] == "SIGINT" else 143)


# ----------------------------------------------------------------------------- quickstart
@app.command()
@_friendly
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


# ----------------------------------------------------------------------------- serve / bench (genrec.serve)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: serving load (serve), kernel and decode speed (kernels), "
                                                  "the training step by layout (train).")
app.add_typer(bench_app, name="bench")


def _check_micro_batch(policy: str, wait_ms: float) -> None:
    if policy not in ("busy", "timed"):
        raise typer.BadParameter(f"--micro-batch-policy must be busy or timed, got {policy!r}")
    if wait_ms < 0:
        raise typer.BadParameter(f"--micro-batch-wait-ms must be >= 0, got {wait_ms}")


@app.command()
@_friendly
def serve(
    workdir: Path = RUNDIR,
    checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint folder or root (default WORKDIR/checkpoints)."),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback unless told otherwise)."),
    port: int = typer.Option(8000, help="TCP port to listen on."),
    workers: int = typer.Option(1, help="uvicorn worker processes (each loads its own bundle)."),
    two_process: bool = typer.Option(False, help="Ranking in a separate process over a shared KV pool."),
    threads: Optional[int] = typer.Option(
        None, help="Requests that run inference at once, per server process. Default from the machine: "
                   "min(4, cores) (one at a time stalled the 2-core CPU box under load; past 4 they queue on the "
                   "GIL)."),
    torch_threads: Optional[int] = typer.Option(
        None, help="torch's intra-op threads per server process. Default from the machine: on a CPU, cores // "
                   "(--threads x --workers), at least 1, so concurrent forwards use each core once (2-core box, "
                   "1-4 clients: 75-106 QPS, against 41-83 with torch's own thread per core); on CUDA, torch's "
                   "default."),
    max_body_bytes: int = typer.Option(1 << 20, help="Request body size limit (413 above)."),
    pool_slots: int = typer.Option(16, help="KV-pool slots (two-process mode)."),
    kv_pool_device: str = typer.Option(
        "auto", help="Two-process KV pool: auto (the server's device), cpu (shared memory) or cuda (CUDA IPC)."),
    device: str = typer.Option("cpu", help="Where the model runs: cpu, cuda or cuda:N."),
    micro_batch: int = typer.Option(1, help="Group up to N concurrent requests into one forward (1 = off)."),
    micro_batch_policy: str = typer.Option(
        "timed", help="With --micro-batch > 1: busy (requests queued while a batch runs form the next batch, no "
                     "timer) or timed (a group's first request waits --micro-batch-wait-ms for more)."),
    micro_batch_wait_ms: float = typer.Option(2.0, help="The timed policy's wait for followers (ms)."),
    precision: str = typer.Option("float32", help="float32 or bf16 (autocast on CUDA; CPU stays float32)."),
    cuda_graphs: Optional[str] = typer.Option(
        None, help="On CUDA: which stages replay CUDA graphs: all (default: encode, SID decode, ranking), sid, off."),
    admin_token: Optional[str] = typer.Option(
        None, envvar="GENREC_ADMIN_TOKEN", help="/admin/reload then needs 'Authorization: Bearer TOKEN' (set it "
                                                "whenever --host is not loopback)."),
    access_log: bool = typer.Option(False, help="uvicorn's access log: one line per request on stdout. Off by "
                                                "default (the start-up lines on stderr still come); /metrics "
                                                "counts requests either way."),
) -> None:
    """HTTP service: /v1/recommend, /v1/rank, /healthz, /readyz, /metrics, /admin/reload (or SIGHUP).
    With --workers > 1, SIGHUP the main process: it restarts every worker on the newest version.
    On stderr it says the URL it listens on, the checkpoint and index_version it loaded, the device, and
    when it is ready."""
    import os
    import signal

    if precision not in ("float32", "bf16"):
        raise typer.BadParameter(f"--precision must be float32 or bf16, got {precision!r}")
    if threads is not None and threads < 1:
        raise typer.BadParameter(f"--threads must be >= 1, got {threads}")
    if torch_threads is not None and torch_threads < 1:
        raise typer.BadParameter(f"--torch-threads must be >= 1, got {torch_threads}")
    if kv_pool_device not in ("auto", "cpu", "cuda"):
        raise typer.BadParameter(f"--kv-pool-device must be auto, cpu or cuda, got {kv_pool_device!r}")
    _check_micro_batch(micro_batch_policy, micro_batch_wait_ms)
    os.environ["GENREC_PRECISION"] = precision  # read by every process that loads a model
    if cuda_graphs is not None:
        if cuda_graphs not in ("off", "sid", "all"):
            raise typer.BadParameter(f"--cuda-graphs must be off, sid or all, got {cuda_graphs!r}")
        os.environ["GENREC_CUDA_GRAPHS"] = cuda_graphs  # likewise
    # SIGHUP is the reload trigger: never the default "end the process", not even while torch imports and the
    # bundle loads (the app's own handler takes over once it runs)
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN) if hasattr(signal, "SIGHUP") else None
    try:
        from genrec.infer.load import find_checkpoint

        find_checkpoint(workdir, checkpoint)  # before the server starts: a missing model is one line, not a traceback
    except BaseException:
        if hup is not None:
            signal.signal(signal.SIGHUP, hup)
        raise
    from genrec.serve.app import ServeConfig, default_threads, default_torch_threads
    from genrec.serve.app import serve as run_server

    threads = default_threads(device) if threads is None else threads
    if torch_threads is None:
        torch_threads = default_torch_threads(device, threads, workers)
    cfg = ServeConfig(workdir=workdir, checkpoint=checkpoint, device=device, two_process=two_process,
                      max_body_bytes=max_body_bytes, threads=threads, torch_threads=torch_threads,
                      pool_slots=pool_slots, micro_batch=micro_batch, micro_batch_policy=micro_batch_policy,
                      micro_batch_wait_ms=micro_batch_wait_ms, kv_pool_device=kv_pool_device,
                      admin_token=admin_token or None, announce=True)
    run_server(cfg, host=host, port=port, workers=workers, access_log=access_log)


@bench_app.command("kernels")
@_friendly
def bench_kernels(
    iters: int = typer.Option(20, help="Timed runs per measurement (median)."),
    warmup: int = typer.Option(5, help="Untimed runs first."),
    quick: bool = typer.Option(False, help="Skip the block-size / split sweeps and the 8x128 shape."),
    only: str = typer.Option("correctness,train,cascade,ceilings", help="Kernel sections to run."),
    decode: str = typer.Option("beam,sid,trie,rank", help="Decode sections to run after ('' = none)."),
    tiny: bool = typer.Option(False, help="Tiny shapes (with TRITON_INTERPRET=1 also on a CPU: a smoke run)."),
    sustain: float = typer.Option(0.0, help="Also run each training row back to back this many seconds, with the "
                                            "SM clock and power draw it ran at (nvidia-smi)."),
) -> None:
    """Every fast path checked against its reference, then timed beside its peers in one run:
    item-block attention vs FlexAttention / SDPA, cascade vs per-beam attention, the H200
    ceilings; then beam search shared vs copied, the CUDA-graph SID decode, GPU vs CPU trie,
    ranking decode vs full prefill. Tables printed; JSON to $OUT when set. GPU only."""
    import torch

    from genrec.bench import decode as bench_decode
    from genrec.bench import kernels as bench_k

    args = ["--iters", str(iters), "--warmup", str(warmup), "--only", only] + (["--quick"] if quick else []) \
        + (["--tiny"] if tiny else []) + (["--sustain", str(sustain)] if sustain > 0 else [])
    rc = bench_k.main(args)
    if rc == 0 and decode and (torch.cuda.is_available() or tiny):
        rc = bench_decode.main(["--iters", str(iters), "--warmup", str(warmup), "--only", decode]
                               + (["--tiny"] if tiny else []))
    if rc:
        raise typer.Exit(rc)


@bench_app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_friendly
def bench_train(
    ctx: typer.Context,
    workdir: Path = RUNDIR,
    preset: str = typer.Option("cpu-small", help="Run preset the variants start from (as `genrec train`)."),
    variants: str = typer.Option("pinger,tiger", help="Comma-separated variants, each timed in turn; NAME+noattn "
                                                      "is NAME's attention-free bound (attention returns V)."),
    steps: int = typer.Option(20, help="Timed optimiser steps per variant."),
    warmup: int = typer.Option(3, help="Untimed steps first (compiles included)."),
    rounds: int = typer.Option(1, help="Run the variant list this many times, in turn (an A/B in one process)."),
    synthetic: str = typer.Option("", help="BxN: B random full-length histories of N catalogue items per step "
                                           "(the equal-context shape; adds the FLOP-ceiling column)."),
    compile_mode: str = typer.Option("", help="torch.compile mode with train.compile=true (reduce-overhead: "
                                              "CUDA graphs)."),
) -> None:
    """The training step of PinGER's layout against the TIGER layout (or any variants) at equal context, side
    by side in one process: ms/step, items/s, the ratio, and what the attention mask allows by FLOPs. Extra
    arguments are config overrides, e.g. train.compile=true model.d_model=768. JSON to $OUT when set."""
    from genrec.bench import train as bt

    argv = [str(workdir), "--preset", preset, "--variants", variants, "--steps", str(steps), "--warmup", str(warmup),
            "--rounds", str(rounds)] + (["--synthetic", synthetic] if synthetic else []) \
        + (["--compile-mode", compile_mode] if compile_mode else []) + list(ctx.args)
    bt.main(argv)


@bench_app.command("serve")
@_friendly
def bench_serve(
    workdir: Path = RUNDIR,
    duration: float = typer.Option(60.0, help="Seconds of load."),
    concurrency: int = typer.Option(8, help="Closed-loop clients."),
    max_requests: int = typer.Option(1_000_000, help="Stop after this many requests."),
    url: Optional[str] = typer.Option(None, help="Target a running loopback server (default: start one)."),
    history_len: int = typer.Option(50, help="Items in each request's history (sampled from real users)."),
    beam_width: int = typer.Option(20, help="SID beam width asked for in each request."),
    k: int = typer.Option(10, help="Items asked for in each request."),
    rank: bool = typer.Option(True, help="Ask for the L1 ranking (--no-rank: retrieval only)."),
    two_process: bool = typer.Option(False, help="Start the server with ranking in a second process "
                                                  "(`genrec serve --two-process`); not with --url."),
    micro_batch: int = typer.Option(1, help="Server-side micro-batch size (1 = off)."),
    micro_batch_policy: str = typer.Option("timed", help="Server-side micro-batch policy: timed or busy."),
    micro_batch_wait_ms: float = typer.Option(2.0, help="The timed policy's wait (ms)."),
    client: str = typer.Option("raw", help="Load-generator client: raw (lean HTTP/1.1 on asyncio streams) or httpx."),
    threads: Optional[int] = typer.Option(None, help="The started server's --threads (default: `genrec serve`'s, "
                                                     "from the machine); not with --url."),
    torch_threads: Optional[int] = typer.Option(None, help="The started server's --torch-threads (default: `genrec "
                                                           "serve`'s, from the machine); not with --url."),
) -> None:
    """Load-test /v1/recommend on loopback: p50/p99 latency, QPS, errors."""
    from genrec.serve.loadgen import bench_serve as run_bench

    _check_micro_batch(micro_batch_policy, micro_batch_wait_ms)
    if url is not None and (threads is not None or torch_threads is not None):
        raise typer.BadParameter("--threads / --torch-threads set up the server bench serve starts: not with --url")
    res = run_bench(workdir, url=url, duration=duration, concurrency=concurrency, max_requests=max_requests,
                    history_len=history_len, beam_width=beam_width, k=k, rank=rank, two_process=two_process,
                    micro_batch=micro_batch, micro_batch_policy=micro_batch_policy,
                    micro_batch_wait_ms=micro_batch_wait_ms, client=client, threads=threads,
                    torch_threads=torch_threads)
    typer.echo(res.table())
    _echo_json(res.summary())


# ----------------------------------------------------------------------------- recommend / eval
def _floats(text: str, what: str) -> tuple[float, ...]:
    from genrec.errors import ConfigError

    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{what}: expected comma-separated numbers, got {text!r}") from None


@app.command()
@_friendly
def recommend(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    user: Optional[str] = typer.Option(None, help="Use this user's full event history from the tables (the "
                                                  "source file's id when the data was prepared with --map-ids)."),
    history: Optional[str] = typer.Option(None, help="Comma-separated item ids, oldest first (source-file ids "
                                                     "with --map-ids)."),
    k: int = typer.Option(10, help="How many items to return."),
    beam: int = typer.Option(20, help="SID beam width."),
    lam: float = typer.Option(0.0, "--lambda", help="PinGER prefix-depth diversity penalty."),
    no_rank: bool = typer.Option(False, help="Skip the L1 ranking (order by retrieval)."),
    sources: Optional[str] = typer.Option(None, help="sid,ann (default: every stage the model has)."),
    overretrieve: int = typer.Option(3, help="L0 over-retrieval factor r (each stage returns K*r)."),
    exclude_history: bool = typer.Option(False, help="Drop items already in the history."),
    checkpoint: Optional[str] = typer.Option(None, help="BEST, LATEST or a checkpoint folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    as_of: Optional[str] = typer.Option(None, help="With --user: valid | test -- the case genrec eval scores (the "
                                                   "events before that split's target), and where the target lands."),
) -> None:
    """Recommend items for a user (--user) or an ad-hoc history (--history): SID beams + ANN, ranked."""
    from genrec.errors import ConfigError
    from genrec.infer.cases import SourceIds, user_case
    from genrec.infer.recommender import Recommender

    if (user is None) == (history is None):
        raise ConfigError("give exactly one of --user ID or --history 'id,id,...'")
    if as_of is not None and user is None:
        raise ConfigError("--as-of goes with --user (an eval case is one user's events before a target)")
    target = None
    ids = SourceIds.of(workdir)  # --map-ids data: people type and read the source file's ids
    unknown: list[str] = []
    rec = Recommender.from_checkpoint(workdir, checkpoint)
    if user is not None:
        if ids is not None:
            uid = ids.user(user)
        else:
            try:
                uid = int(user)
            except ValueError:
                raise ConfigError(f"--user: expected an integer user id, got {user!r}") from None
        hist: list
        hist, target = user_case(workdir, uid, as_of, rec.split_kind)
    elif ids is not None:
        toks = [x.strip() for x in str(history).split(",") if x.strip()]
        unknown = [x for x in toks if x not in ids.items]
        hist = [ids.items[x] for x in toks if x in ids.items]
    else:
        try:
            hist = [int(x) for x in str(history).split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--history: expected comma-separated integer item ids, got {history!r}") from None
    srcs = None if sources is None else tuple(s.strip() for s in sources.split(",") if s.strip())
    from typing import cast

    from genrec.infer.results import RecommendationList

    recs = cast(RecommendationList, rec.recommend(
        hist, k=k, beam_width=beam, diversity_lambda=lam, sources=srcs, rank=False if no_rank else None,
        overretrieve=overretrieve, exclude_history=exclude_history))  # one history -> one list
    if ids is not None:  # back to the source file's ids, for the reader
        recs.dropped_items = [*unknown, *(ids.item_original.get(i, i) for i in recs.dropped_items)]  # type: ignore[list-item]
    where = None
    if target is not None:
        got = [r.item_id for r in recs]
        where = {"split": as_of, **target, "rank": got.index(target["item_id"]) + 1 if target["item_id"] in got
                 else None}
    if as_json:
        out = {"step": rec.step, **recs.to_dict(), **({"target": where} if where else {})}
        if ids is not None:
            for d in out["items"]:
                d["original_item_id"] = ids.item_original.get(d["item_id"])
        _echo_json(out)
        return
    from genrec.infer.show import print_recommendations

    who = f"user {user}" if user is not None else "the given history"
    if where is not None:
        who += f", as of the {as_of} case"
    print_recommendations(recs, who=who, step=rec.step,
                          label=None if ids is None else (lambda i: f"{ids.item_original.get(i, '?')} (#{i})"))
    if where is not None:
        name = ids.item_original.get(where["item_id"], where["item_id"]) if ids is not None else where["item_id"]
        typer.echo(f"held-out {as_of} target: item {name} ({where['action']}): "
                   + (f"rank {where['rank']} of {k}" if where["rank"] else f"not in the top {k}"))


@app.command("eval")
@_friendly
def eval_cmd(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    split: str = typer.Option("test", help="valid | test (test: touch once; choose models on valid)."),
    max_users: int = typer.Option(0, help="Evaluate a random subset of this many cases (0 = all)."),
    beam: int = typer.Option(20, help="SID beam width."),
    lam: float = typer.Option(0.0, "--lambda", help="Diversity penalty for the SID and L0+L1 paths."),
    overretrieve: int = typer.Option(3, help="L0 over-retrieval factor r."),
    action_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: a * utility(action heads) + ... (default: the stored choice, else 1)."),
    retrieval_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: ... + w * (user . candidate vector) + ... (default: stored, else 0)."),
    sid_weight: Optional[float] = typer.Option(
        None, help="L1 score fusion: ... + v * log P(candidate's SID) under the beams (default: stored, else 0)."),
    sweep_lambda: Optional[str] = typer.Option(None, help="e.g. 0,0.5,1,2: SID recall + distinct codes per λ."),
    sweep_beam: Optional[str] = typer.Option(None, help="e.g. 10,20,50: SID recall per beam width."),
    sweep_context: Optional[str] = typer.Option(None, help="e.g. 5,10,20,50: recall per context length."),
    no_ranking: bool = typer.Option(False, help="Skip the feedview ranking metrics."),
    slate_negatives: int = typer.Option(8, help="Sampled impression-only candidates added to each held-out "
                                                "ranking slate (as training's data.neg_cands)."),
    checkpoint: Optional[str] = typer.Option(None, help="BEST, LATEST or a checkpoint folder."),
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

    cfg = EvalConfig(split=split, max_users=max_users, beam_width=beam, diversity_lambda=lam,
                     overretrieve=overretrieve, checkpoint=checkpoint, ranking=not no_ranking,
                     slate_negatives=slate_negatives, dump_recs=None if dump_recs is None else str(dump_recs),
                     retrieval_weight=retrieval_weight, sid_weight=sid_weight, action_weight=action_weight,
                     sweep_lambda=_floats(sweep_lambda or "", "--sweep-lambda"),
                     sweep_beam=tuple(int(x) for x in _floats(sweep_beam or "", "--sweep-beam")),
                     sweep_context=tuple(int(x) for x in _floats(sweep_context or "", "--sweep-context")))
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
@_friendly
def fusion_tune(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    checkpoint: Optional[str] = typer.Option(None, help="BEST, LATEST or a checkpoint folder."),
    max_users: int = typer.Option(2000, help="Validation cases to choose on (0 = all)."),
    beam: int = typer.Option(20, help="SID beam width inside L0 (genrec eval's default; recorded with the weights)."),
    overretrieve: int = typer.Option(3, help="L0 over-retrieval factor r."),
    metric: str = typer.Option("recall@10", help="recall@K or ndcg@K, K in 5, 10, 20."),
    utility: Optional[str] = typer.Option(
        None, help="The action utility the heads' term ranks by, chosen under and then served, e.g. "
                   "'like=1,view=1,dislike=-1' (actions left out weigh 0). Default: every action 1 (the "
                   "leave-one-out target is any interaction), so a predicted dislike counts for, not against."),
) -> None:
    """Choose the L1 score-fusion weights (a * heads + w * dense logit + v * log P(SID)) on the
    validation split and store them for this checkpoint: recommend, eval and serve then use them."""
    from genrec.eval.evaluate import tune_fusion
    from genrec.infer.fusion import parse_utility

    util = None if utility is None else parse_utility(utility)
    with _working(f"choosing the L1 fusion weights on {max_users or 'all'} validation cases ..."):
        out = tune_fusion(workdir, checkpoint=checkpoint, max_users=max_users, beam_width=beam,
                          overretrieve=overretrieve, metric=metric, utility=util)
    top = sorted(out["grid"], key=lambda r: -r[metric])[:8]
    typer.echo(f"| a | w | v | {metric} (valid) |\n|---|---|---|---|")
    for r in top:
        typer.echo(f"| {r['a']:g} | {r['w']:g} | {r['v']:g} | {r[metric]:.4f} |")
    h = out["heads_only_valid"]
    c = out["chosen"]
    typer.echo(f"chosen: a={c['action_weight']:g} w={c['retrieval_weight']:g} v={c['sid_weight']:g}, {metric} "
               f"{out['valid'][metric]:.4f} on {out['chosen_on']['cases']} validation cases"
               + ("" if h is None else f" (heads alone: {h[metric]:.4f})"))
    typer.echo(f"utility: {', '.join(f'{k}={v:g}' for k, v in out['chosen_on']['utility'].items())} "
               "(served with these weights)")
    typer.echo(f"stored: {out['path']}")


@fusion_app.command("show")
@_friendly
def fusion_show(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    checkpoint: Optional[str] = typer.Option(None, help="BEST, LATEST or a checkpoint folder."),
) -> None:
    """The L1 fusion weights the Recommender uses for this checkpoint, and where they come from."""
    from dataclasses import asdict

    from genrec.infer.recommender import Recommender

    rec = Recommender.from_checkpoint(workdir, checkpoint)
    _echo_json({"checkpoint": str(rec.checkpoint), "step": rec.step, "weights": asdict(rec.fusion),
                "stored": None if rec.fusion_path is None else str(rec.fusion_path)})


@app.command("cold-start")
@_friendly
def cold_start(
    base: Path = typer.Argument(..., help="A run dir with prepared tables (the full data)."),
    out: Path = typer.Argument(..., help="Where to build the cold-start run."),
    frac: float = typer.Option(0.05, help="Share of the catalogue withheld from training."),
    seed: int = typer.Option(0, help="Random seed choosing the withheld items."),
    preset: str = typer.Option("quickstart", help="Run preset of the training (as `genrec train --preset`)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value training overrides"),
) -> None:
    """Cold-start items: withhold some from training, code them with the frozen SID codebook, score them.

    Reports Recall@K per path on the test cases whose target is a withheld item."""
    from genrec.recipes.coldstart import run_cold_start

    r = run_cold_start(base, out, frac=frac, seed=seed, preset=preset, overrides=list(overrides or []))
    _echo_json({k: v for k, v in r.items() if k != "cold_item_ids"})


if __name__ == "__main__":
    app(sys.argv[1:])
