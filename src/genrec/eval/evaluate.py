"""``genrec eval``: the offline protocol and its report (PinGER §4.1, UniPinRec §4, TIGER/SASRec metrics).

One checkpoint (BEST if the trainer marked one on validation, else LATEST), one split, the full
catalogue, history items NOT excluded (the full-ranking protocol behind TIGER's published Beauty
numbers, where generated SIDs are never filtered; SASRec's own paper instead ranked the target among
100 sampled items the user had not interacted with). Leave-one-out or temporal, whichever split the
run was trained with. Paths, all in the same run and on the same cases:

* ``sid``   the SID stage as served (:func:`genrec.eval.retrieval.evaluate_retrieval`, ``--sid-mode``);
* ``ann``   exact dense retrieval with the user vector (same function, chunked, no users x items);
* ``l0l1``  the Recommender's union of SID beams and ANN top-(K·r), ranked by the action-head
  utility over the same history cache (UniPinRec's L0 -> L1), added here;
* ``popularity`` the training-split popularity baseline.

Also: ranking metrics on the split's feedview slates (AUC per action, Hit@3, see
:mod:`genrec.eval.ranking`), SID diagnostics (distinct first-level codes among the beams, the
valid-SID rate when decoding UNconstrained, history tokens per item at serving), and optional
sweeps (λ, beam width, context length) that :mod:`genrec.eval.report` plots.

Non-standard: the test split is meant to be touched once. The report says which split it is,
that model choice happened on valid (the trainer's early stopping), and lists the test reports
that already existed in the run dir when this one was written.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from genrec.catalog import open_store
from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec, history_events, train_events
from genrec.errors import ConfigError
from genrec.eval.baselines import ActionPrior, Popularity
from genrec.eval.dump import gapped_cases, write_recs
from genrec.eval.metrics import place_target, rank_in_list, topk_metrics
from genrec.eval.ranking import SLATE_NEGATIVES, Slate, collect_slates, ranking_metrics, slate_metrics
from genrec.eval.retrieval import EvalSet, eval_cases, evaluate_retrieval
from genrec.infer.fusion import read_fusion_meta
from genrec.infer.load import checkpoint_mark, trained_temperature
from genrec.infer.recommender import Recommender
from genrec.infer.transitions import TransitionTable
from genrec.model.checkpoint_io import BEST, resolve_checkpoint
from genrec.model.layout import slot_kinds
from genrec.train.batches import collate
from genrec.workdir import WorkDir


@dataclass
class EvalConfig:
    split: str = "test"  # valid | test
    max_users: int = 0  # 0 = every case
    ks: tuple[int, ...] = (5, 10, 20)
    beam_width: int = 20
    diversity_lambda: float = 0.0
    overretrieve: int = 3
    # L1 score fusion (Recommender.run_batch): a * utility + w * user.candidate + v * log P(SID) + t * log P(item |
    # last item); None: the Recommender's (chosen by `genrec fusion tune` for this checkpoint, else a=1, w=v=t=0)
    retrieval_weight: float | None = None
    sid_weight: float | None = None
    action_weight: float | None = None
    transition_weight: float | None = None
    history_weight: float | None = None
    utility: dict[str, float] | None = None
    """L1 utility for the L0+L1 path. None = every action weighs 1: the leave-one-out target is the
    next interaction of any kind, so the matching utility is the probability of engaging at all
    (the Recommender's serving default instead penalises negative actions such as 'dislike')."""
    batch_size: int = 128
    sweep_lambda: tuple[float, ...] = ()
    sweep_beam: tuple[int, ...] = ()
    sweep_context: tuple[int, ...] = ()
    checkpoint: str | None = None
    sid_mode: str | None = None  # the SID stage, as `genrec serve --sid-mode` (None: $GENREC_SID_MODE, else auto)
    seed: int = 0
    ranking: bool = True
    slate_negatives: int = SLATE_NEGATIVES
    """Sampled impression-only candidates added to each ranking slate (as training's ``data.neg_cands``):
    the held-out part of a leave-one-out slate is 1-2 items, too few for Hit@3 to mean anything."""
    ranking_utility: dict[str, float] | None = None
    """The utility Hit@3 ranks slates by; None = the Recommender's default (+1 positive actions, -1
    negative ones), matching Hit@3's positives (not ``utility``, which is for the L0+L1 retrieval path)."""
    dump_recs: str | None = None
    """Also write every case's ranked top-max(ks) per path as JSON lines, one file per path
    (``recs.jsonl`` -> ``recs.sid.jsonl``, ``recs.ann.jsonl``, ...; :mod:`genrec.eval.dump`)."""

    def validate(self) -> None:
        if self.split not in ("valid", "test"):
            raise ConfigError(f"--split must be 'valid' or 'test', got {self.split!r}")
        if self.max_users < 0:
            raise ConfigError(f"--max-users must be >= 0, got {self.max_users}")
        if not self.ks or min(self.ks) < 1:
            raise ConfigError(f"ks must be positive, got {self.ks}")
        if self.beam_width < 1 or any(b < 1 for b in self.sweep_beam):
            raise ConfigError("beam widths must be >= 1")
        if self.diversity_lambda < 0 or any(x < 0 for x in self.sweep_lambda):
            raise ConfigError("diversity lambda must be >= 0")
        if self.overretrieve < 1:
            raise ConfigError(f"overretrieve must be >= 1, got {self.overretrieve}")
        for flag, x in (("--retrieval-weight", self.retrieval_weight), ("--sid-weight", self.sid_weight),
                        ("--action-weight", self.action_weight), ("--transition-weight", self.transition_weight)):
            if x is not None and not (x >= 0 and math.isfinite(x)):
                raise ConfigError(f"{flag} must be a finite number >= 0, got {x}")
        if self.history_weight is not None and not math.isfinite(self.history_weight):
            raise ConfigError(f"--history-weight must be a finite number, got {self.history_weight}")
        if any(c < 1 for c in self.sweep_context):
            raise ConfigError("context lengths must be >= 1")
        if self.slate_negatives < 0:
            raise ConfigError(f"--slate-negatives must be >= 0, got {self.slate_negatives}")


@dataclass
class EvalData:
    """The cases of one split: the retrieval set and, per case, the user's slates."""

    es: EvalSet
    records: list[Any]
    feedviews: list[list[Any]]
    split_kind: str
    train_item_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # each train event's action, as its index in the model's actions (-1: an action the model does not know); read
    # only where the split's slates are scored (EvalConfig.ranking, a model with action heads)
    train_actions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tables_version: str = ""  # the tables' data version the cases were read from
    transitions: TransitionTable | None = None  # L1's transition term: the item pairs before the split's targets


def load_eval_data(rec: Recommender, workdir: str | Path, cfg: EvalConfig) -> EvalData:
    """Read the split's cases from WORKDIR's tables (the split protocol the run was trained with)."""
    store = open_store(workdir)
    kind = rec.split_kind
    spec = SplitSpec(kind=kind)  # type: ignore[arg-type]
    records = list(BucketJoinReader(store, split=spec, role=cfg.split, context_len=rec.context_len))  # type: ignore[arg-type]
    es, kept, feedviews = eval_cases(records, rec.catalog, max_cases=cfg.max_users, seed=cfg.seed)
    scores_slates = cfg.ranking and rec.model.action_head is not None  # the counts floor reads the train actions
    events = store.read_events(columns=["user_id", "item_id", "seq", "timestamp",
                                        *(["action"] if scores_slates else [])])
    tr = train_events(events, spec)
    return EvalData(es, kept, feedviews, kind,
                    np.asarray(tr.column("item_id").to_numpy(), dtype=np.int64),
                    action_indices(tr.column("action"), rec.actions) if scores_slates else np.zeros(0, np.int64),
                    store.tables_version,
                    TransitionTable.from_events_table(
                        history_events(events, spec, cfg.split), rec.catalog))  # type: ignore[arg-type]


def _batches(rec: Recommender, es: EvalSet, batch_size: int, context_len: int):  # type: ignore[no-untyped-def]
    """(offset, ModelBatch) over the cases, built exactly as the trainer's validation does."""
    for lo in range(0, len(es), batch_size):
        tb = collate(es.examples[lo:lo + batch_size], epoch=0, seed=0, context_len=context_len,
                     n_actions=rec.config.n_actions, p_rank=0.0, max_cands=0).to(rec.device)
        mb, _ = rec.catalog_model.model_batch(tb, mask_actions=False)
        yield lo, mb


@torch.no_grad()
def sid_pass(rec: Recommender, es: EvalSet, *, beam_width: int, diversity_lambda: float, ks: Sequence[int],
             constrain: bool = True, batch_size: int = 128, context_len: int | None = None) -> dict[str, float]:
    """SID path metrics + diagnostics: distinct first-level codes among the beams (mean per user)
    and the share of decoded beams that are real SIDs (1.0 by construction when constrained)."""
    ctx = context_len or rec.context_len
    ranks = np.full(len(es), -1, np.int64)
    distinct: list[int] = []
    n_valid = n_alive = 0
    for lo, mb in _batches(rec, es, batch_size, ctx):
        cache, _ = rec.encode(mb)
        beams = rec.decode_sids(cache, beam_width, diversity_lambda, constrain=constrain)
        alive = torch.isfinite(beams.scores)  # [B, W]
        n_alive += int(alive.sum())
        n_valid += int(beams.valid.sum())
        first = beams.codes[..., 0].cpu().numpy()
        al = alive.cpu().numpy()
        distinct.extend(len(np.unique(first[i][al[i]])) for i in range(len(first)))
        rows, _ = rec.beam_rows(beams, max(ks))
        ranks[lo:lo + len(rows)] = rank_in_list(rows, es.target_rows[lo:lo + len(rows)])
    out = topk_metrics(ranks, ks)
    out["distinct_first_codes"] = float(np.mean(distinct)) if distinct else float("nan")
    out["valid_sid_rate"] = n_valid / max(n_alive, 1)
    return out


@torch.no_grad()
def l0l1_pass(rec: Recommender, es: EvalSet, *, ks: Sequence[int], beam_width: int, diversity_lambda: float,
              overretrieve: int, utility: dict[str, float] | None, batch_size: int = 128,
              retrieval_weight: float | None = None, sid_weight: float | None = None, action_weight: float | None = None,
              parts: list[dict[str, np.ndarray]] | None = None, ranks_out: dict[str, np.ndarray] | None = None,
              lists_out: dict[str, np.ndarray] | None = None, transitions: TransitionTable | None = None,
              transition_weight: float | None = None, history_weight: float | None = None) -> dict[str, float]:
    """The L0 (SID ∪ ANN, over-retrieved by r) -> L1 (fused score, see ``Recommender.run_batch``;
    a weight left None takes ``rec.fusion``'s) path on every case. ``parts``: when a list, each
    batch's L1 score parts are appended to it (with the batch's ``target_rows``), for
    :func:`fusion_metrics`; the transition source then runs whatever the weight (its own rows marked in the
    parts' ``src``), so with a weight of 0 the returned metrics are not the served ones: read the parts. ``ranks_out``: when a dict, ``ranks_out["l0l1"]`` gets every case's
    0-based rank of its target in the top ``max(ks)`` (-1: not there), for paired comparisons.
    ``lists_out``: when a dict, ``lists_out["l0l1"]`` gets every case's ranked top ``max(ks)``
    catalogue rows (int [C, K], -1 padded), the lists the metrics are computed on. ``transitions``: the
    table of the L1 transition term, built from the events before the split's targets (:attr:`EvalData.transitions`;
    never the served one, which holds the targets); without it a transition weight > 0 is an error."""
    kmax = max(ks)
    ranks = np.full(len(es), -1, np.int64)
    lists = np.full((len(es), kmax), -1, np.int64) if lists_out is not None else None
    src_hits = {"sid": 0, "ann": 0, "both": 0}
    for lo, mb in _batches(rec, es, batch_size, rec.context_len):
        hist = [ex.rows for ex in es.examples[lo:lo + mb.actions.shape[0]]]  # the history terms' (L1) rows
        res = rec.run_batch(mb, k=kmax, beam_width=beam_width, diversity_lambda=diversity_lambda, sources=None,
                            rank=True, overretrieve=overretrieve, utility=utility,
                            retrieval_weight=retrieval_weight, sid_weight=sid_weight, action_weight=action_weight,
                            keep_parts=parts is not None, transition_weight=transition_weight,
                            transitions=transitions, last_rows=None if transitions is None else np.array(
                                [h[-1] for h in hist], dtype=np.int64), history_rows=hist, history_weight=history_weight)
        tgt = es.target_rows[lo:lo + len(res.rows)]
        if parts is not None and res.l1_parts is not None:
            parts.append({**res.l1_parts, "target_rows": np.asarray(tgt)})
        r = rank_in_list(res.rows, tgt)
        ranks[lo:lo + len(r)] = r
        if lists is not None:
            lists[lo:lo + len(r), :res.rows.shape[1]] = res.rows[:, :kmax]
        for i in np.flatnonzero(r >= 0):
            bits = int(res.src[i, r[i]])
            src_hits["both" if bits == 3 else "sid" if bits == 1 else "ann"] += 1
    if ranks_out is not None:
        ranks_out["l0l1"] = ranks
    if lists_out is not None and lists is not None:
        lists_out["l0l1"] = lists
    out = topk_metrics(ranks, ks)
    out.update({f"hits_from_{k}": float(v) for k, v in src_hits.items()})
    return out


def history_tokens_per_item(layout: str, sid_levels: int) -> int:
    """Tokens one history item costs at serving (PinGER/dense: 1; HSTU: 2; TIGER: L)."""
    return len(slot_kinds(layout, sid_levels, serving=True))


def evaluate(workdir: str | Path, cfg: EvalConfig, *, rec: Recommender | None = None) -> dict[str, Any]:
    """Run the protocol; returns the report dict (see :func:`run_eval` for the files)."""
    cfg.validate()
    t_start = time.perf_counter()
    rec = rec or Recommender.from_checkpoint(workdir, cfg.checkpoint, sid_mode=cfg.sid_mode)
    if cfg.utility is None:
        cfg = dataclasses.replace(cfg, utility={a: 1.0 for a in rec.actions})
    data = load_eval_data(rec, workdir, cfg)
    es = data.es
    if len(es) == 0:
        raise ConfigError(f"split {cfg.split!r} has no evaluation cases in {workdir}")
    ks = tuple(sorted(set(cfg.ks)))
    mcfg = rec.config
    timings: dict[str, float] = {}
    paths: dict[str, dict[str, float]] = {}
    lists: dict[str, np.ndarray] | None = {} if cfg.dump_recs else None  # --dump-recs: the ranked lists per path
    t0 = time.perf_counter()
    want = tuple(p for p in ("ann", "sid") if (p == "ann" and rec.ann is not None) or (p == "sid" and rec.trie is not None))
    res = evaluate_retrieval(rec.catalog_model, es, paths=want, ks=ks, beam_width=cfg.beam_width,
                             diversity_lambda=cfg.diversity_lambda, context_len=rec.context_len,
                             batch_size=cfg.batch_size, lists_out=lists, **served_sid_stage(rec))
    for p in ("sid", "ann"):
        if p in res:
            paths[p] = res[p]
    timings["sid+ann"] = time.perf_counter() - t0
    if rec.model.action_head is not None and rec.ann is not None:
        t0 = time.perf_counter()  # L0 = SID beams and ANN (a dense-only model: the ANN stage alone)
        paths["l0l1"] = l0l1_pass(rec, es, ks=ks, beam_width=cfg.beam_width, diversity_lambda=cfg.diversity_lambda,
                                  overretrieve=cfg.overretrieve, utility=cfg.utility, batch_size=cfg.batch_size,
                                  retrieval_weight=cfg.retrieval_weight, sid_weight=cfg.sid_weight,
                                  action_weight=cfg.action_weight, lists_out=lists, transitions=data.transitions,
                                  transition_weight=cfg.transition_weight, history_weight=cfg.history_weight)
        timings["l0l1"] = time.perf_counter() - t0
    pop = Popularity(rec.catalog.item_ids, data.train_item_ids)
    pop_ranks = pop.target_ranks(es.target_rows)
    paths["popularity"] = topk_metrics(pop_ranks, ks)
    if lists is not None:
        top = np.argsort(-pop.scores, kind="stable")[:max(ks) + 1]
        lists["popularity"] = place_target(np.broadcast_to(top, (len(es), len(top))), pop_ranks, es.target_rows,
                                           max(ks))

    diag: dict[str, Any] = {"history_tokens_per_item": history_tokens_per_item(mcfg.layout, mcfg.sid_levels)}
    if rec.trie is not None:
        t0 = time.perf_counter()
        c = sid_pass(rec, es, beam_width=cfg.beam_width, diversity_lambda=cfg.diversity_lambda, ks=ks,
                     batch_size=cfg.batch_size)
        u = sid_pass(rec, es, beam_width=cfg.beam_width, diversity_lambda=cfg.diversity_lambda, ks=ks,
                     constrain=False, batch_size=cfg.batch_size)
        diag.update({"distinct_first_codes": c["distinct_first_codes"], "valid_sid_rate_constrained":
                     c["valid_sid_rate"], "valid_sid_rate_unconstrained": u["valid_sid_rate"],
                     "sid_unconstrained_recall@10": u.get("recall@10")})
        timings["sid_diagnostics"] = time.perf_counter() - t0

    ranking: dict[str, Any] | None = None
    if cfg.ranking and rec.model.action_head is not None:
        t0 = time.perf_counter()
        slates, skipped = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len,
                                         negatives=cfg.slate_negatives, seed=cfg.seed)
        ranking = ranking_metrics(rec, slates, utility=cfg.ranking_utility or rec.action_utility(),
                                  batch_size=cfg.batch_size)
        ranking["skipped_slates"] = skipped
        ranking["prior"] = prior_metrics(rec, data, slates, ranking["utility"])
        timings["ranking"] = time.perf_counter() - t0

    sweeps = run_sweeps(rec, es, cfg, ks)
    wd = WorkDir(workdir)
    previous = sorted(p.name for p in wd.reports.glob("eval-test-*.json")) if wd.reports.exists() else []
    notes = _report_notes(rec, cfg, wd)
    dumped: dict[str, str] = {}
    if lists is not None and cfg.dump_recs:
        dumped = write_recs(cfg.dump_recs, {p: lists[p] for p in paths if p in lists},
                            [ex.user_id for ex in es.examples], rec.catalog.item_ids, workdir)
        notes += [f"--dump-recs: {n} cases of path {p} have an unfilled slot before a filled one; their dumped "
                  f"list (unfilled slots left out) ranks those items higher than the metric did"
                  for p in dumped if (n := gapped_cases(lists[p]))]
    timings["total"] = time.perf_counter() - t_start
    run = rec.run_config or {}
    return {
        "kind": "genrec.eval", "workdir": str(wd.root), "split": cfg.split, "test_split": cfg.split == "test",
        "protocol": {"split_kind": data.split_kind, "full_catalogue": True, "history_excluded": False,
                     "cases": len(es), "catalogue_items": len(rec.catalog), "ks": list(ks),
                     "beam_width": cfg.beam_width, "diversity_lambda": cfg.diversity_lambda,
                     "sid_mode": rec.served_sid_mode,
                     "overretrieve": cfg.overretrieve, "utility": rec.default_utility() if cfg.utility is None
                     else cfg.utility, "context_len": rec.context_len, "max_users": cfg.max_users,
                     "l1_fusion": {**asdict(rec.fusion.resolve(cfg.action_weight, cfg.retrieval_weight,
                                                               cfg.sid_weight, cfg.transition_weight,
                                                               cfg.history_weight)),
                                   "stored": None if rec.fusion_path is None else str(rec.fusion_path)}},
        "model_selection": _model_selection(rec, cfg, wd), "notes": notes,
        "previous_test_reports": previous if cfg.split == "test" else [],
        "checkpoint": str(rec.checkpoint), "step": rec.step, "variant": run.get("variant"),
        "versions": {"tables": data.tables_version, "sid": rec.sid_version, "weights_sha256": rec.weights_digest},
        "layout": mcfg.layout, "sid_levels": mcfg.sid_levels,
        "paths": paths, "ranking": ranking, "sid_diagnostics": diag, "sweeps": sweeps,
        "timings_s": timings, "config": {k: v for k, v in asdict(cfg).items()},
        **({"dumped_recs": dumped} if dumped else {}),
    }


def action_indices(names: pa.ChunkedArray | pa.Array, actions: Sequence[str]) -> np.ndarray:
    """Each name's index in ``actions`` (-1 where absent), vectorised: no Python object per event."""
    idx = pc.index_in(names, value_set=pa.array(list(actions), type=pa.string()))
    return np.asarray(pc.fill_null(idx, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def action_prior(rec: Recommender, data: EvalData) -> ActionPrior:
    """The counts floor of the action heads (:class:`ActionPrior`) from the split's training events."""
    return ActionPrior(len(rec.catalog), rec.catalog.rows(data.train_item_ids, strict=False), data.train_actions,
                       len(rec.actions))


def prior_probs(prior: ActionPrior, slates: Sequence[Slate]) -> list[np.ndarray]:
    return [prior.probs(s.actions, s.cand_rows) for s in slates]


def prior_metrics(rec: Recommender, data: EvalData, slates: Sequence[Slate], utility: dict[str, float]
                  ) -> dict[str, Any]:
    """The ranking metrics of the counts floor on the same slates (AUC per action, Hit@3 by the same utility)."""
    m = slate_metrics(prior_probs(action_prior(rec, data), slates), slates, rec.actions, rec.positive_actions,
                      np.array([utility[a] for a in rec.actions], dtype=np.float64))
    return {"auc": m["auc"], "hit@3": m["hit@3"]}


def _model_selection(rec: Recommender, cfg: EvalConfig, wd: WorkDir) -> str:
    """What chose the evaluated checkpoint, in words (the BEST marker is the trainer's choice on valid)."""
    if cfg.checkpoint is not None and checkpoint_mark(cfg.checkpoint) is None:
        return f"checkpoint given on the command line ({rec.checkpoint.name if rec.checkpoint else '?'})"
    try:
        best = resolve_checkpoint(wd.checkpoints, BEST)
    except Exception:  # noqa: BLE001 - a dangling marker: nothing was chosen through it
        best = None
    if best is not None and rec.checkpoint is not None and best.resolve() == Path(rec.checkpoint).resolve():
        return (f"BEST ({best.name}): chosen on the valid split by the trainer's early stopping; the test split is "
                "for one final measurement")
    which = checkpoint_mark(cfg.checkpoint) or "LATEST"
    return (f"{which} ({rec.checkpoint.name if rec.checkpoint else '?'}): the run's last checkpoint, no early "
            "stopping marked a BEST one -- nothing was selected on valid")


def _report_notes(rec: Recommender, cfg: EvalConfig, wd: WorkDir) -> list[str]:
    """Caveats the numbers need beside them: L1 weights chosen on these very cases (in-sample), or at
    another beam width than this evaluation's."""
    out: list[str] = []
    if rec.fusion_path is None or any(x is not None for x in (cfg.action_weight, cfg.retrieval_weight,
                                                                cfg.sid_weight, cfg.transition_weight,
                                                                cfg.history_weight)):
        return out
    chosen = read_fusion_meta(rec.fusion_path).get("chosen_on", {})
    if cfg.split == "valid" and chosen.get("split") == "valid":
        out.append(f"the L0+L1 row is in-sample: its fusion weights were chosen by `genrec fusion tune` on "
                   f"{chosen.get('cases', '?')} validation cases of this split (compare it on test)")
    bw = chosen.get("beam_width")
    if bw is not None and int(bw) != cfg.beam_width:
        out.append(f"the L0+L1 fusion weights were chosen at SID beam {bw}; this evaluation uses beam "
                   f"{cfg.beam_width}")
    return out


def served_sid_stage(rec: Recommender) -> dict[str, Any]:
    """:func:`evaluate_retrieval`'s arguments that make its SID path the one ``rec`` serves (mode, leaves, τ)."""
    return {"trie": rec.trie, "leaf_rows": rec.leaf_rows, "sid_mode": rec.served_sid_mode, "known": rec.known_leaves,
            "dense_temperature": trained_temperature(rec.run_config)}


def _sid_point(rec: Recommender, es: EvalSet, cfg: EvalConfig, ks: Sequence[int], beam_width: int,
               lam: float) -> dict[str, float]:
    """The served SID path at one beam width and λ (full-code beams: :func:`sid_pass`, diagnostics too)."""
    if rec.served_sid_mode == "full":
        return _pick(sid_pass(rec, es, beam_width=beam_width, diversity_lambda=lam, ks=ks, batch_size=cfg.batch_size))
    return _pick(evaluate_retrieval(rec.catalog_model, es, paths=("sid",), ks=ks, beam_width=beam_width,
                                    diversity_lambda=lam, context_len=rec.context_len, batch_size=cfg.batch_size,
                                    **served_sid_stage(rec))["sid"])


def run_sweeps(rec: Recommender, es: EvalSet, cfg: EvalConfig, ks: Sequence[int]) -> dict[str, list[dict[str, Any]]]:
    """λ sweep (SID path at the main beam width), beam sweep (SID at λ = cfg's), context sweep (ANN + SID); the
    SID path as served (``rec.served_sid_mode``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if rec.trie is not None:
        if cfg.sweep_lambda:
            out["lambda"] = [{"lambda": float(lam), "beam_width": cfg.beam_width,
                              **_sid_point(rec, es, cfg, ks, cfg.beam_width, float(lam))} for lam in cfg.sweep_lambda]
        if cfg.sweep_beam:
            out["beam"] = [{"beam_width": int(w), "lambda": cfg.diversity_lambda,
                            **_sid_point(rec, es, cfg, ks, int(w), cfg.diversity_lambda)} for w in cfg.sweep_beam]
    if cfg.sweep_context:
        out["context"] = []
        tpi = history_tokens_per_item(rec.config.layout, rec.config.sid_levels)
        want = tuple(p for p in ("ann", "sid") if (p == "ann" and rec.ann is not None) or
                     (p == "sid" and rec.trie is not None))
        for c in cfg.sweep_context:
            c = min(int(c), rec.context_len)
            res = evaluate_retrieval(rec.catalog_model, es, paths=want, ks=ks, beam_width=cfg.beam_width,
                                     diversity_lambda=cfg.diversity_lambda, context_len=c,
                                     batch_size=cfg.batch_size, **served_sid_stage(rec))
            out["context"].append({"context_len": c, "history_tokens": c * tpi,
                                   **{f"{p}/{k}": v for p, r in res.items() for k, v in r.items() if k != "n"}})
    return out


def _pick(m: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in m.items() if k != "n"}


def run_eval(workdir: str | Path, cfg: EvalConfig, *, rec: Recommender | None = None) -> tuple[dict[str, Any], dict[str, Path]]:
    """:func:`evaluate` + write ``WORKDIR/reports/eval-<split>-step<N>.{json,md}`` (+ PNG plots of any sweeps)."""
    from genrec.eval.report import write_report  # local: matplotlib, loaded only to write a report

    report = evaluate(workdir, cfg, rec=rec)
    folder = WorkDir(workdir).reports
    stem = f"eval-{cfg.split}-step{report['step']}"
    n = 2
    while (folder / f"{stem}.json").exists():  # an earlier report of the same step is kept, never overwritten
        stem = f"eval-{cfg.split}-step{report['step']}-{n}"
        n += 1
    files = write_report(report, folder, stem)
    return report, files
