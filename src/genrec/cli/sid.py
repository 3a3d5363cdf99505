"""``genrec features`` (item vectors) and ``genrec sid`` (Semantic IDs: build, assign, use, list, lookup)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from genrec.cli._app import CHECKPOINT, RUNDIR, echo_json, features_app, friendly, sid_app, working


# ----------------------------------------------------------------------------- features
@features_app.command("build")
@friendly
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
    with working("building content + engagement item vectors ..."), warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateTextWarning)  # said below, in the command's words
        v = build_item_features(workdir, content=content, content_dim=content_dim, engagement_dim=engagement_dim,
                                seed=seed, split=spec)
    q = v.meta.get("text_quality") or {}
    echo_json({"items": len(v), "content_dim": int(v.content.shape[1]),
                "engagement_dim": int(v.engagement.shape[1]), "folder": str(Path(workdir) / "features"),
                "text_quality": {k: q.get(k) for k in ("coverage", "distinct_ratio", "duplicate_share", "degenerate")}})
    msg = features_warning(q)
    if msg is not None:
        typer.secho(f"warning: {msg}", fg=typer.colors.YELLOW, err=True)


# ----------------------------------------------------------------------------- sid
@sid_app.command("build")
@friendly
def sid_build(
    workdir: Path = RUNDIR,
    levels: Optional[int] = typer.Option(None, help="Semantic levels (a disambiguation level is added). Default: "
                                                    "the fewest that leave ~16 items per code at <= 1,024 codes "
                                                    "a level (1 up to 16,384 items; chosen on validation recall)."),
    codebook_size: Optional[int] = typer.Option(None, help="Codes per level (default: suits the catalogue)."),
    method: str = typer.Option("rqkmeans", help="rqkmeans | rqvae"),
    seed: int = typer.Option(0, help="Random seed of the quantiser (same seed and vectors, same codes)."),
    source: Optional[str] = typer.Option(
        None, help="What is quantised: content (PinGER), content+engagement (collaborative SIDs: co-engaged items "
                   "share prefixes), engagement (the engagement vectors alone) or model (the item vectors of the "
                   "model trained in --from-run RUN, those its ANN index holds). Default: content+engagement "
                   "(chosen on validation recall; new items are coded from their content block), or engagement "
                   "when `genrec features build` found the item text degenerate (its manifest's text_quality)."),
    engagement_weight: float = typer.Option(1.0, help="content+engagement: the engagement block's weight."),
    from_run: Optional[Path] = typer.Option(None, "--from-run", help="--source model: the run directory of a model "
                                                                     "trained on the same items, whose item vectors "
                                                                     "are quantised."),
    checkpoint: Optional[str] = CHECKPOINT,
    disambiguation: str = typer.Option("popularity", help="How items sharing a semantic code are numbered on the "
                                                          "last level: popularity (most train-split interactions "
                                                          "first, so code 0 means the prefix's most popular item "
                                                          "everywhere; chosen on validation recall) or item-id "
                                                          "(ascending)."),
) -> None:
    """Quantise item vectors into a new SID version (codes, trie, index, stats). --checkpoint (with --source
    model) picks the checkpoint of --from-run RUN."""
    from genrec.recipes.pipeline import build_semantic_ids

    with working(f"quantising item vectors into {levels or 'default'}-level Semantic IDs ..."):
        sb = build_semantic_ids(workdir, levels=levels, codebook_size=codebook_size, method=method, seed=seed,
                                source=source, engagement_weight=engagement_weight, from_run=from_run,
                                checkpoint=checkpoint, disambiguation=disambiguation)  # says on stderr what it chose
    echo_json({"version": sb.version, "codebook_sizes": sb.codebook_sizes, "items": len(sb.item_ids),
                "source": sb.stats.get("source", {}).get("used"),
                **({"checkpoint": sb.stats["source"].get("checkpoint")} if from_run is not None else {}),
                "stats": {k: sb.stats.get(k) for k in ("collision_rate", "max_collision_group", "unique_rate")}})


@sid_app.command("assign")
@friendly
def sid_assign(
    workdir: Path = RUNDIR,
    vectors: Optional[Path] = typer.Option(None, help="Parquet (item_id + vector) or .npy with item_ids.npy beside "
                                                      "it: content vectors of NEW items, in the item features' "
                                                      "content space. Default: the items of the tables that have "
                                                      "no SID yet (added by `genrec data append`), their content "
                                                      "vectors made by the item features' own encoder."),
    publish: bool = typer.Option(True, "--publish/--hold", help="Make the new version CURRENT also when its last "
                                                               "level grew (served models reach the new codes through "
                                                               "their prefixes); --hold keeps CURRENT then, for "
                                                               "`genrec sid use` after retraining."),
) -> None:
    """Give new items codes with the frozen codebook and add them to the served catalogue: a new SID version
    (none when no item is new), made CURRENT (a server picks it up on reload, no retraining)."""
    import numpy as np

    from genrec.errors import DataError
    from genrec.features import content as fc
    from genrec.features.store import ItemVectors
    from genrec.recipes.pipeline import assign_new_items, new_item_sid_vectors
    from genrec.sid.build import assign_sids, open_current

    if vectors is None:
        cur = open_current(Path(workdir) / "sid")
        with working("coding the tables' new items with the frozen codebooks ..."):
            sb = assign_new_items(workdir, publish_if_grown=publish)
        vecs = np.zeros((0, 0), np.float32)
        feat_dim = None
    else:
        ids, vecs = fc.read_vector_file(vectors.expanduser())
        cur = open_current(Path(workdir) / "sid")
        vecs = np.asarray(vecs, dtype=np.float32)
        feat_dim = int(np.asarray(ItemVectors.load(Path(workdir) / "features").content).shape[1]) \
            if (Path(workdir) / "features" / "manifest.json").exists() else None
        try:
            x = new_item_sid_vectors(cur.path, vecs, np.asarray(ids, dtype=np.int64), cur.quantizer.dim)
            sb = assign_sids(Path(workdir) / "sid", x, np.asarray(ids, dtype=np.int64),
                             content=vecs if vecs.ndim == 2 and vecs.shape[1] == feat_dim else None,
                             publish_if_grown=publish)
        except DataError as e:  # name the file the bad vectors came from
            raise (DataError(e.reason, path=vectors, line=e.line, field=e.field) if e.path is None else e) from None
    got = sb.stats.get("assigned", {})
    echo_json({"version": sb.version, "items": len(sb.item_ids), "codebook_sizes": sb.codebook_sizes,
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
                    f"no new version written" if vectors is not None else f"note: every item of the tables has "
                    f"codes in {sb.version} already: no new version written", fg=typer.colors.YELLOW, err=True)
    elif got.get("already_present"):
        typer.secho(f"note: {got['already_present']} of the {got.get('requested')} items already had codes in "
                    f"{cur.version}; they keep them (their vectors were not used)", fg=typer.colors.YELLOW, err=True)
    if list(sb.codebook_sizes) != list(cur.codebook_sizes):
        where = ("it is CURRENT: models trained before serve the new codes through their prefixes (sid_mode "
                 "auto/merged) until retrained" if got.get("published") else
                 f"CURRENT stays {cur.version} (--hold); `genrec sid use {workdir} {sb.version}` publishes it")
        typer.secho(f"note: the last SID level grew ({list(cur.codebook_sizes)} -> {list(sb.codebook_sizes)}); "
                    f"{where}", fg=typer.colors.YELLOW, err=True)


@sid_app.command("use")
@friendly
def sid_use(workdir: Path = RUNDIR, version: str = typer.Argument(..., help="A complete SID version, e.g. v0002.")
            ) -> None:
    """Point CURRENT at an existing SID version (a server picks it up on reload / SIGHUP)."""
    from genrec.sid.build import open_current, set_current

    before = open_current(Path(workdir) / "sid").version if (Path(workdir) / "sid" / "CURRENT").exists() else None
    sb = set_current(Path(workdir) / "sid", version)
    echo_json({"current": sb.version, "previous": before, "items": len(sb.item_ids),
                "codebook_sizes": sb.codebook_sizes})


@sid_app.command("list")
@friendly
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
    echo_json({"versions": rows})


@sid_app.command("lookup")
@friendly
def sid_lookup(workdir: Path = RUNDIR, prefix: list[int] = typer.Argument(None, help="SID prefix codes"),
               limit: int = typer.Option(20, help="Print at most this many item ids (`n` counts them all).")
               ) -> None:
    """Items whose SID starts with PREFIX (any depth), from the current index."""
    from genrec.sid.build import open_current

    sb = open_current(Path(workdir) / "sid")
    items = sb.index.lookup(list(prefix or []))
    echo_json({"version": sb.version, "prefix": list(prefix or []), "n": int(len(items)),
                "items": [int(i) for i in items[:limit]]})
