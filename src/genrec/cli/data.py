"""``genrec data``: ingest raw logs into canonical tables (list, prepare, append, versions, synth, export-p5)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from genrec.cli._app import RUNDIR, WORKDIR, data_app, echo_json, friendly, working


# ----------------------------------------------------------------------------- data
@data_app.command("list")
def data_list() -> None:
    """List the datasets genrec can ingest."""
    from genrec.data.ingest import list_datasets

    for d in list_datasets():
        typer.echo(f"{d.name:24s} {d.description}")


@data_app.command("prepare")
@friendly
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
    with working(f"ingesting {dataset} into {workdir}/tables ..."):
        m = prepare(workdir, dataset, source=source, data_dir=data_dir, n_buckets=buckets, options=opts)
    info = m.get("info", {})
    for note in (info.get("extra") or {}).get("notes") or []:
        typer.secho(f"note: {note}", fg=typer.colors.YELLOW, err=True)
    echo_json({"tables": str(Path(workdir) / "tables"), "counts": m["counts"],
                "feedview_rule": info.get("feedview_rule"),
                **({"time_rule": info["time_rule"]} if info.get("time_rule") else {})})


@data_app.command("append")
@friendly
def data_append(
    workdir: Path = RUNDIR,
    source: Path = typer.Option(..., help="Folder (or file, for generic) with the new logs, in the form the tables "
                                          "were prepared from (MovieLens: u.data + u.item, ...)."),
    skip_duplicates: bool = typer.Option(False, "--skip-duplicates", help="Append the events that are not in the "
                                                                          "tables yet and skip the others (default: "
                                                                          "refuse a log holding any)."),
    user_col: Optional[str] = typer.Option(None, help="generic: user column (default: the tables')."),
    item_col: Optional[str] = typer.Option(None, help="generic: item column (default: the tables')."),
    time_col: Optional[str] = typer.Option(None, help="generic: timestamp column (default: the tables')."),
    action_col: Optional[str] = typer.Option(None, help="generic: action column (default: the tables')."),
    surface_col: Optional[str] = typer.Option(None, help="generic: surface column (default: the tables')."),
    time_format: Optional[str] = typer.Option(None, help="generic: how --time-col is written (as for prepare; "
                                                         "default auto)."),
    items: Optional[Path] = typer.Option(None, help="generic: items file with the new items (default: "
                                                    "items.csv|parquet beside the events)."),
    delimiter: Optional[str] = typer.Option(None, help="generic: field delimiter of CSV files."),
    impressions: Optional[Path] = typer.Option(None, help="generic: impressions file of the new logs (tables "
                                                          "prepared with --impressions need one)."),
) -> None:
    """Add a later day's logs to WORKDIR's tables as a new data version (one Iceberg snapshot per table; the
    manifest names it last, so a failed append leaves the tables as they were). Read by the tables' ingestor
    under their rules (rating rule, slate size, vocabularies, column names). A user's new events follow their
    stored ones; an event already stored is refused (or skipped); new items are added, known ones keep their
    stored rows. Earlier versions stay readable: `genrec data versions WORKDIR`."""
    from genrec.recipes.pipeline import append

    cols = {k: v for k, v in {"user": user_col, "item": item_col, "timestamp": time_col, "action": action_col,
                              "surface": surface_col}.items() if v is not None}
    with working(f"appending {source} to {workdir}/tables ..."):
        out = append(workdir, source, skip_duplicates=skip_duplicates, columns=cols, time_format=time_format,
                     items_path=str(items) if items is not None else None,
                     impressions_path=str(impressions) if impressions is not None else None,
                     delimiter=delimiter.replace("\\t", "\t") if delimiter is not None else None)
    for note in out["notes"]:
        typer.secho(f"note: {note}", fg=typer.colors.YELLOW, err=True)
    echo_json({k: out[k] for k in ("tables_version", "data_version", "added", "counts")})


@data_app.command("versions")
@friendly
def data_versions(workdir: Path = RUNDIR) -> None:
    """WORKDIR's data versions, oldest first (1 = as prepared, then one per append): each one's tables_version,
    Iceberg snapshot ids and counts. Every one stays readable (`genrec.open_store(WORKDIR).at(N)`)."""
    from genrec.catalog import open_store

    store = open_store(workdir)
    echo_json({"current": store.tables_version, "versions": [
        {k: h.get(k) for k in ("data_version", "tables_version", "kind", "created", "counts", "added", "snapshots")
         if h.get(k) is not None} for h in store.history()]})


@data_app.command("synth")
@friendly
def data_synth(
    workdir: Path = WORKDIR,
    users: int = typer.Option(..., help="Users to generate (ids 1..U)."),
    items: int = typer.Option(..., help="Items in the catalogue (ids 1..I)."),
    events: int = typer.Option(..., help="Events in all, exactly (at least 5 per user)."),
    seed: int = typer.Option(0, help="Random seed: the same seed and options give the same tables."),
    buckets: int = typer.Option(16, help="Hash buckets of user_id for the events/feedviews tables."),
    zipf: float = typer.Option(1.0, help="Exponent of the items' Zipf popularity."),
    topics: Optional[int] = typer.Option(None, help="Latent item topics (default round(sqrt(items)/2), at least 2)."),
    slate_size: int = typer.Option(8, help="Interactions per synthesised feedview."),
    chunk_users: Optional[int] = typer.Option(None, help="Users generated and written at a time: bounds memory "
                                                         "(default about 2M events' worth); does not change the tables."),
) -> None:
    """Generate a synthetic log (Zipf items, topic sessions, several actions and surfaces, item text) into
    Iceberg tables under WORKDIR/tables, streaming: memory is bounded by the chunk, not by --events."""
    from genrec.recipes.pipeline import synthesize

    with working(f"generating {events} events into {workdir}/tables ..."):
        s = synthesize(workdir, users=users, items=items, events=events, seed=seed, n_buckets=buckets,
                       chunk_users=chunk_users, zipf=zipf, topics=topics, slate_size=slate_size)
    echo_json({"tables": s["tables"], "counts": s["counts"], "feedview_rule": s["feedview_rule"],
               "seconds": s["seconds"]})


@data_app.command("export-p5")
@friendly
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
    with working(f"exporting {dataset} to {outdir} in P5 form ..."):
        r = export_p5(dataset, outdir, source=source, data_dir=data_dir, options=IngestOptions(download=download),
                      min_events=min_events, overwrite=overwrite, made_by=cmd)
    echo_json(r.to_dict())
