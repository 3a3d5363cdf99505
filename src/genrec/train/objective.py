"""The joint objective: L = w_sid·L_sid + w_item·L_item + w_action·L_action on one forward.

* L_sid (PinGER): next-SID cross-entropy over every (history item × level) label of the
  interleaved layout (TIGER layout: over its all-SID token sequence).
* L_item (PinRec / UniPinRec eq. 1/3): the user vector at each dense position against the
  next item, sampled softmax over in-batch positives + uniformly sampled catalogue negatives,
  each corrected by its log sampling probability: in-batch candidates by a count-min sketch
  of item frequency (updated online with the batch's positives), uniform ones by log(M/N).
  ``item_loss="full"`` is full-softmax cross-entropy over the whole catalogue (the
  SASRec-CE baseline the issue measures genrec against).
* L_action (UniPinRec eq. 4, MAM): history actions are replaced by [MASK] with probability
  ``p_mask``; masked past positions and the feedview candidates (always masked) are scored
  by per-action BCE heads, two separately averaged terms.

Next-item and SID targets are restricted to items whose action is positive engagement
(``positive_actions`` of the dataset): a disliked movie is not a retrieval target.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from genrec.catalog import ItemCatalog
from genrec.errors import ConfigError
from genrec.model.genrec_model import GenRecModel, ModelBatch
from genrec.model.losses import action_loss_sums, sampled_softmax_loss
from genrec.model.sketch import CountMinSketch
from genrec.train.batches import TrainBatch
from genrec.train.distributed import global_sum, group_initialized
from genrec.train.dpo import dpo_loss, preference_pairs, sid_sequence_logprob
from genrec.validation import trusted_inputs


def logs_feedback(n_actions: int) -> bool:
    """Whether data that logs ``n_actions`` actions carries feedback beyond engagement (like / view / dislike, cart /
    buy): the one rule the ``*_feedback`` settings of the objective and the data follow."""
    return n_actions >= 2


@dataclass
class ObjectiveConfig:
    w_sid: float = 1.0
    w_item: float = 1.0
    w_action: float = 1.0
    # the action loss's weight where the data logs several actions (feedback beyond engagement: like / view /
    # dislike, cart / buy); None: w_action on any data. With one action the heads only learn "engaged or not",
    # which the next-item loss already trains (:meth:`for_actions`)
    w_action_feedback: float | None = None
    sid_label_smoothing: float = 0.0  # ε of the SID levels' cross-entropy (generative retrieval overfits early)
    p_mask: float = 0.2
    item_loss: str = "sampled"  # sampled | full
    n_negatives: int = 512
    n_inbatch: int = 1024  # in-batch positives reused as negatives per step
    temperature: float = 0.05
    action_weights: tuple[float, ...] | None = None  # w_c; default 1 per action
    engagement_dropout: float = 0.0  # train-time: zero an item's engagement vector with this probability,
    # so the item tower also learns to place items from content alone (cold start: new items have none)
    w_dpo: float = 0.0  # preference tuning (genrec train --stage dpo): DPO on SID sequences, genrec.train.dpo
    dpo_beta: float = 0.1  # DPO's beta: how far the policy may move from the frozen reference per unit of margin

    def for_actions(self, n_actions: int) -> "ObjectiveConfig":
        """This objective on data that logs ``n_actions`` actions: ``w_action_feedback`` in place of ``w_action``
        where there are two or more and the action loss is trained at all (``w_action`` > 0)."""
        if self.w_action_feedback is None or not logs_feedback(n_actions) or self.w_action == 0:
            return self
        return dataclasses.replace(self, w_action=self.w_action_feedback)

    def validate(self) -> None:
        if self.w_action_feedback is not None and not (math.isfinite(self.w_action_feedback)
                                                       and self.w_action_feedback >= 0):
            raise ConfigError(f"objective.w_action_feedback must be a finite number >= 0 or null, "
                              f"got {self.w_action_feedback}")
        if self.item_loss not in ("sampled", "full"):
            raise ConfigError(f"objective.item_loss must be 'sampled' or 'full', got {self.item_loss!r}")
        if not 0.0 <= self.p_mask < 1.0:
            raise ConfigError(f"objective.p_mask must be in [0, 1), got {self.p_mask}")
        if not 0.0 <= self.engagement_dropout < 1.0:
            raise ConfigError(f"objective.engagement_dropout must be in [0, 1), got {self.engagement_dropout}")
        if not 0.0 <= self.sid_label_smoothing < 1.0:
            raise ConfigError(f"objective.sid_label_smoothing must be in [0, 1), got {self.sid_label_smoothing}")
        if self.temperature <= 0:
            raise ConfigError(f"objective.temperature must be > 0, got {self.temperature}")
        if not (math.isfinite(self.w_dpo) and self.w_dpo >= 0):
            raise ConfigError(f"objective.w_dpo must be a finite number >= 0, got {self.w_dpo}")
        if not (math.isfinite(self.dpo_beta) and self.dpo_beta > 0):
            raise ConfigError(f"objective.dpo_beta must be a finite number > 0, got {self.dpo_beta}")


class JointObjective(nn.Module):
    """Wraps a :class:`GenRecModel` with the catalogue tensors; ``training_step`` returns the loss terms."""

    feats: torch.Tensor  # [N, F] buffer
    item_ids: torch.Tensor  # [N] buffer
    codes: torch.Tensor  # [N, L] buffer
    pos_action: torch.Tensor  # [C] buffer
    action_w: torch.Tensor  # [C] buffer

    def __init__(self, model: GenRecModel, catalog: ItemCatalog, cfg: ObjectiveConfig,
                 positive_actions: list[int], sketch_seed: int = 0) -> None:
        super().__init__()
        cfg.validate()
        self.model = model
        self.cfg = cfg
        self.register_buffer("feats", catalog.feats.float(), persistent=False)  # [N, F]
        self.register_buffer("item_ids", torch.from_numpy(np.asarray(catalog.item_ids, dtype=np.int64)),
                             persistent=False)  # [N]
        codes = catalog.codes if catalog.codes is not None else torch.zeros(len(catalog), 0, dtype=torch.long)
        self.register_buffer("codes", codes.long(), persistent=False)  # [N, L]
        pos = torch.zeros(model.config.n_actions, dtype=torch.bool)
        pos[positive_actions] = True
        self.register_buffer("pos_action", pos, persistent=False)  # [C]
        C = model.config.n_actions
        w = cfg.action_weights if cfg.action_weights is not None else (1.0,) * C
        if len(w) != C:
            raise ConfigError(f"objective.action_weights needs {C} values, got {len(w)}")
        self.register_buffer("action_w", torch.tensor(w, dtype=torch.float32), persistent=False)
        self.sketch = CountMinSketch.from_error(1e-4, 1e-3, seed=sketch_seed)
        self.n_engagement = int(catalog.n_engagement)
        # the sketch moves to the model's device on first use; its counts travel in the state dict (exact resume)
        self._register_state_dict_hook(_save_sketch)
        self._register_load_state_dict_pre_hook(_load_sketch, with_module=True)
        self.__dict__["_reference"] = None  # DPO's frozen model: not a submodule, so never in the state dict

    def set_reference(self, reference: GenRecModel) -> None:
        """Freeze ``reference`` (a copy of the model the DPO stage starts from) as DPO's reference policy."""
        reference.eval().requires_grad_(False)
        self.__dict__["_reference"] = reference

    def _appended(self, b: TrainBatch, idx: torch.Tensor, rows: torch.Tensor) -> TrainBatch:
        """Rows ``idx`` of ``b`` (histories cut at their request) with catalogue row ``rows[j]`` appended as
        the next item: engaged with the first positive action, on the request's surface, at its time."""
        n = b.rows.shape[1] + 1
        L = b.lengths[idx]  # [P]
        ar = torch.arange(idx.shape[0], device=idx.device)

        def grow(t: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(idx.shape[0], n, dtype=t.dtype, device=t.device)
            out[:, :n - 1] = t[idx]
            out[ar, L] = last.to(t.dtype)
            return out

        act = torch.full_like(L, int(self.pos_action.nonzero()[0, 0]))
        surf = b.cand_surface[idx] if b.cand_surface is not None else torch.zeros_like(L)
        ts = b.request_ts[idx] if b.request_ts is not None else b.timestamps[idx, (L - 1).clamp(min=0)]
        return TrainBatch(grow(b.rows, rows), grow(b.actions, act), grow(b.surfaces, surf), grow(b.timestamps, ts),
                          L + 1, None, None, None, None, None)

    def _dpo_logprob(self, model: GenRecModel, tb: TrainBatch) -> torch.Tensor:
        mb, _ = self.model_batch(tb, mask_actions=False)
        mb.pos_lengths = (tb.lengths - 1).clamp(min=1)  # the appended item is the target (as in training)
        with trusted_inputs():
            return sid_sequence_logprob(model, mb, self.codes[tb.rows.gather(1, (tb.lengths - 1)[:, None])[:, 0]])

    def dpo_terms(self, b: TrainBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """DPO on the batch's slates (:mod:`genrec.train.dpo`) as sums over this process's pairs -- ``dpo`` (the
        loss), ``dpo_acc`` (pairs whose implicit reward orders them right) -- and the number of pairs."""
        ref = self.__dict__["_reference"]
        if ref is None:
            raise ConfigError("objective.w_dpo > 0 needs a reference model: train with `--stage dpo` and init_from")
        zero = self.feats.new_zeros((), dtype=torch.float32)
        if b.cand_rows is None or b.cand_labels is None or b.cand_valid is None:
            return {"dpo": zero, "dpo_acc": zero}, zero
        salt = b.rows[:, 0] * 7919 + b.lengths  # the request: its history's first item and length
        idx, win, lose = preference_pairs(b.cand_rows, b.cand_labels, b.cand_valid, self.pos_action,
                                          ~self.pos_action, salt)
        if idx.numel() == 0:
            return {"dpo": zero, "dpo_acc": zero}, zero
        tw, tl = self._appended(b, idx, win), self._appended(b, idx, lose)
        if next(ref.parameters()).device != self.feats.device:
            ref.to(self.feats.device)
        was_training = self.model.training
        self.model.eval()  # no dropout: policy and reference agree exactly at the start
        try:
            pi_w, pi_l = self._dpo_logprob(self.model, tw), self._dpo_logprob(self.model, tl)
        finally:
            self.model.train(was_training)
        with torch.no_grad():
            ref_w, ref_l = self._dpo_logprob(ref, tw), self._dpo_logprob(ref, tl)
        loss, right = dpo_loss(pi_w, pi_l, ref_w, ref_l, self.cfg.dpo_beta)
        return {"dpo": loss.sum(), "dpo_acc": right.sum()}, zero + idx.numel()

    def item_feats(self, rows: torch.Tensor) -> torch.Tensor:
        """Features of catalogue ``rows`` (any shape) -> ``[..., F]``, with engagement dropout in training."""
        f = self.feats[rows]
        p = self.cfg.engagement_dropout
        if p > 0 and self.n_engagement > 0 and self.model.training:
            drop = torch.rand(rows.shape, device=f.device) < p  # [...]
            keep = torch.ones_like(f)
            keep[..., -self.n_engagement:] = (~drop)[..., None].to(f.dtype)
            f = f * keep
        return f

    def catalogue_vectors(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Item vectors of catalogue rows ``start:stop`` (features + ID vectors): ``[rows, item_dim]``."""
        return self.model.item_vectors(self.feats[start:stop], self.item_ids[start:stop])

    def model_batch(self, b: TrainBatch, *, mask_actions: bool) -> tuple[ModelBatch, torch.Tensor]:
        cfg = self.model.config
        n = b.rows.shape[1]
        valid = torch.arange(n, device=b.rows.device)[None, :] < b.lengths[:, None]  # [B, n]
        amask = (torch.rand(b.rows.shape, device=b.rows.device) < self.cfg.p_mask) & valid if mask_actions \
            else torch.zeros_like(valid)
        cand_rows = b.cand_rows
        has_c = cand_rows is not None
        mb = ModelBatch(
            actions=b.actions, surfaces=b.surfaces, lengths=b.lengths,
            sid_codes=self.codes[b.rows] if cfg.uses_sids else None,
            item_feats=self.item_feats(b.rows), action_mask=amask, item_ids=self.item_ids[b.rows],
            cand_feats=self.item_feats(cand_rows) if cand_rows is not None else None,
            cand_ids=self.item_ids[cand_rows] if cand_rows is not None else None,
            cand_sid_codes=self.codes[cand_rows] if cand_rows is not None and cfg.uses_sids else None,
            cand_surface=b.cand_surface if has_c else None,
            timestamps=b.timestamps, request_ts=b.request_ts if has_c else None,
        )
        return mb, valid

    def check_batch(self, b: TrainBatch) -> int:
        """Range-check every index of the batch with ONE device->host sync (the model's own checks
        cost one each, ~30 per step) and return the number of valid history items. Errors name
        the field."""
        mcfg = self.model.config
        n_rows = int(self.feats.shape[0])
        fields: list[tuple[str, torch.Tensor | None, int]] = [
            ("rows", b.rows, n_rows), ("actions", b.actions, mcfg.n_actions + 1),
            ("surfaces", b.surfaces, mcfg.n_surfaces), ("lengths", b.lengths, b.rows.shape[1] + 1),
            ("cand_rows", b.cand_rows, n_rows), ("cand_surface", b.cand_surface, mcfg.n_surfaces)]
        present = [(name, t, hi) for name, t, hi in fields if t is not None and t.numel()]
        stats = torch.stack([x for _, t, _ in present for x in (t.min(), t.max())]
                            + [b.lengths.sum()]).tolist()  # the one sync
        for i, (name, _, hi) in enumerate(present):
            lo_v, hi_v = stats[2 * i], stats[2 * i + 1]
            if lo_v < 0 or hi_v >= hi:
                raise ValueError(f"batch.{name}: values must lie in [0, {hi}), got min {lo_v}, max {hi_v}")
        return int(stats[-1])

    def training_step(self, b: TrainBatch) -> dict[str, Any]:
        cfg, mcfg = self.cfg, self.model.config
        n_items = self.check_batch(b)
        mb, valid = self.model_batch(b, mask_actions=cfg.w_action > 0 and mcfg.layout != "tiger")
        if mcfg.positions == "end":
            # a training row without a slate ends on its last target: positions count back from that item, so
            # the item predicting it sits where serving's newest history item does (SASRec: s[:-1] -> s[1:]);
            # a row cut at a feedview keeps serving's positions (its candidates sit where serving's do)
            slate = b.cand_valid.any(1) if b.cand_valid is not None else torch.zeros_like(b.lengths, dtype=torch.bool)
            mb.pos_lengths = torch.where(slate, b.lengths, (b.lengths - 1).clamp(min=1))
        with trusted_inputs():  # checked above in one sync; codes and ids come from the catalogue
            out = self.model(mb)
        positive = self.pos_action[b.actions] & valid  # [B, n]
        # every term as a sum over this process's rows and a count of its targets; the means divide by the
        # counts over the whole global batch (every torchrun process's share), so that the processes' losses
        # add up to the one-process loss of that batch -- not a mean of per-process means
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, torch.Tensor] = {}
        levels: list[str] = []
        has_sid = cfg.w_sid > 0 and out.sid_logits is not None
        if has_sid:
            # CE over (position, level) pairs that are valid and positive, by weights rather than boolean
            # selection: selecting rows costs a device->host sync per level
            tgt = self.codes[b.rows]  # [B, n, L]
            for lvl, (lg, ok) in enumerate(zip(out.sid_logits, out.sid_valid or [])):
                w = (ok & positive).float()  # [B, n]
                ce = F.cross_entropy(lg.float().flatten(0, 1), tgt[..., lvl].flatten(), reduction="none",
                                     label_smoothing=cfg.sid_label_smoothing)  # [B*n]
                # each level's own CE is logged (not optimised separately): which level is hard to predict
                levels.append(f"sid_l{lvl + 1}")
                sums[levels[-1]], counts[levels[-1]] = torch.where(w.flatten() > 0, ce, 0.0).sum(), w.sum()
        if cfg.w_item > 0 and out.user_vecs is not None:
            # position i predicts item i+1 (when i+1 is a positive, valid item)
            nxt = torch.zeros_like(positive)
            nxt[:, :-1] = positive[:, 1:]
            users = out.user_vecs[nxt]  # [P, D]
            pos_rows = b.rows[:, 1:][nxt[:, :-1]]  # [P]
            sums["item"] = self._item_loss_sum(users, pos_rows)
            counts["item"] = users.new_full((), float(users.shape[0]), dtype=torch.float32)
        if cfg.w_action > 0 and out.action_logits is not None:
            C = mcfg.n_actions
            assert mb.action_mask is not None  # model_batch always sets it
            m_past = mb.action_mask & valid  # [B, n]
            lab_past = F.one_hot(b.actions.clamp(max=C - 1), C).float()
            # masks instead of row selection (a boolean index costs a device->host sync)
            mc: torch.Tensor | None
            if out.cand_action_logits is not None and b.cand_valid is not None and b.cand_labels is not None:
                lc, yc, mc = out.cand_action_logits.flatten(0, 1), b.cand_labels.flatten(0, 1), b.cand_valid.flatten()
            else:
                lc = out.action_logits.new_zeros(0, C)
                yc, mc = lc, None
            sums["action_past"], counts["action_past"], sums["action_cand"], counts["action_cand"] = action_loss_sums(
                out.action_logits.flatten(0, 1).float(), lab_past.flatten(0, 1), m_past.flatten(), lc.float(), yc, mc,
                self.action_w)
        if cfg.w_dpo > 0:
            dpo_sums, dpo_count = self.dpo_terms(b)
            sums.update(dpo_sums)
            counts.update({k: dpo_count for k in dpo_sums})
        glob, n_global = _global_counts(counts, n_items, out.hidden.device)
        means = {k: v / glob[k].clamp(min=1.0) for k, v in sums.items()}
        terms: dict[str, Any] = {}
        total = out.hidden.new_zeros((), dtype=torch.float32)
        if has_sid:
            terms.update({k: means[k].detach() for k in levels})
            zero = total.new_zeros(())
            terms["sid"] = sum((sums[k] for k in levels), zero) / sum((glob[k] for k in levels), zero).clamp(min=1.0)
            total = total + cfg.w_sid * terms["sid"]
        if "item" in sums:
            terms["item"] = means["item"]
            total = total + cfg.w_item * terms["item"]
        if "action_past" in sums:  # eq. 4: per head, the past mean plus the candidates' mean
            terms["action"] = (means["action_past"] + means["action_cand"]).sum()
            total = total + cfg.w_action * terms["action"]
        if "dpo" in sums:  # DPO's mean over every process's pairs; the share of pairs it orders right, logged
            terms["dpo"], terms["dpo_acc"] = means["dpo"], means["dpo_acc"].detach()
            total = total + cfg.w_dpo * terms["dpo"]
        return {"loss": total, **terms, "n_items": n_items, "n_items_global": n_global,
                "n_tokens": n_items * out.layout.tokens_per_item}

    def _item_loss_sum(self, users: torch.Tensor, pos_rows: torch.Tensor) -> torch.Tensor:
        """The next-item loss summed over the ``P`` targets (the caller divides by the count)."""
        cfg = self.cfg
        N = self.feats.shape[0]
        if cfg.item_loss == "full":
            if users.shape[0] == 0:
                return users.sum() * 0.0
            all_vecs = self.catalogue_vectors()  # [N, D]
            logits = users.float() @ all_vecs.float().T / cfg.temperature  # [P, N]
            return F.cross_entropy(logits, pos_rows, reduction="sum")
        if self.sketch.device != pos_rows.device:  # the sketch follows the model (no host round trip)
            self.sketch.to(pos_rows.device)
        ids = pos_rows.detach()
        # every rank counts the global batch: a collective, so a rank without targets takes part too
        self.sketch.add(_gather_ids(ids))
        P = pos_rows.numel()
        if P == 0:
            return users.sum() * 0.0
        pos_vecs = self.model.item_vectors(self.item_feats(pos_rows), self.item_ids[pos_rows])  # [P, D]
        # in-batch negatives: other rows' positives, at most n_inbatch of them (a P x P logit
        # matrix over every history position would dominate the step); an item shows up there
        # with probability ~ its frequency, hence the count-min logQ correction. Under torchrun they are
        # this process's rows' positives, and each process draws its own uniform negatives
        n_ib = min(cfg.n_inbatch, P)
        ib = torch.randperm(P, device=pos_rows.device)[:n_ib]
        log_q_ib = self.sketch.log_q(ids[ib], n_sampled=P).to(users.device, torch.float32)
        # uniform catalogue negatives: probability M/N each
        M = min(cfg.n_negatives, N)
        uni = torch.randint(0, N, (M,), device=pos_rows.device)
        neg_rows = torch.cat([pos_rows[ib], uni])
        neg_vecs = torch.cat([pos_vecs[ib], self.model.item_vectors(self.item_feats(uni), self.item_ids[uni])])
        log_q_neg = torch.cat([log_q_ib, torch.full((M,), math.log(M / N), device=users.device)])
        log_q_pos = self.sketch.log_q(ids, n_sampled=P).to(users.device, torch.float32)
        return sampled_softmax_loss(users.float(), pos_vecs.float(), pos_rows, neg_vecs.float(), neg_rows,
                                    log_q_pos, log_q_neg, cfg.temperature, in_batch_negatives=False, reduction="sum")


def _global_counts(counts: dict[str, torch.Tensor], n_items: int,
                   device: torch.device) -> tuple[dict[str, torch.Tensor], float]:
    """Every count summed over the torchrun processes, and the global batch's history items (one all-reduce of
    them all); the counts as they are, and ``n_items``, in a single process (no collective, no host sync)."""
    if not group_initialized():
        return {k: v.float() for k, v in counts.items()}, float(n_items)
    keys = list(counts)
    flat = torch.cat([counts[k].reshape(-1).double() for k in keys]
                     + [torch.tensor([float(n_items)], dtype=torch.float64, device=device)])
    tot = global_sum(flat)
    out, i = {}, 0
    for k in keys:
        n = counts[k].numel()
        out[k] = tot[i:i + n].reshape(counts[k].shape).float()
        i += n
    return out, float(tot[-1])


def _gather_ids(ids: torch.Tensor) -> torch.Tensor:
    """All ranks' ids (variable lengths) under DDP, so each rank's frequency sketch is the same."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ids
    ws = dist.get_world_size()
    n = torch.tensor([ids.numel()], device=ids.device, dtype=torch.long)
    sizes = [torch.zeros_like(n) for _ in range(ws)]
    dist.all_gather(sizes, n)
    m = max(int(x) for x in sizes)
    pad = torch.full((m,), -1, dtype=ids.dtype, device=ids.device)
    pad[: ids.numel()] = ids
    out = [torch.empty_like(pad) for _ in range(ws)]
    dist.all_gather(out, pad)
    return torch.cat([o[: int(x)] for o, x in zip(out, sizes)])


def _save_sketch(module: JointObjective, state: dict, prefix: str, _meta: object) -> None:
    state[prefix + "sketch.table"] = module.sketch.table.detach().cpu().clone()
    state[prefix + "sketch.total"] = module.sketch._total.detach().cpu().clone()


def _load_sketch(module: JointObjective, state: dict, prefix: str, *_args: object) -> None:
    if prefix + "sketch.table" in state:
        module.sketch.table.copy_(state.pop(prefix + "sketch.table"))
        module.sketch._total = state.pop(prefix + "sketch.total").to(module.sketch.device, torch.float64).reshape(())
