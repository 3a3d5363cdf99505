"""Ranking metrics on held-out feedview slates: AUC per action and UniPinRec's Hit@3.

UniPinRec §4 (ranking evaluation): each slate is scored by the action heads as a decode step
over the cached history that precedes the request (``Recommender.score_candidates`` = the
model's ``rank``), exactly what serving does in L1. Non-standard details (none of the bundled
datasets logs impressions; their feedviews are chunks of the interactions):

* A slate is the **held-out part** of the feedview holding the case's target -- the target and
  the user's later slate items, none of them ever a training candidate -- asked at the target,
  with the case's history (the newest ``context_len`` events before it): see
  :meth:`genrec.data.join.BucketJoinReader._feedviews`. Under leave-one-out that is 1 item (test)
  or 2 (valid); under ``data.split=temporal`` up to a whole slate. With an impressions file
  (``DatasetInfo.impressions``) it is the whole logged slate holding the target, impression-only
  (label 0) items included, asked at its own request
  (:meth:`genrec.data.join.BucketJoinReader._logged_feedviews`).
* To each slate, ``negatives`` catalogue items are added as impression-only candidates (label 0),
  as training does (``data.neg_cands``): uniform over the catalogue minus the slate and the
  case's history, drawn from a generator seeded by (user, request), so every model is scored on
  the same slates. Slate items unknown to the catalogue are dropped; slates with no history or no
  known item are skipped (counted in ``skipped``).
* AUC per action ``c`` pools the **logged** slate items only (the sampled negatives carry no
  logged action): score ``sigmoid(logit_c)``, label = bit ``c`` (NaN when one class is absent).
* Hit@3 ranks each slate, negatives included, by the utility ``sum_c u_c * sigmoid(logit_c)``
  (default: +1 for positive actions, -1 for negative ones: what serving ranks by) and counts
  positives = items with a positive-action bit (:func:`genrec.eval.metrics.hit_at_k_slates`;
  ties count against the positives). ``hit@3_chance`` is its exact expectation under a random
  order of the same slates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from genrec.catalog import ItemCatalog
from genrec.data.join import UserExample
from genrec.eval.metrics import auc, hit_at_k_per_slate, hit_at_k_slates
from genrec.eval.significance import PairedDiff, paired_bootstrap
from genrec.infer.recommender import Recommender, action_utility
from genrec.model.types import ModelBatch

if TYPE_CHECKING:
    from genrec.infer.catalog_model import CatalogModel
    from genrec.train.objective import JointObjective


SLATE_NEGATIVES = 8
"""Sampled impression-only candidates added to each held-out slate by default (``genrec eval --slate-negatives``,
training's ``valid/rank/*``): a leave-one-out validation slate alone holds 2 items, where Hit@3 says nothing."""


@dataclass
class Slate:
    """One scorable request: history rows/actions/surfaces/ts, candidate rows, label masks. The last
    ``n_sampled`` candidates are sampled impression-only negatives (label 0), the others logged items."""

    rows: np.ndarray  # int64 [n]
    actions: np.ndarray  # int64 [n]
    surfaces: np.ndarray  # int64 [n]
    ts: np.ndarray  # int64 [n]
    cand_rows: np.ndarray  # int64 [k]
    labels: np.ndarray  # int64 [k] bitmask over actions
    surface: int
    request_ts: int
    n_sampled: int = 0

    @property
    def logged(self) -> slice:
        """The logged candidates (not the sampled negatives)."""
        return slice(0, len(self.cand_rows) - self.n_sampled)


def sample_negatives(n_catalog: int, exclude: np.ndarray, m: int, user_id: int, request_seq: int,
                     seed: int = 0) -> np.ndarray:
    """``m`` distinct catalogue rows not in ``exclude``, uniform, from a generator seeded by
    (seed, user, request): the same rows for every model scored on this slate. Fewer when the
    catalogue has fewer free rows."""
    free = n_catalog - len(np.unique(exclude))
    m = max(0, min(m, free))
    if m == 0:
        return np.zeros(0, np.int64)
    g = np.random.default_rng([seed, user_id & 0xFFFFFFFFFFFFFFFF, request_seq & 0xFFFFFFFF])
    ex = set(np.asarray(exclude, dtype=np.int64).tolist())
    out: list[int] = []
    seen: set[int] = set()
    while len(out) < m:
        for r in g.integers(0, n_catalog, 2 * m).tolist():
            if r not in ex and r not in seen:
                seen.add(r)
                out.append(r)
                if len(out) == m:
                    break
    return np.asarray(out, dtype=np.int64)


def collect_slates(records: Sequence["UserExample"], feedviews: Sequence[Sequence[Any]], catalog: ItemCatalog,
                   *, context_len: int, negatives: int = 0, seed: int = 0) -> tuple[list[Slate], int]:
    """Slates from eval records (``feedviews[i]`` are record i's slates), each with ``negatives``
    sampled impression-only candidates appended (:func:`sample_negatives`). Returns (slates, skipped)."""
    out: list[Slate] = []
    skipped = 0
    n_cat = len(catalog)
    for r, fvs in zip(records, feedviews):
        for fv in fvs:
            hl = int(fv.history_len)
            cand = catalog.rows(np.asarray(fv.item_ids, dtype=np.int64), strict=False)
            keep = cand >= 0
            if hl < 1 or not keep.any():
                skipped += 1
                continue
            hrows = catalog.rows(np.asarray(r.items[:hl], dtype=np.int64), strict=False)
            ok = hrows >= 0
            sel = np.flatnonzero(ok)[-context_len:]
            if len(sel) == 0:
                skipped += 1
                continue
            logged = cand[keep]
            neg = sample_negatives(n_cat, np.concatenate([logged, hrows[ok]]), negatives, int(r.user_id),
                                   int(fv.request_seq), seed) if negatives else np.zeros(0, np.int64)
            out.append(Slate(hrows[sel], np.asarray(r.actions[:hl], np.int64)[sel],
                             np.asarray(r.surfaces[:hl], np.int64)[sel], np.asarray(r.timestamps[:hl], np.int64)[sel],
                             np.concatenate([logged, neg]),
                             np.concatenate([np.asarray(fv.labels, np.int64)[keep], np.zeros(len(neg), np.int64)]),
                             int(fv.surface), int(fv.request_ts), n_sampled=len(neg)))
    return out, skipped


@torch.no_grad()
def score_slates(rec: "Recommender", slates: Sequence[Slate], *, batch_size: int = 128) -> list[np.ndarray]:
    """Per slate: action probabilities ``[k, C]`` from one history encode + one rank step."""
    out: list[np.ndarray] = []
    dev = rec.device
    for lo in range(0, len(slates), batch_size):
        chunk = slates[lo:lo + batch_size]
        parsed = [{"rows": s.rows, "actions": s.actions, "surfaces": s.surfaces, "ts": s.ts} for s in chunk]
        mb = rec.model_batch(parsed)
        cache, _ = rec.encode(mb)
        k = max(len(s.cand_rows) for s in chunk)
        rows = np.zeros((len(chunk), k), np.int64)  # pad with row 0: candidates never see each other
        for i, s in enumerate(chunk):
            rows[i, :len(s.cand_rows)] = s.cand_rows
        surf = torch.tensor([s.surface for s in chunk], dtype=torch.int64, device=dev)
        rts = torch.tensor([s.request_ts for s in chunk], dtype=torch.int64, device=dev)
        logits = rec.score_candidates(cache, torch.from_numpy(rows).to(dev), None, surf, rts)  # [B, k, C]
        p = torch.sigmoid(logits.float()).cpu().numpy()
        out.extend(p[i, :len(s.cand_rows)] for i, s in enumerate(chunk))
    return out


@torch.no_grad()
def slate_probs(objective: torch.nn.Module, slates: Sequence[Slate], *, batch_size: int = 128) -> list[np.ndarray]:
    """:func:`score_slates` on a model with its catalogue tensors -- the trainer's
    :class:`~genrec.train.objective.JointObjective` or a :class:`~genrec.infer.catalog_model.CatalogModel` --
    eagerly, without a Recommender: the validation ranking metrics of training (``valid/rank/*``). The same
    history encode and rank step as the served path (tested equal to it)."""
    obj = cast("JointObjective | CatalogModel", objective)
    model = obj.model
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()  # (the final validation of a run calls it in training mode)
    try:
        vecs = obj.catalogue_vectors()  # [N, D]
        codes = obj.codes if model.config.uses_sids else None  # [N, L]: the codes the model reads
        return _score_chunks(model, vecs, codes, slates, batch_size, dev)
    finally:
        model.train(was_training)


def _score_chunks(model: Any, vecs: torch.Tensor, codes: torch.Tensor | None, slates: Sequence[Slate],
                  batch_size: int, dev: torch.device) -> list[np.ndarray]:
    """:func:`slate_probs`' loop: each slate's probabilities, chunk by chunk."""
    out: list[np.ndarray] = []
    for lo in range(0, len(slates), batch_size):
        chunk = slates[lo:lo + batch_size]
        b, n, k = len(chunk), max(len(s.rows) for s in chunk), max(len(s.cand_rows) for s in chunk)
        cols = np.zeros((4, b, n), np.int64)  # rows, actions, surfaces, ts; right-padded
        cand = np.zeros((b, k), np.int64)  # pad with row 0: candidates never see each other
        for i, s in enumerate(chunk):
            for c, v in enumerate((s.rows, s.actions, s.surfaces, s.ts)):
                cols[c, i, :len(v)] = v
            cand[i, :len(s.cand_rows)] = s.cand_rows
        t = torch.from_numpy(cols).to(dev)
        rows, cand_t = t[0], torch.from_numpy(cand).to(dev)
        mb = ModelBatch(actions=t[1], surfaces=t[2], timestamps=t[3], item_vecs=vecs[rows],
                        lengths=torch.tensor([len(s.rows) for s in chunk], dtype=torch.int64, device=dev),
                        sid_codes=None if codes is None else codes[rows])
        cache, _, _ = model.encode_history(mb)
        logits = model.rank(cache, vecs[cand_t], None if codes is None else codes[cand_t],
                            torch.tensor([s.surface for s in chunk], dtype=torch.int64, device=dev),
                            torch.tensor([s.request_ts for s in chunk], dtype=torch.int64, device=dev))
        p = torch.sigmoid(logits.float()).cpu().numpy()
        out.extend(p[i, :len(s.cand_rows)] for i, s in enumerate(chunk))
    return out


def slate_scalars(objective: torch.nn.Module, slates: Sequence[Slate], actions: Sequence[str],
                  positive_actions: Sequence[str], k: int = 3) -> dict[str, float]:
    """Training's validation ranking of ``slates`` (:func:`slate_probs`; the default utility, as ``genrec eval``):
    ``rank/hit@3``, ``rank/auc/<action>`` and ``rank/auc`` (the mean over the actions whose AUC is defined;
    nan when none is)."""
    u = action_utility(actions, positive_actions)
    m = slate_metrics(slate_probs(objective, slates), slates, actions, positive_actions,
                      np.array([u[a] for a in actions], dtype=np.float32), k)
    aucs = {a: float(v) for a, v in m["auc"].items()}
    defined = [v for v in aucs.values() if np.isfinite(v)]
    return {f"rank/hit@{k}": float(m[f"hit@{k}"]), **{f"rank/auc/{a}": v for a, v in aucs.items()},
            "rank/auc": float(np.mean(defined)) if defined else float("nan")}


def ranking_metrics(rec: "Recommender", slates: Sequence[Slate], *, utility: Mapping[str, float] | None = None,
                    k: int = 3, batch_size: int = 128) -> dict[str, Any]:
    """``{"auc": {action: value}, "hit@3", "hit@3_chance", "n_slates", "n_items", ...}`` over
    ``slates``; ``utility`` None: the Recommender's default (+1 positive, -1 negative actions)."""
    if rec.model.action_head is None:
        return {"auc": {}, f"hit@{k}": float("nan"), "n_slates": 0, "n_items": 0,
                "note": f"layout {rec.config.layout!r} has no action heads"}
    probs = score_slates(rec, slates, batch_size=batch_size)
    u = rec.utility_vector(utility).cpu().numpy()
    out = slate_metrics(probs, slates, rec.actions, rec.positive_actions, u, k)
    out["utility"] = {a: float(x) for a, x in zip(rec.actions, u.tolist())}
    return out


def hit_chance(labels: Sequence[np.ndarray], k: int = 3) -> float:
    """The expectation of :func:`genrec.eval.metrics.hit_at_k_slates` when each slate is ordered at
    random: with P positives among n items, min(k, n) * P / n of them land in the top k on average."""
    vals = []
    for y in labels:
        y = np.asarray(y).astype(bool)
        n, pos = len(y), int(y.sum())
        if pos:
            vals.append(min(k, n) * pos / n / min(k, pos))
    return float(np.mean(vals)) if vals else float("nan")


def _label_bits(slates: Sequence[Slate], actions: Sequence[str],
                positive_actions: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The logged items' action bits ``[M, C]`` (bool, slates concatenated) and, per slate, which
    candidates carry a positive action (negatives included, as False)."""
    bits = 1 << np.arange(len(actions))
    if slates:
        y_all = (np.concatenate([s.labels[s.logged] for s in slates])[:, None] & bits[None, :]) > 0
    else:
        y_all = np.zeros((0, len(actions)), bool)
    pos_mask = sum(1 << list(actions).index(a) for a in positive_actions if a in actions)
    return y_all, [(s.labels & pos_mask) > 0 for s in slates]


def slate_metrics(probs: Sequence[np.ndarray], slates: Sequence[Slate], actions: Sequence[str],
                  positive_actions: Sequence[str], u: np.ndarray, k: int = 3) -> dict[str, Any]:
    """The metrics of :func:`ranking_metrics` from already scored slates (``probs[i]``: slate i's
    ``[k_i, C]`` action probabilities; ``u``: the utility vector ``[C]``)."""
    n_act = len(actions)
    y_all, pos = _label_bits(slates, actions, positive_actions)  # AUC: the logged items only
    p_all = np.concatenate([p[s.logged] for p, s in zip(probs, slates)]) if len(probs) else np.zeros((0, n_act))
    hit = hit_at_k_slates([p @ u for p in probs], pos, k)
    sizes = np.array([len(s.cand_rows) for s in slates])
    return {"auc": {a: auc(p_all[:, c], y_all[:, c]) for c, a in enumerate(actions)}, f"hit@{k}": hit,
            f"hit@{k}_chance": hit_chance(pos, k), "n_slates": len(slates), "n_items": int(len(p_all)),
            "n_sampled_negatives": int(sum(s.n_sampled for s in slates)),
            "slate_size": {"mean": float(sizes.mean()) if len(sizes) else float("nan"),
                           "max": int(sizes.max()) if len(sizes) else 0},
            "positive_rate": {a: float(y_all[:, c].mean()) if len(y_all) else float("nan")
                              for c, a in enumerate(actions)}}


def paired_slates(probs: Mapping[str, Sequence[np.ndarray]], slates: Sequence[Slate], actions: Sequence[str],
                  positive_actions: Sequence[str], utility: Mapping[str, np.ndarray], *, k: int = 3,
                  n_boot: int = 2000, seed: int = 0) -> dict[str, dict[tuple[str, str], PairedDiff]]:
    """Variants scored on the SAME slates (``probs[v][i]``: variant v's ``[k_i, C]`` probabilities on
    slate i; ``utility[v]``: its utility vector), compared by a paired bootstrap over slates:
    ``{"auc/<action>": ..., "hit@k": ...}``, each ``{(a, b): PairedDiff}``. The metrics are those of
    :func:`slate_metrics`, recomputed on every resample (a pooled AUC is not a mean over slates)."""
    n = len(slates)
    y_all, pos = _label_bits(slates, actions, positive_actions)
    lens = np.array([s.logged.stop for s in slates], np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)

    def items(idx: np.ndarray) -> np.ndarray:  # the logged items of the resampled slates, repeats kept
        ln = lens[idx]
        return np.repeat(starts[idx] - (np.cumsum(ln) - ln), ln) + np.arange(int(ln.sum()))

    p_all = {v: np.concatenate([p[s.logged] for p, s in zip(pv, slates)]) for v, pv in probs.items()}
    hits = {v: hit_at_k_per_slate([p @ utility[v] for p in pv], pos, k) for v, pv in probs.items()}

    def auc_of(v: str, c: int) -> Any:
        def f(idx: np.ndarray) -> float:
            rows = items(idx)
            return auc(p_all[v][rows, c], y_all[rows, c])
        return f

    def hit_of(v: str) -> Any:
        def f(idx: np.ndarray) -> float:
            h = hits[v][idx]
            h = h[np.isfinite(h)]
            return float(h.mean()) if len(h) else float("nan")
        return f

    out = {f"auc/{a}": paired_bootstrap({v: auc_of(v, c) for v in probs}, n, n_boot=n_boot, seed=seed)
           for c, a in enumerate(actions)}
    out[f"hit@{k}"] = paired_bootstrap({v: hit_of(v) for v in probs}, n, n_boot=n_boot, seed=seed)
    return out
