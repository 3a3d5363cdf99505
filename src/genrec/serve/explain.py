"""``/v1/recommend`` with ``"explain": true`` (issue 41 item 1, the explorer page): what each stage of the one
request found, read off the request's own run, not recomputed.

The funnel (:func:`genrec.infer.funnel.run_funnel`) calls every stage through the Recommender (``decode_sids``,
``ann.search_and_reconstruct``, ...), which is what lets the service swap the ranking stage for a remote one.
An explained request runs on a per-request shallow copy of the Recommender whose SID decode and ANN index are
wrapped by a :class:`Trace`: each records what its stage returned (the beams with their codes and
log-probabilities, the item each beam reaches; the ANN items with their inner products) and hands it on
unchanged. So the answer's ``items`` are the ones the same request gives without ``explain`` (the trace's
device->host copies are inside the stages' timings).

:func:`explain_block` then writes the ``explain`` object of the answer: the request's history with titles and
whether the model read each event, the SID beams, the ANN list, and the ranked items' titles. Item ids are the
tables'; :func:`explain_ids_out` names them by the source file's ids for a run whose ids were remapped.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional, Union

import numpy as np
import torch
from pydantic import BaseModel, Field

from genrec.decode.beam import BeamResult
from genrec.decode.rows import beam_leaf_rows
from genrec.serve.ids import SourceItemIds, Unknown

__all__ = ["Explain", "Trace", "explain_block", "explain_ids_out", "traced"]

AnyItemId = Union[int, str]
_ID = "The item's id (the source file's id, text, for a run whose ids were remapped)."


class ExplainHistoryItem(BaseModel):
    item_id: AnyItemId = Field(description=_ID)
    title: Optional[str] = Field(description="The catalogue's title (null: none, or an unknown item).")
    action: Any = Field(default=None, description="The event's action as sent.")
    ts: Optional[int] = Field(default=None, description="The event's time as sent (epoch seconds).")
    status: Literal["read", "older", "unknown"] = Field(
        description="`read`: in the newest context window the model reads; `older`: a known item before that "
                    "window (left out, counted in `truncated_items`); `unknown`: not in the catalogue "
                    "(in `dropped_items`).")


class ExplainBeam(BaseModel):
    codes: list[int] = Field(description="The beam's Semantic ID, one code per level (per semantic level: a prefix, "
                                         "with a coarse-prefix SID stage).")
    log_prob: float = Field(description="The beam's cumulative log-probability under the model.")
    item_id: Optional[AnyItemId] = Field(description="The catalogue item whose SID it is (null: none). " + _ID)
    title: Optional[str] = Field(description="That item's title.")


class ExplainAnnItem(BaseModel):
    item_id: AnyItemId = Field(description=_ID)
    title: Optional[str] = Field(description="The item's title.")
    score: float = Field(description="The inner product of the user vector and the item's vector in the index.")


class Explain(BaseModel):
    """What each stage of this request found (``"explain": true``)."""

    history: list[ExplainHistoryItem] = Field(description="The request's history, in request order.")
    sid_beams: Optional[list[ExplainBeam]] = Field(
        description="The SID stage's valid beams, best first, each with the item it reaches (null: the stage did "
                    "not run). Full-code beams: its first `3 * k` distinct items were the stage's candidates. A "
                    "coarse-prefix stage (sid_mode merged, prefix or dense: the default for a model with a dense "
                    "stage) beams over the semantic levels only: no one item each (item_id null).")
    ann: Optional[list[ExplainAnnItem]] = Field(
        description="The ANN stage's items, best first (null: the stage did not run).")
    item_titles: list[Optional[str]] = Field(description="The title of each of `items`, in that order.")


class Trace:
    """What one request's stages returned, recorded on the host (see the module docstring)."""

    def __init__(self) -> None:
        self.beams: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # codes [W, L], log-probs [W], rows [W]
        self.ann: tuple[np.ndarray, np.ndarray] | None = None  # item ids [n], scores [n]


class _TracedAnn:
    """An :class:`~genrec.infer.ann.AnnIndex` whose searches are recorded into a :class:`Trace`."""

    def __init__(self, ann: Any, trace: Trace) -> None:
        self._ann, self._trace = ann, trace

    def __len__(self) -> int:
        return len(self._ann)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ann, name)

    def search_and_reconstruct(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, scores, vecs = self._ann.search_and_reconstruct(queries, k)
        self._trace.ann = (np.array(ids[0]), np.array(scores[0]))
        return ids, scores, vecs

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids, scores = self._ann.search(queries, k)
        self._trace.ann = (np.array(ids[0]), np.array(scores[0]))
        return ids, scores


def traced(rec: Any, trace: Trace, leaf_rows: torch.Tensor | None) -> Any:
    """A shallow copy of the Recommender ``rec`` (one history per call) whose SID decode and ANN index record
    into ``trace``; ``leaf_rows``: the catalogue row of each SID-trie leaf, on the trie's device (the beams'
    items, :func:`genrec.decode.rows.beam_leaf_rows`). ``rec`` itself is left as it was."""
    out = copy.copy(rec)
    decode = rec.decode_sids

    def decode_sids(cache: Any, beam_width: int, diversity_lambda: float = 0.0, constrain: bool = True) -> BeamResult:
        beams = decode(cache, beam_width, diversity_lambda, constrain)
        rows = (torch.full_like(beams.scores, -1, dtype=torch.int64) if leaf_rows is None or rec.trie is None
                else beam_leaf_rows(beams, rec.trie, leaf_rows))
        keep = beams.valid[0]
        trace.beams = (beams.codes[0][keep].cpu().numpy(), beams.scores[0][keep].double().cpu().numpy(),
                       rows[0][keep].cpu().numpy())
        return beams

    out.decode_sids = decode_sids
    retrieve = type(rec).retrieve_sids  # called on the copy: its full-code path runs the traced decode above

    def retrieve_sids(cache: Any, beam_width: int, diversity_lambda: float, limit: int,
                      user: torch.Tensor | None = None) -> Any:
        got = retrieve(out, cache, beam_width, diversity_lambda, limit, user)
        if out.served_sid_mode != "full":  # the coarse-prefix stage: its beams over the semantic levels
            beams, keep = got[0], got[0].valid[0]
            trace.beams = (beams.codes[0][keep].cpu().numpy(), beams.scores[0][keep].double().cpu().numpy(),
                           np.full(int(keep.sum()), -1, np.int64))  # a prefix is no one item's SID
        return got

    out.retrieve_sids = retrieve_sids
    if rec.ann is not None:
        out.ann = _TracedAnn(rec.ann, trace)
    return out


def _titles(catalog: Any, rows: np.ndarray) -> list[str | None]:
    titles = catalog.titles
    return [None if (titles is None or r < 0) else titles[int(r)] for r in np.asarray(rows, dtype=np.int64).tolist()]


def history_status(rows: np.ndarray, context_len: int) -> list[str]:
    """Each event's status (:class:`ExplainHistoryItem`): the newest ``context_len`` known ones are read."""
    known = np.flatnonzero(rows >= 0)
    out = ["unknown"] * len(rows)
    older = max(0, len(known) - context_len)
    for n, j in enumerate(known.tolist()):
        out[j] = "older" if n < older else "read"
    return out


def explain_block(rec: Any, trace: Trace | None, history: Sequence[Mapping[str, Any]],
                  item_ids: Sequence[int]) -> dict[str, Any]:
    """The ``explain`` object (tables' ids) of one answer: ``history`` as the request sent it (the tables' ids,
    or placeholders < 0 for ids the catalogue lacks), ``trace`` what its stages returned (None: no stage ran, a
    cold start), ``item_ids`` the answer's items."""
    cat = rec.catalog
    ids = np.asarray([int(h["item_id"]) for h in history], dtype=np.int64)
    rows = cat.rows(ids, strict=False) if len(ids) else np.zeros(0, np.int64)
    hist = [{"item_id": int(i), "title": t, "action": h.get("action"), "ts": h.get("ts"), "status": s}
            for i, h, t, s in zip(ids.tolist(), history, _titles(cat, rows), history_status(rows, rec.context_len))]
    beams = ann = None
    if trace is not None and trace.beams is not None:
        codes, lps, brows = trace.beams
        order = np.argsort(-lps, kind="stable")
        bt = _titles(cat, brows)
        beams = [{"codes": [int(c) for c in codes[j]], "log_prob": float(lps[j]),
                  "item_id": None if brows[j] < 0 else int(cat.item_ids[brows[j]]), "title": bt[j]}
                 for j in order.tolist()]
    if trace is not None and trace.ann is not None:
        a_ids, a_sc = trace.ann
        ok = a_ids >= 0
        a_ids, a_sc = a_ids[ok], a_sc[ok]
        at = _titles(cat, cat.rows(a_ids, strict=False))
        ann = [{"item_id": int(i), "title": t, "score": float(s)} for i, t, s in zip(a_ids.tolist(), at, a_sc.tolist())]
    out_rows = cat.rows(np.asarray(list(item_ids), dtype=np.int64), strict=False) if len(item_ids) else np.zeros(0)
    return {"history": hist, "sid_beams": beams, "ann": ann, "item_titles": _titles(cat, out_rows)}


def explain_ids_out(block: dict[str, Any], ids: SourceItemIds, unknown: Unknown) -> dict[str, Any]:
    """``block``'s item ids (the tables', or this request's placeholders) -> the source file's ids, in place."""
    for key in ("history", "sid_beams", "ann"):
        entries = [e for e in (block.get(key) or []) if e["item_id"] is not None]
        for e, orig in zip(entries, ids.ids_out([e["item_id"] for e in entries], unknown)):
            e["item_id"] = orig
    return block
