"""Losses against hand-computed numbers (math/numpy) and slow loop twins."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import ConfigError
from genrec.model.losses import JointLossWeights, action_loss, action_loss_sums, sampled_softmax_loss, sid_loss


def t(x, dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------------------- sampled softmax

def slow_sampled_softmax(u, v, pid, n, nid, lqp, lqn, temp, hits=True, in_batch=True) -> float:
    """Eq. 1 written out with Python loops."""
    lam = 1.0 / temp
    total = 0.0
    P = len(u)
    for p in range(P):
        s_pos = lam * float(np.dot(u[p], v[p])) - lqp[p]
        scores = [s_pos]
        if in_batch:
            for q in range(P):
                if q != p and not (hits and pid[q] == pid[p]):
                    scores.append(lam * float(np.dot(u[p], v[q])) - lqp[q])
        for j in range(len(n)):
            if not (hits and nid[j] == pid[p]):
                scores.append(lam * float(np.dot(u[p], n[j])) - lqn[j])
        total += -s_pos + math.log(sum(math.exp(s) for s in scores))
    return total / P


def test_sampled_softmax_hand_value() -> None:
    u = t([[1.0, 0.0], [0.0, 1.0]])
    v = t([[1.0, 0.0], [0.0, 1.0]])
    neg = t([[1.0, 1.0]])
    pid, nid = torch.tensor([10, 20]), torch.tensor([10])
    zp, zn = torch.zeros(2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    # row 0: pos 1, in-batch 0, negative id 10 == own positive -> masked: log(1 + e^-1)
    # row 1: pos 1, in-batch 0, negative score 1:                 log(2 + e^-1)
    expected = (math.log(1 + math.exp(-1)) + math.log(2 + math.exp(-1))) / 2
    got = sampled_softmax_loss(u, v, pid, neg, nid, zp, zn, 1.0)
    assert got.item() == pytest.approx(expected, abs=1e-12)
    # without hit removal, row 0 also counts the hit: log(2 + e^-1)
    got2 = sampled_softmax_loss(u, v, pid, neg, nid, zp, zn, 1.0, remove_accidental_hits=False)
    assert got2.item() == pytest.approx(math.log(2 + math.exp(-1)), abs=1e-12)
    # temperature 0.5 doubles every dot product (lambda = 2)
    exp3 = (math.log(1 + math.exp(-2)) + math.log(2 + math.exp(-2))) / 2
    assert sampled_softmax_loss(u, v, pid, neg, nid, zp, zn, 0.5).item() == pytest.approx(exp3, abs=1e-12)


def test_duplicate_positives_are_accidental_hits() -> None:
    u = t([[0.3, -0.2], [0.1, 0.9]])
    v = t([[1.0, 2.0], [1.0, 2.0]])
    pid = torch.tensor([5, 5])
    empty = torch.zeros(0, 2, dtype=torch.float64)
    z = torch.zeros(2, dtype=torch.float64)
    loss = sampled_softmax_loss(u, v, pid, empty, torch.zeros(0, dtype=torch.long), z, torch.zeros(0), 1.0)
    assert loss.item() == pytest.approx(0.0, abs=1e-12)  # only the positive remains in each row


@settings(max_examples=25, deadline=None)
@given(P=st.integers(1, 5), M=st.integers(0, 4), D=st.integers(1, 4), seed=st.integers(0, 10_000),
       temp=st.floats(0.05, 2.0), hits=st.booleans(), in_batch=st.booleans())
def test_sampled_softmax_matches_loop_twin(P, M, D, seed, temp, hits, in_batch) -> None:
    rng = np.random.default_rng(seed)
    u, v, n = rng.normal(size=(P, D)), rng.normal(size=(P, D)), rng.normal(size=(M, D))
    pid, nid = rng.integers(0, 4, size=P), rng.integers(0, 4, size=M)  # small id space -> many hits
    lqp, lqn = np.log(rng.uniform(0.01, 1, size=P)), np.log(rng.uniform(0.01, 1, size=M))
    got = sampled_softmax_loss(t(u), t(v), torch.tensor(pid), t(n).reshape(M, D), torch.tensor(nid),
                               t(lqp), t(lqn), temp, remove_accidental_hits=hits, in_batch_negatives=in_batch)
    assert got.item() == pytest.approx(slow_sampled_softmax(u, v, pid, n, nid, lqp, lqn, temp, hits, in_batch),
                                       rel=1e-9, abs=1e-9)


def test_full_catalogue_negatives_equal_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    items = torch.randn(7, 3, generator=g, dtype=torch.float64)
    u = torch.randn(4, 3, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 3, 3, 6])
    got = sampled_softmax_loss(u, items[target], target, items, torch.arange(7),
                               torch.zeros(4, dtype=torch.float64), torch.zeros(7, dtype=torch.float64),
                               0.2, in_batch_negatives=False)
    ref = F.cross_entropy(u @ items.T / 0.2, target)
    assert got.item() == pytest.approx(ref.item(), rel=1e-12)


def test_gradient_flows_and_logq_down_weights_frequent_negatives() -> None:
    u = t([[0.5, -0.5]]).requires_grad_()
    v = t([[1.0, 0.0]]).requires_grad_()
    negs = t([[0.0, 1.0], [0.0, 1.0]]).requires_grad_()  # identical vectors
    q_freq, q_rare = 0.5, 0.005
    loss = sampled_softmax_loss(u, v, torch.tensor([0]), negs, torch.tensor([1, 2]),
                                t([math.log(0.1)]), t([math.log(q_freq), math.log(q_rare)]), 1.0)
    loss.backward()
    for g in (u.grad, v.grad, negs.grad):
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    # softmax mass on a negative ∝ exp(s)/Q: the frequent one is pushed down Q_f/Q_r times less
    ratio = negs.grad[0].norm() / negs.grad[1].norm()
    assert ratio.item() == pytest.approx(q_rare / q_freq, rel=1e-9)
    # and removing the correction gives both the same push
    negs2 = negs.detach().clone().requires_grad_()
    sampled_softmax_loss(u.detach(), v.detach(), torch.tensor([0]), negs2, torch.tensor([1, 2]),
                         t([0.0]), t([0.0, 0.0]), 1.0).backward()
    assert negs2.grad[0].norm().item() == pytest.approx(negs2.grad[1].norm().item())


def test_sampled_softmax_shape_errors() -> None:
    z = torch.zeros(2)
    with pytest.raises(ValueError, match="pos_item_vecs"):
        sampled_softmax_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, dtype=torch.long),
                             torch.zeros(1, 3), torch.zeros(1, dtype=torch.long), z, torch.zeros(1), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        sampled_softmax_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, dtype=torch.long),
                             torch.zeros(1, 3), torch.zeros(1, dtype=torch.long), z, torch.zeros(1), 0.0)


# ---------------------------------------------------------------------------- SID

def test_sid_loss_hand_value_and_mask() -> None:
    lvl0 = t([[0.0, math.log(3.0)], [5.0, -5.0]])  # row 0 target 1: p = 3/4
    lvl1 = t([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])  # row 0 target 2: p = 1/3 (vocab differs per level)
    targets = torch.tensor([[1, 2], [0, -1]])  # row 1 level 1 is padding (-1, out of range)
    mask = torch.tensor([[True, True], [True, False]])
    row1_l0 = -math.log(math.exp(5) / (math.exp(5) + math.exp(-5)))
    expected = (math.log(4 / 3) + math.log(3) + row1_l0) / 3
    assert sid_loss([lvl0, lvl1], targets, mask).item() == pytest.approx(expected, abs=1e-12)
    # a [N] mask drops whole rows
    assert sid_loss([lvl0, lvl1], targets.clamp_min(0), torch.tensor([True, False])).item() == pytest.approx(
        (math.log(4 / 3) + math.log(3)) / 2, abs=1e-12)
    # the stacked [N, L, V] form gives the same as the list form
    stacked = torch.stack([t([[0.0, 1.0, 2.0], [0.5, 0.0, 0.0]]), t([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]])], 1)
    tg = torch.tensor([[2, 0], [1, 2]])
    assert sid_loss(stacked, tg).item() == pytest.approx(sid_loss(list(stacked.unbind(1)), tg).item())
    assert sid_loss([lvl0, lvl1], targets, torch.zeros(2, 2, dtype=torch.bool)).item() == 0.0
    with pytest.raises(ValueError, match="out of range"):
        sid_loss([lvl0, lvl1], torch.tensor([[1, 3], [0, 0]]))
    with pytest.raises(ValueError, match="levels"):
        sid_loss([lvl0], targets)


# ---------------------------------------------------------------------------- action (eq. 4)

def bce(z: float, y: float) -> float:
    s = 1 / (1 + math.exp(-z))
    return -(y * math.log(s) + (1 - y) * math.log(1 - s))


def test_action_loss_eq4_hand_value() -> None:
    lp = [[0.5, -1.0], [2.0, 0.0], [-0.3, 0.7]]
    yp = [[1, 0], [0, 1], [1, 1]]
    mp = [True, False, True]  # M_past = {0, 2}
    lc = [[1.5, -0.5], [0.0, 3.0]]
    yc = [[1, 0], [0, 1]]
    w = [2.0, 0.5]
    expected = 0.0
    for c in range(2):
        past = (bce(lp[0][c], yp[0][c]) + bce(lp[2][c], yp[2][c])) / 2
        cand = (bce(lc[0][c], yc[0][c]) + bce(lc[1][c], yc[1][c])) / 2
        expected += w[c] * (past + cand)
    got = action_loss(t(lp), t(yp), torch.tensor(mp), t(lc), t(yc), None, t(w))
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # with unequal |M_past| and k, two separately averaged terms differ from one pooled average
    lc3 = lc + [[0.2, 0.2]]
    yc3 = yc + [[0, 0]]
    got3 = action_loss(t(lp), t(yp), torch.tensor(mp), t(lc3), t(yc3), torch.tensor([True, True, True]), t(w))
    exp3 = sum(w[c] * ((bce(lp[0][c], yp[0][c]) + bce(lp[2][c], yp[2][c])) / 2
                       + sum(bce(lc3[j][c], yc3[j][c]) for j in range(3)) / 3) for c in range(2))
    assert got3.item() == pytest.approx(exp3, abs=1e-6)
    pooled3 = sum(w[c] * 2 * (bce(lp[0][c], yp[0][c]) + bce(lp[2][c], yp[2][c])
                              + sum(bce(lc3[j][c], yc3[j][c]) for j in range(3))) / 5 for c in range(2))
    assert abs(got3.item() - pooled3) > 1e-3


def test_action_loss_empty_sets_and_per_head_mask() -> None:
    lp, yp = torch.zeros(2, 2), torch.zeros(2, 2)
    lc, yc = t([[0.0, 1.0]]), t([[1.0, 1.0]])
    got = action_loss(lp, yp, torch.zeros(2, dtype=torch.bool), lc, yc, None, [1.0, 1.0])
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(bce(0.0, 1) + bce(1.0, 1), abs=1e-6)
    # per-head mask [P, C]: head 0 uses row 0 only, head 1 uses rows 0 and 1
    lp2 = t([[1.0, -1.0], [3.0, 2.0]])
    yp2 = t([[0.0, 1.0], [1.0, 0.0]])
    m2 = torch.tensor([[True, True], [False, True]])
    empty = torch.zeros(0, 2)
    got2 = action_loss(lp2, yp2, m2, empty, empty, None, [1.0, 3.0])
    assert got2.item() == pytest.approx(bce(1.0, 0) + 3 * (bce(-1.0, 1) + bce(2.0, 0)) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="weights"):
        action_loss(lp, yp, None, lc, yc, None, [1.0])


@settings(deadline=None, max_examples=30)
@given(rows=st.integers(0, 9), cands=st.integers(0, 9), cut_p=st.integers(0, 9), cut_c=st.integers(0, 9),
       seed=st.integers(0, 10_000))
def test_action_loss_sums_split_over_processes_add_up_to_the_whole(rows: int, cands: int, cut_p: int, cut_c: int,
                                                                   seed: int) -> None:
    """The rows split between two processes (torchrun): each one's sums divided by the counts of both add up to
    the whole batch's eq. 4 -- unlike the mean of the two processes' own losses when their counts differ."""
    g = torch.Generator().manual_seed(seed)
    C = 3
    lp, yp = torch.randn(rows, C, generator=g, dtype=torch.float64), (torch.rand(rows, C, generator=g) > 0.5).double()
    mp = torch.rand(rows, generator=g) > 0.4
    lc, yc = torch.randn(cands, C, generator=g, dtype=torch.float64), (torch.rand(cands, C, generator=g) > 0.5).double()
    mc = torch.rand(cands, generator=g) > 0.3
    w = [1.0, 0.5, 2.0]
    a, b = min(cut_p, rows), min(cut_c, cands)
    parts = [action_loss_sums(lp[:a], yp[:a], mp[:a], lc[:b], yc[:b], mc[:b], w),
             action_loss_sums(lp[a:], yp[a:], mp[a:], lc[b:], yc[b:], mc[b:], w)]
    past_n, cand_n = sum(p[1] for p in parts), sum(p[3] for p in parts)
    shares = [((ps / past_n.clamp_min(1)) + (cs / cand_n.clamp_min(1))).sum() for ps, _, cs, _ in parts]
    whole = action_loss(lp, yp, mp, lc, yc, mc, w)
    assert (shares[0] + shares[1]).item() == pytest.approx(whole.item(), abs=1e-12)


def test_sampled_softmax_sum_reduction() -> None:
    g = torch.Generator().manual_seed(0)
    u, v, n = (torch.randn(k, 4, generator=g, dtype=torch.float64) for k in (5, 5, 7))
    args = (u, v, torch.arange(5), n, torch.arange(10, 17), torch.zeros(5, dtype=torch.float64),
            torch.zeros(7, dtype=torch.float64), 0.5)
    assert sampled_softmax_loss(*args, reduction="sum").item() == pytest.approx(
        5 * sampled_softmax_loss(*args).item(), rel=1e-12)
    with pytest.raises(ValueError, match="reduction"):
        sampled_softmax_loss(*args, reduction="none")


def test_action_loss_gradient_only_through_selected_rows() -> None:
    lp = torch.randn(4, 3, requires_grad=True)
    lc = torch.randn(2, 3, requires_grad=True)
    action_loss(lp, torch.ones(4, 3), torch.tensor([True, False, True, False]), lc, torch.zeros(2, 3),
                None, torch.ones(3)).backward()
    assert lp.grad[[1, 3]].abs().sum() == 0 and lp.grad[[0, 2]].abs().sum() > 0
    assert lc.grad.abs().sum() > 0


def test_joint_weights() -> None:
    w = JointLossWeights(sid=0.5, item=2.0, action=0.0)
    got = w.combine({"sid": torch.tensor(2.0), "item": torch.tensor(3.0), "action": torch.tensor(100.0)})
    assert got.item() == pytest.approx(0.5 * 2 + 2 * 3)
    assert w.combine({"item": torch.tensor(1.0)}).item() == 2.0
    with pytest.raises(KeyError, match="unknown"):
        w.combine({"items": torch.tensor(1.0)})
    with pytest.raises(ConfigError, match="sid"):
        JointLossWeights(sid=-1.0)
