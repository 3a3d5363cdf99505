"""Batches from joined records: no slate item leaks into the history its candidates see,
sampled impression-only candidates carry no label, and batches are a pure function of
(seed, step) (what exact resume relies on)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.catalog import ItemCatalog
from genrec.data.join import Feedview, UserExample
from genrec.errors import DataError
from genrec.train.batches import BatchStream, materialise, neighbour_table


def _catalog(n: int = 1000) -> ItemCatalog:
    return ItemCatalog(item_ids=np.arange(100, 100 + n, dtype=np.int64), feats=torch.randn(n, 4), codes=None)


def _user(uid: int, rng: np.random.Generator, n_items: int = 50) -> UserExample:
    n = int(rng.integers(3, 30))
    items = 100 + uid * n_items + rng.integers(0, n_items, n)  # disjoint per user: the history names its user
    acts = rng.integers(0, 3, n).astype(np.int32)
    fvs = []
    for start in range(0, n, 4):
        sl = slice(start, min(n, start + 4))
        fvs.append(Feedview(request_ts=start, request_seq=start, surface=0, item_ids=items[sl],
                            labels=(1 << acts[sl]).astype(np.int32), history_len=start))
    return UserExample(user_id=uid, items=items, actions=acts, surfaces=np.zeros(n, np.int32),
                       timestamps=np.arange(n, dtype=np.int64), seqs=np.arange(n, dtype=np.int32), feedviews=fvs)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 20))
def test_candidates_never_see_their_own_slate(seed, step):
    rng = np.random.default_rng(seed)
    cat = _catalog()
    users = [_user(u, rng) for u in range(12)]
    exs = materialise(users, cat)
    stream = BatchStream(exs, batch_size=4, seed=seed, context_len=64, n_actions=3, p_rank=1.0, max_cands=4,
                         neg_cands=3, n_catalog=len(cat))
    b = stream.batch_at(step)
    assert b.cand_rows is not None
    for i in range(b.batch_size):
        hist = b.rows[i, : int(b.lengths[i])].numpy()
        # the history is a prefix of the user's train events ending at the chosen request
        ex = next(e for e in exs if e.rows[0] // 50 == hist[0] // 50)
        assert np.array_equal(ex.rows[: len(hist)], hist)
        if not bool(b.cand_valid[i].any()):
            continue  # this row drew no feedview: no candidates
        n_real = int(b.cand_valid[i].sum()) - 3
        assert n_real >= 1
        real = b.cand_rows[i, :n_real].numpy()
        # those slate events come at/after the cut: positions len(hist) .. len(hist)+n_real-1
        assert np.array_equal(ex.rows[len(hist): len(hist) + n_real], real)
        # sampled impression-only candidates: no action label at all
        assert float(b.cand_labels[i, n_real:n_real + 3].sum()) == 0.0


def test_batches_are_a_pure_function_of_seed_and_step():
    rng = np.random.default_rng(0)
    cat = _catalog()
    exs = materialise([_user(u, rng) for u in range(20)], cat)
    mk = lambda: BatchStream(exs, batch_size=5, seed=3, context_len=8, n_actions=3, p_rank=0.5,  # noqa: E731
                             max_cands=4, neg_cands=2, n_catalog=len(cat))
    a, b = mk().batch_at(7), mk().batch_at(7)
    for f in ("rows", "actions", "lengths", "cand_rows", "cand_labels"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None and y is None) or torch.equal(x, y)
    assert int(a.lengths.max()) <= 8  # newest context_len items kept


def test_weighted_negatives_follow_their_weights():
    """``neg_weights``: rows with weight 0 are never drawn; the draw frequencies match the weights
    (chi-square-free check: a 10:1 weight ratio shows up as roughly 10:1 counts); bad weights
    are refused with the field named."""
    import pytest

    from genrec.errors import DataError

    rng = np.random.default_rng(1)
    cat = _catalog(200)
    exs = materialise([_user(u, rng, n_items=4) for u in range(40)], cat)
    w = np.zeros(len(cat))
    w[[5, 17]] = [10.0, 1.0]
    stream = BatchStream(exs, batch_size=8, seed=0, context_len=16, n_actions=3, p_rank=1.0, max_cands=4,
                         neg_cands=6, n_catalog=len(cat), neg_weights=w)
    drawn: list[int] = []
    for step in range(60):
        b = stream.batch_at(step)
        for i in range(b.batch_size):
            n_valid = int(b.cand_valid[i].sum())
            if n_valid:
                drawn.extend(b.cand_rows[i, n_valid - 6:n_valid].tolist())
    counts = np.bincount(drawn, minlength=len(cat))
    assert set(np.flatnonzero(counts)) == {5, 17}
    assert 6 < counts[5] / counts[17] < 16
    for bad in (np.ones(3), -np.ones(len(cat)), np.zeros(len(cat))):
        with pytest.raises(DataError, match="neg_weights"):
            BatchStream(exs, batch_size=8, seed=0, context_len=16, n_actions=3, neg_cands=2, n_catalog=len(cat),
                        neg_weights=bad)


def test_neighbour_table_is_the_brute_force_cosine_ranking():
    """Each row's nearest other rows by cosine, best first, against a per-row sort; rows with a zero vector
    (no engagement) get no neighbours and are nobody's neighbour; too few rows pad with -1."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(70, 5)).astype(np.float32) * rng.uniform(0.1, 3, (70, 1)).astype(np.float32)
    x[[3, 40]] = 0
    got = neighbour_table(x, 7, chunk=16)
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    for i in range(len(x)):
        if i in (3, 40):
            assert (got[i] == -1).all()
            continue
        cand = [j for j in range(len(x)) if j != i and j not in (3, 40)]
        want = sorted(cand, key=lambda j: -float(unit[i] @ unit[j]))[:7]
        assert got[i].tolist() == want
    few = neighbour_table(np.eye(3, dtype=np.float32), 5)
    assert (few[:, 2:] == -1).all() and sorted(few[0, :2].tolist()) == [1, 2]


def test_neighbour_negatives_sit_next_to_the_slate_and_outside_the_users_items():
    """``neg_table``: every sampled candidate is a table neighbour of one of its slate's items and none is an
    item of the user's own sequence (or the slate); where the table has nothing to give, the draw falls back to
    uniform and still fills every slot; the draw is a pure function of (seed, step); a table of the wrong
    shape is refused."""
    rng = np.random.default_rng(2)
    cat = _catalog(1000)
    users = [_user(u, rng) for u in range(16)]  # user u's rows lie in [50u, 50u + 50)
    exs = materialise(users, cat)
    r = np.arange(len(cat))
    table = np.stack([(r + 50 * k) % len(cat) for k in (1, 2, 3)], 1)  # other users' blocks only
    table[[10, 11]] = r[[10, 11], None] % 50  # ... except two rows whose neighbours are user 0's own items
    kw = dict(batch_size=8, seed=5, context_len=64, n_actions=3, p_rank=1.0, max_cands=4, neg_cands=3,
              n_catalog=len(cat))
    stream = BatchStream(exs, **kw, neg_table=table)
    by_user = {int(e.rows[0]) // 50: e for e in exs}
    checked = 0
    for step in range(6):
        b = stream.batch_at(step)
        for i in range(b.batch_size):
            n_valid = int(b.cand_valid[i].sum())
            if not n_valid:
                continue
            slate, neg = b.cand_rows[i, :n_valid - 3].numpy(), b.cand_rows[i, n_valid - 3:n_valid].numpy()
            ex = by_user[int(slate[0]) // 50]
            assert not np.isin(neg, ex.rows).any() and len(set(neg.tolist())) == 3
            assert np.isin(neg, table[slate]).all()
            checked += 1
    assert checked > 10
    mixed = BatchStream(exs, **kw, neg_table=table, neg_near=1)  # the first from the neighbours, the rest uniform
    for step in range(3):
        b = mixed.batch_at(step)
        for i in np.flatnonzero(b.cand_valid.any(1).numpy()):
            n_valid = int(b.cand_valid[i].sum())
            assert int(b.cand_rows[i, n_valid - 3]) in table[b.cand_rows[i, :n_valid - 3].numpy()]
    again = BatchStream(exs, **kw, neg_table=table).batch_at(3)
    assert torch.equal(again.cand_rows, stream.batch_at(3).cand_rows)
    empty = BatchStream(exs, **kw, neg_table=np.full((len(cat), 3), -1, np.int64)).batch_at(0)
    assert (empty.cand_valid.sum(1)[empty.cand_valid.any(1)] > 3).all()  # the uniform fallback fills the slots
    with pytest.raises(DataError, match="neg_table"):
        BatchStream(exs, **kw, neg_table=table[:10])


def test_padded_batch_shapes_give_the_same_loss_and_gradients():
    """pad_multiple rounds item and candidate slots up (shapes that repeat on a GPU): the joint
    loss (SID + full-softmax item + action) and its gradients are those of the unpadded batch."""
    from genrec.model.config import ModelConfig
    from genrec.model.genrec_model import GenRecModel
    from genrec.train.objective import JointObjective, ObjectiveConfig

    rng = np.random.default_rng(3)
    n = 1000
    ks = [6, 5, 4]
    g = torch.Generator().manual_seed(3)
    codes = torch.stack([torch.randint(0, k, (n,), generator=g) for k in ks], 1)
    cat = ItemCatalog(item_ids=np.arange(100, 100 + n, dtype=np.int64), feats=torch.randn(n, 4, generator=g),
                      codes=codes)
    exs = materialise([_user(u, rng) for u in range(10)], cat)
    mcfg = ModelConfig.from_name("tiny", layout="pinger", sid_levels=3, sid_codebook_sizes=ks, n_actions=3,
                                 n_surfaces=1, dropout=0.0, item_feat_dim=4, max_items=40)
    torch.manual_seed(0)
    obj = JointObjective(GenRecModel(mcfg), cat, ObjectiveConfig(item_loss="full", p_mask=0.0), [0, 1])
    kw = dict(batch_size=6, seed=1, context_len=40, n_actions=3, p_rank=0.7, max_cands=3, neg_cands=2, n_catalog=n)
    for step in range(3):
        plain = BatchStream(exs, **kw).batch_at(step)
        padded = BatchStream(exs, **kw, pad_multiple=8).batch_at(step)
        assert padded.rows.shape[1] % 8 == 0 or padded.rows.shape[1] == 40
        assert padded.rows.shape[1] > plain.rows.shape[1] or plain.rows.shape[1] % 8 == 0
        if plain.cand_rows is not None:
            assert padded.cand_rows is not None and padded.cand_rows.shape[1] % 8 == 0
        losses, grads = [], []
        for b in (plain, padded):
            obj.zero_grad(set_to_none=True)
            out = obj.training_step(b)
            out["loss"].backward()
            losses.append(out["loss"].detach())
            grads.append({k: p.grad.clone() for k, p in obj.named_parameters() if p.grad is not None})
        torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
        assert grads[0].keys() == grads[1].keys()
        for k in grads[0]:
            torch.testing.assert_close(grads[1][k], grads[0][k], atol=1e-5, rtol=1e-4)


def test_fv_pick_last_cuts_every_ranking_row_at_the_newest_feedview():
    """data.fv_pick=last: a row cut for ranking keeps the history up to the user's newest feedview (with a
    non-empty history before it); uniform draws among them, so over a few epochs it picks older ones too."""
    rng = np.random.default_rng(0)
    cat = _catalog()
    exs = materialise([_user(u, rng) for u in range(8)], cat)
    newest = {e.user_id: int(e.fv_hist[-1]) for e in exs}
    seen_older = False
    for fv_pick in ("last", "uniform"):
        stream = BatchStream(exs, batch_size=8, seed=3, context_len=64, n_actions=3, p_rank=1.0, max_cands=4,
                             fv_pick=fv_pick)
        for step in range(6):
            b = stream.batch_at(step)
            order = np.random.default_rng(3 + step).permutation(len(exs))
            for i, j in enumerate(order[:8]):
                n = int(b.lengths[i])
                if fv_pick == "last":
                    assert n == newest[exs[j].user_id]
                else:
                    seen_older |= n < newest[exs[j].user_id]
    assert seen_older


def test_fv_pick_is_checked():
    exs = materialise([_user(0, np.random.default_rng(0))], _catalog())
    with pytest.raises(DataError, match="fv_pick"):
        BatchStream(exs, batch_size=1, seed=0, context_len=8, n_actions=3, fv_pick="newest")


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10))
def test_rank_rows_extra_keeps_every_whole_row_and_appends_the_cut_ones(seed, step):
    """data.rank_rows=extra: the batch's first rows are the whole histories (what p_rank=0 gives), and each
    user drawn for ranking adds the very row (history cut at the feedview, its slate) that ``cut`` gives."""
    rng = np.random.default_rng(seed)
    cat = _catalog()
    exs = materialise([_user(u, rng) for u in range(12)], cat)
    kw = dict(batch_size=6, seed=seed, context_len=64, n_actions=3, max_cands=4)
    plain = BatchStream(exs, p_rank=0.0, **kw).batch_at(step)
    cut = BatchStream(exs, p_rank=0.6, **kw).batch_at(step)
    extra = BatchStream(exs, p_rank=0.6, rank_rows="extra", **kw).batch_at(step)
    B = plain.batch_size
    assert extra.batch_size == B + (int(cut.cand_valid.any(1).sum()) if cut.cand_valid is not None else 0)
    n = int(plain.lengths.max())
    assert torch.equal(extra.lengths[:B], plain.lengths)
    assert torch.equal(extra.rows[:B, :n], plain.rows)
    cut_rows = [i for i in range(B) if cut.cand_valid is not None and bool(cut.cand_valid[i].any())]
    for j, i in enumerate(cut_rows):
        e = B + j
        m = int(cut.lengths[i])
        assert int(extra.lengths[e]) == m and torch.equal(extra.rows[e, :m], cut.rows[i, :m])
        k = int(cut.cand_valid[i].sum())
        assert torch.equal(extra.cand_rows[e, :k], cut.cand_rows[i, :k])
        assert torch.equal(extra.cand_labels[e, :k], cut.cand_labels[i, :k])
    if extra.cand_valid is not None:
        assert not bool(extra.cand_valid[:B].any())  # the whole-history rows carry no slate


def test_rank_rows_is_checked():
    exs = materialise([_user(0, np.random.default_rng(0))], _catalog())
    with pytest.raises(DataError, match="rank_rows"):
        BatchStream(exs, batch_size=1, seed=0, context_len=8, n_actions=3, rank_rows="both")
