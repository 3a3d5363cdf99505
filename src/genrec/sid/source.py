"""What a SID build quantises: the content vectors (PinGER: a new item gets its SID from content alone), content
beside engagement (collaborative SIDs), the engagement vectors when ``genrec features build`` found the item
text degenerate (:func:`choose_sid_source`), or a trained model's own item vectors (``"model"``: computed by
:mod:`genrec.recipes.model_sids`, which this layer does not import); and what ``sid assign`` quantises for new
items under a version's recipe (:func:`new_item_vectors`: for a collaborative version, a new item's engagement block
is imputed from its nearest trained items by content, :func:`impute_engagement`). Each version's stats.json says
which, and why (:func:`source_stats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from genrec.errors import ConfigError, DataError, MissingDataError
from genrec.features.store import ItemVectors
from genrec.features.text_quality import describe, is_degenerate
from genrec.sid.rqkmeans import check_vectors
from genrec.workdir import MANIFEST, read_json

__all__ = ["IMPUTE_NEIGHBOURS", "MODEL_SOURCE", "RECIPE_KEYS", "SID_SOURCES", "SourceChoice", "choose_sid_source",
           "features_text_quality", "impute_engagement", "impute_from_neighbours", "new_item_engagement",
           "new_item_vectors", "sid_input_vectors", "source_stats", "trained_item_vectors"]

SID_SOURCES = ("content", "content+engagement", "engagement", "model")
_SOURCE_VECTORS = {"content": "the content vectors", "content+engagement": "content beside engagement vectors",
                   "engagement": "the engagement vectors",
                   "model": "a trained model's item vectors (those its ANN index holds)"}
MODEL_SOURCE = "model"
"""The source whose vectors come from a trained run (``--from-run``), not from the item features."""


def sid_input_vectors(content: Any, engagement: Any | None, source: str = "content",
                      engagement_weight: float = 1.0) -> np.ndarray:
    """The vectors a SID build quantises: f32 ``[n, d]``.

    ``"content"``: the content vectors as they are (PinGER: a new item gets its SID from content
    alone). ``"content+engagement"`` (collaborative SIDs): the L2-normalised content vector
    beside ``engagement_weight`` times the L2-normalised engagement vector, so items that are
    engaged with together tend to share SID prefixes. An all-zero engagement row (an item nobody
    engaged with at build time) leaves that block zero; ``sid assign`` codes a new item against such a
    codebook with an engagement block imputed from its content neighbours (:func:`new_item_vectors`). ``"engagement"``: the engagement vectors as they are -- the default of ``genrec
    sid build`` when the item text is degenerate (:func:`choose_sid_source`); items nobody engaged
    with share the all-zero vector and are told apart only by the disambiguation level.
    """
    if source not in SID_SOURCES:
        raise ConfigError(f"SID source must be one of {', '.join(SID_SOURCES)}, got {source!r}")
    if source == MODEL_SOURCE:
        raise ConfigError("SID source 'model': the vectors are a trained run's item vectors, computed from that run "
                          "(genrec.recipes.model_sids.model_item_vectors), not from the item features")
    if source == "engagement":
        if engagement is None:
            raise ConfigError("SID source 'engagement' needs the engagement vectors")
        return check_vectors(engagement, name="engagement vectors")
    c = check_vectors(content, name="content vectors")
    if source == "content":
        return c
    if not math.isfinite(engagement_weight) or engagement_weight <= 0:
        raise ConfigError(f"engagement_weight must be a finite number > 0, got {engagement_weight}")

    if engagement is None:
        raise ConfigError("SID source 'content+engagement' needs the engagement vectors")
    e = check_vectors(engagement, name="engagement vectors")
    if e.shape[0] != c.shape[0]:
        raise DataError(f"engagement vectors have {e.shape[0]} rows, content vectors {c.shape[0]}",
                        field="engagement")
    return np.concatenate([_unit(c), float(engagement_weight) * _unit(e)], axis=1)


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows L2-normalised, f32; an all-zero row stays zero."""
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(n > 0, x / np.maximum(n, 1e-12), 0.0).astype(np.float32)


IMPUTE_NEIGHBOURS = 10
"""k of :func:`impute_engagement`: how many trained items, nearest by content, a new item's engagement is imputed
from."""


def impute_engagement(content: Any, known_content: Any, known_engagement: Any,
                      k: int = IMPUTE_NEIGHBOURS) -> np.ndarray:
    """Engagement vectors for items nobody engaged with yet, f32 ``[m, de]``, from their ``content`` ``[m, dc]``.

    Row i is the similarity-weighted mean of the L2-normalised engagement vectors (the block a collaborative
    codebook quantises) of the ``k`` items of ``known_content`` ``[n, dc]`` nearest to ``content[i]`` by cosine
    (:func:`impute_from_neighbours`). A row with no neighbour of positive cosine (an all-zero content vector, or no
    known items) stays zero: there is nothing to impute from. Known items nobody engaged with (zero engagement)
    count with their zero vector."""
    ke = check_vectors(known_engagement, name="trained items' engagement vectors")
    return impute_from_neighbours(content, known_content, _unit(ke), k, what="engagement")


def new_item_engagement(content: Any, known_content: Any, known_engagement: Any,
                        k: int = IMPUTE_NEIGHBOURS) -> np.ndarray:
    """The engagement block of items nobody engaged with yet, f32 ``[m, de]``: :func:`impute_engagement`,
    L2-normalised -- the block their collaborative SIDs quantise (:func:`new_item_vectors`) and, times
    ``genrec.catalog.COLD_ENGAGEMENT_SCALE``, the block their features get in the served catalogue
    (:func:`genrec.catalog.load_catalog`), the item tower's input. Unit length,
    as every engaged item's engagement vector is (:mod:`genrec.features.engagement`): the weighted mean alone is
    shorter, and the item tower reads a short block as little engagement. A row with nothing to impute from stays
    zero."""
    return _unit(impute_engagement(content, known_content, known_engagement, k))


def impute_from_neighbours(content: Any, known_content: Any, known_values: Any, k: int = IMPUTE_NEIGHBOURS, *,
                           what: str = "values") -> np.ndarray:
    """Per-item vectors of items nobody engaged with yet, f32 ``[m, dv]``, from their ``content`` ``[m, dc]``: the
    one rule by which a new item gets what its content neighbours learned (its engagement block,
    :func:`impute_engagement`; its ID vector in a served model, :func:`genrec.infer.catalog_model.impute_id_vectors`).

    Row i is the similarity-weighted mean of the rows of ``known_values`` ``[n, dv]`` (as given) of the ``k`` items
    of ``known_content`` ``[n, dc]`` nearest to ``content[i]`` by cosine (exact search); the weights are those
    cosines, a neighbour of cosine <= 0 counting for nothing. A row with no neighbour of positive cosine (an
    all-zero content vector, or no known items) stays zero. ``what`` names the values in errors."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"impute_{what}: k must be an integer >= 1, got {k!r}")
    c = check_vectors(content, name="new item content vectors")
    kc = check_vectors(known_content, name="trained items' content vectors")
    kv = check_vectors(known_values, name=f"trained items' {what} vectors")
    if kc.shape[0] != kv.shape[0]:
        raise DataError(f"{kc.shape[0]} content vectors for {kv.shape[0]} {what} vectors of the trained items",
                        field=what)
    if c.shape[1] != kc.shape[1]:
        raise DataError(f"new item content vectors have dimension {c.shape[1]}, the trained items' {kc.shape[1]}",
                        field="content")
    out = np.zeros((c.shape[0], kv.shape[1]), np.float32)
    k = min(k, kc.shape[0])
    index = faiss.IndexFlatIP(kc.shape[1])
    index.add(_unit(kc))
    sims, rows = index.search(_unit(c), k)  # [m, k] cosines, best first; [m, k] rows of the trained items
    w = np.where((rows >= 0) & (sims > 0), sims, 0.0).astype(np.float64)  # [m, k]
    total = w.sum(axis=1)  # [m]
    mean = np.einsum("mk,mkd->md", w, kv.astype(np.float64)[np.maximum(rows, 0)])  # [m, dv]
    ok = total > 0
    out[ok] = (mean[ok] / total[ok, None]).astype(np.float32)
    return out


RECIPE_KEYS = ("source", "engagement_weight", "features", "run", "checkpoint", "step")
"""The build inputs that say how a version's vectors were made (``features``: the item features folder it was
built from): ``sid assign`` carries them from the version it extends into the new one, so the next ``sid assign``
codes new items under the same recipe."""


def features_text_quality(features_dir: str | Path) -> dict[str, Any] | None:
    """The ``text_quality`` that ``genrec features build`` recorded in ``features_dir``'s manifest
    (None: no manifest, or features built before the check)."""
    path = Path(features_dir) / MANIFEST
    if not path.exists():
        return None
    q = read_json(path).get("text_quality")
    return q if isinstance(q, dict) else None


@dataclass(frozen=True)
class SourceChoice:
    """What a SID build quantises (``source``, one of SID_SOURCES) and what to tell the user about it."""

    source: str
    message: str | None = None
    """A line for stderr ('note: ...' or 'warning: ...'), or None when there is nothing to say."""

    @property
    def loud(self) -> bool:
        """The message is a warning (explicit content SIDs on degenerate text), not a note."""
        return self.message is not None and self.message.startswith("warning:")


def choose_sid_source(text_quality: dict[str, Any] | None, requested: str | None = None, *,
                      has_engagement: bool = True) -> SourceChoice:
    """``genrec sid build``'s ``--source``: ``requested`` when given (a warning when it quantises content
    vectors built from degenerate item text), else ``"content+engagement"`` (``"content"`` when there are no
    engagement vectors) -- or ``"engagement"`` when the features manifest's ``text_quality``
    (:func:`features_text_quality`) says the item text is degenerate.

    Why content beside engagement by default: chosen on validation SID Recall@10 over the three sources on
    Amazon Beauty, MovieLens 100K and ml-latest-small (docs/RESULTS.md, Q2). Engagement alone scored higher
    still, but it cannot code a new item (nobody engaged with it yet); content beside engagement codes a new
    item from its content block (``genrec sid assign``). ``--source content`` is PinGER's choice."""
    if requested is not None and requested not in SID_SOURCES:
        raise ConfigError(f"--source must be one of {', '.join(SID_SOURCES)}, got {requested!r}")
    bad = is_degenerate(text_quality)
    numbers = describe(text_quality) if bad and text_quality is not None else ""
    if requested is None:
        if not bad:
            return SourceChoice("content+engagement" if has_engagement else "content")
        return SourceChoice("engagement", f"note: the item text is degenerate ({numbers}), so the SIDs quantise the "
                                          f"engagement vectors (the default --source on such text); pass "
                                          f"`--source content` to quantise the content vectors anyway.")
    if bad and requested not in ("engagement", MODEL_SOURCE):  # (a model's vectors also learned from engagement)
        harm = "these SIDs are largely noise" if requested == "content" else "half of what is quantised is noise"
        return SourceChoice(requested, f"warning: --source {requested} on degenerate item text ({numbers}): the "
                                       f"content vectors carry little or no meaning, so {harm}. Leave --source out "
                                       f"(or pass `--source engagement`) to quantise the engagement vectors.")
    return SourceChoice(requested)


def source_stats(inputs: dict[str, Any]) -> dict[str, Any]:
    """The ``source`` entry of a build's stats.json: what was quantised and why, from the build's ``inputs``
    (``source``, and ``features``: the item features folder, whose manifest holds the text check)."""
    source = str(inputs.get("source", "content"))
    q = features_text_quality(inputs["features"]) if inputs.get("features") else None
    out: dict[str, Any] = {"used": source, "vectors": _SOURCE_VECTORS.get(source, source)}
    if source == MODEL_SOURCE:
        out.update({k: inputs.get(k) for k in ("run", "checkpoint", "step")})
    if q is None:
        out["item_text"] = "not checked"
        return out
    bad = is_degenerate(q)
    out["item_text"] = "degenerate" if bad else ("usable" if q.get("content_from_text", True) else "not used")
    out["text_quality"] = {k: q.get(k) for k in ("coverage", "distinct_ratio", "duplicate_share", "reasons")}
    if bad and source == "engagement":
        out["why"] = (f"the item text is degenerate ({describe(q)}): the engagement vectors, the default --source "
                      f"on such text")
    elif bad and source != MODEL_SOURCE:
        out["warning"] = (f"--source {source} on degenerate item text ({describe(q)}): content SIDs are largely "
                          f"noise; the default here is --source engagement")
    return out


def trained_item_vectors(version_path: str | Path) -> ItemVectors:
    """The item features a collaborative SID version was built from (its manifest's ``inputs["features"]``; that
    folder moved with its run: the ``features`` beside the version's ``sid`` folder), restricted to the items the
    version codes that have engagement -- those a new item's engagement is imputed from (:func:`impute_engagement`).
    An item without engagement (nobody engaged with it at build time; or an item coded by an earlier ``sid assign``
    whose features row is zero) has no engagement to give: its zero vector would only take a neighbour's place."""
    path = Path(version_path)
    recorded = read_json(path / MANIFEST).get("inputs", {}).get("features")
    if not recorded:
        raise ConfigError(f"SID version {path.name} quantised content beside engagement, but its manifest names no "
                          f"item features folder (inputs.features), whose trained items a new item's engagement is "
                          f"imputed from: build the SIDs with `genrec sid build`")
    folder = Path(recorded)
    if not (folder / MANIFEST).exists() and (path.parent.parent / "features" / MANIFEST).exists():
        folder = path.parent.parent / "features"  # the run directory moved since the build
    if not (folder / MANIFEST).exists():
        raise MissingDataError(f"SID version {path.name} was built from the item features in {recorded}, which are "
                               f"gone: a new item's engagement is imputed from them (`genrec features build`, then "
                               f"`genrec sid build`, to start again)")
    vecs = ItemVectors.load(folder, mmap=False)
    coded = np.load(path / "item_ids.npy")
    keep = np.isin(np.asarray(vecs.item_ids), coded) & np.any(np.asarray(vecs.engagement) != 0, axis=1)
    if not keep.any():
        raise DataError(f"none of the {len(coded)} items SID version {path.name} codes has engagement in the item "
                        f"features in {folder}: nothing to impute a new item's engagement from", path=folder,
                        field="engagement")
    return ItemVectors(np.asarray(vecs.item_ids)[keep], np.asarray(vecs.content)[keep],
                       np.asarray(vecs.engagement)[keep], meta={"folder": str(folder)})


def new_item_vectors(version_path: str | Path, content: Any, quantizer_dim: int,
                     k: int = IMPUTE_NEIGHBOURS) -> np.ndarray:
    """What ``sid assign`` quantises for NEW items (content vectors only) under the build recipe of
    the version at ``version_path``: the content vectors themselves, or for a collaborative
    (``content+engagement``) build the normalised content beside an engagement block imputed from the
    ``k`` trained items (with engagement) nearest by content (:func:`impute_engagement` over :func:`trained_item_vectors`): a new
    item has no engagement yet, and is coded as the items it resembles were."""
    inputs = read_json(Path(version_path) / MANIFEST).get("inputs", {})
    source = inputs.get("source", "content")
    if source == MODEL_SOURCE:
        raise ConfigError(f"SID version {Path(version_path).name} quantised the item vectors of the trained run "
                          f"{inputs.get('run')} (`genrec sid build --source model`): a new item's vector comes from "
                          f"that model (genrec.recipes.model_sids.new_item_model_vectors; `genrec sid assign` does "
                          f"this), not from its content vectors alone")
    if source == "engagement":
        raise ConfigError(f"SID version {Path(version_path).name} quantised the engagement vectors (`genrec sid build "
                          f"--source engagement`, the default on degenerate item text): a new item has no engagement "
                          f"yet, so `genrec sid assign` cannot code it from content vectors. Rebuild the features and "
                          f"the SIDs (`genrec features build`, `genrec sid build`) once its events are in the tables.")
    c = check_vectors(content, name="new item content vectors")
    if source == "content":
        return c
    if quantizer_dim <= c.shape[1]:
        raise DataError(f"new item vectors have dimension {c.shape[1]}; the {source!r} codebooks take "
                        f"{quantizer_dim} = content + engagement", field="vectors")
    known = trained_item_vectors(version_path)
    dc, de = known.content.shape[1], known.engagement.shape[1]
    if (dc, dc + de) != (c.shape[1], quantizer_dim):
        raise DataError(f"the item features in {known.meta['folder']} have content dimension {dc} and engagement "
                        f"{de}; SID version {Path(version_path).name}'s codebooks take {quantizer_dim} and the new "
                        f"item content vectors have {c.shape[1]}: the features were rebuilt since the SID build?",
                        field="vectors")
    e = new_item_engagement(c, known.content, known.engagement, k)
    return sid_input_vectors(c, e, source, float(inputs.get("engagement_weight", 1.0)))
