import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.eval.metrics import auc, hit_at_k_slates, rank_in_list, rank_of_targets, topk_metrics


def test_topk_metrics_hand_computed():
    # ranks: 0 (top), 3, 12, not found
    m = topk_metrics(np.array([0, 3, 12, -1]), ks=(5, 10))
    assert m["recall@5"] == pytest.approx(2 / 4)
    assert m["recall@10"] == pytest.approx(2 / 4)
    assert m["ndcg@5"] == pytest.approx((1.0 + 1 / math.log2(5)) / 4)
    assert m["mrr"] == pytest.approx((1 + 1 / 4 + 1 / 13) / 4)


def test_rank_of_targets_chunked_matches_full_and_ties_are_pessimistic():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=(37, 50)).astype(np.float32)  # many ties
    targets = rng.integers(0, 50, size=37)
    full = np.array([(scores[i] >= scores[i, targets[i]]).sum() - 1 for i in range(37)])
    got = rank_of_targets(lambda idx: scores[idx], 37, targets, chunk=8)
    np.testing.assert_array_equal(got, full)
    const = rank_of_targets(lambda idx: np.zeros((len(idx), 50)), 37, targets, chunk=8)
    assert (const == 49).all()


def test_rank_in_list():
    r = rank_in_list(np.array([[5, 7, 9], [1, 2, 3]]), np.array([9, 4]))
    assert r.tolist() == [2, -1]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5, allow_nan=False), st.booleans()), min_size=2, max_size=40))
def test_auc_equals_pairwise_definition(pairs):
    s = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    got = auc(s, y)
    pos, neg = s[y], s[~y]
    if len(pos) == 0 or len(neg) == 0:
        assert math.isnan(got)
        return
    want = np.mean([(1.0 if a > b else 0.5 if a == b else 0.0) for a in pos for b in neg])
    assert got == pytest.approx(want)


def test_hit_at_3():
    s = [np.array([0.9, 0.1, 0.8, 0.7]), np.array([0.1, 0.2]), np.array([0.3, 0.2, 0.1, 0.0])]
    y = [np.array([1, 1, 0, 0]), np.array([0, 0]), np.array([0, 0, 0, 1])]
    # slate 1: top3 = {0,2,3}: 1 of 2 positives -> 1/2 ; slate 2 skipped ; slate 3: 0/1
    assert hit_at_k_slates(s, y, k=3) == pytest.approx((0.5 + 0.0) / 2)


def test_popularity_orders_by_train_count():
    from genrec.eval.baselines import Popularity

    pop = Popularity(np.array([10, 20, 30]), np.array([30, 30, 20, 30, 20, 10, 99]))
    assert pop.topk(3).tolist() == [30, 20, 10]
    assert pop.counts.tolist() == [1, 2, 3]
