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
    assert m["mrr"] == pytest.approx((1 + 1 / 4) / 4)  # truncated at the largest K (10): rank 12 counts 0
    assert topk_metrics(np.array([0, 3, 12, -1]), ks=(5, 20))["mrr"] == pytest.approx((1 + 1 / 4 + 1 / 13) / 4)


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


def test_hit_at_3_ties_count_against_positives_and_chance_is_exact():
    from genrec.eval.ranking import hit_chance

    # a constant scorer: every slate's positives sit first, but ties rank negatives first -> no hit
    y = [np.array([1, 0, 0, 0, 0, 0]), np.array([1, 1, 0, 0, 0, 0, 0, 0])]
    assert hit_at_k_slates([np.zeros(6), np.zeros(8)], y, k=3) == 0.0
    # chance: min(k, n) * P / n / min(k, P), against the mean over every ordering (exhaustive)
    import itertools

    for lab in (np.array([1, 0, 0, 0, 0]), np.array([1, 1, 0, 0]), np.array([1, 0]), np.array([1, 1, 1, 0, 0])):
        perms = [np.array(p, dtype=float) for p in itertools.permutations(range(len(lab)))]
        exact = np.mean([hit_at_k_slates([p], [lab], 3) for p in perms])
        assert hit_chance([lab], 3) == pytest.approx(exact)
    assert np.isnan(hit_chance([np.array([0, 0])], 3))


def test_sample_negatives_distinct_excluded_and_repeatable():
    from genrec.eval.ranking import sample_negatives

    ex = np.array([3, 5, 7, 7])
    a = sample_negatives(50, ex, 10, user_id=-12, request_seq=4, seed=1)
    assert len(a) == 10 and len(set(a.tolist())) == 10 and not set(a.tolist()) & {3, 5, 7}
    assert (a >= 0).all() and (a < 50).all()
    np.testing.assert_array_equal(a, sample_negatives(50, ex, 10, user_id=-12, request_seq=4, seed=1))
    assert not np.array_equal(a, sample_negatives(50, ex, 10, user_id=-12, request_seq=5, seed=1))
    assert sorted(sample_negatives(8, ex, 10, user_id=1, request_seq=0).tolist()) == [0, 1, 2, 4, 6]  # the rest


def test_popularity_orders_by_train_count():
    from genrec.eval.baselines import Popularity

    pop = Popularity(np.array([10, 20, 30]), np.array([30, 30, 20, 30, 20, 10, 99]))
    assert pop.topk(3).tolist() == [30, 20, 10]
    assert pop.counts.tolist() == [1, 2, 3]
