"""What a SID build quantises: the content vectors (PinGER: a new item gets its SID from content alone), content
beside engagement (collaborative SIDs), the engagement vectors when ``genrec features build`` found the item
text degenerate (:func:`choose_sid_source`), or a trained model's own item vectors (``"model"``: computed by
:mod:`genrec.recipes.model_sids`, which this layer does not import); and what ``sid assign`` quantises for new
items under a version's recipe (:func:`new_item_vectors`). Each version's stats.json says which, and why (:func:`source_stats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genrec.errors import ConfigError, DataError
from genrec.features.text_quality import describe, is_degenerate
from genrec.sid.rqkmeans import check_vectors
from genrec.workdir import MANIFEST, read_json

__all__ = ["MODEL_SOURCE", "RECIPE_KEYS", "SID_SOURCES", "SourceChoice", "choose_sid_source", "features_text_quality",
           "new_item_vectors", "sid_input_vectors", "source_stats"]

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
    engaged with yet) leaves that block zero, which is how ``sid assign`` codes new items against
    such a codebook. ``"engagement"``: the engagement vectors as they are -- the default of ``genrec
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

    def unit(x: np.ndarray) -> np.ndarray:
        n = np.linalg.norm(x, axis=1, keepdims=True)
        return np.where(n > 0, x / np.maximum(n, 1e-12), 0.0).astype(np.float32)

    if engagement is None:
        raise ConfigError("SID source 'content+engagement' needs the engagement vectors")
    e = check_vectors(engagement, name="engagement vectors")
    if e.shape[0] != c.shape[0]:
        raise DataError(f"engagement vectors have {e.shape[0]} rows, content vectors {c.shape[0]}",
                        field="engagement")
    return np.concatenate([unit(c), float(engagement_weight) * unit(e)], axis=1)


RECIPE_KEYS = ("source", "engagement_weight", "run", "checkpoint", "step")
"""The build inputs that say how a version's vectors were made: ``sid assign`` carries them from the version it
extends into the new one, so the next ``sid assign`` codes new items under the same recipe."""


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


def new_item_vectors(version_path: str | Path, content: Any, quantizer_dim: int) -> np.ndarray:
    """What ``sid assign`` quantises for NEW items (content vectors only) under the build recipe of
    the version at ``version_path``: the content vectors themselves, or for a collaborative
    (``content+engagement``) build the normalised content beside an all-zero engagement block --
    a new item has no engagement yet, as the items nobody engaged with at build time."""
    inputs = read_json(Path(version_path) / "manifest.json").get("inputs", {})
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
    zeros = np.zeros((c.shape[0], quantizer_dim - c.shape[1]), np.float32)
    return sid_input_vectors(c, zeros, source, float(inputs.get("engagement_weight", 1.0)))
