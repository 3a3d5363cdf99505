"""The learned per-item-id vectors (``item_id_vocab > 0``): keyed by item id, never by row; ids
without a learned vector get exactly the content vector; a trained run's checkpoint carries the
keys, and serving (``Recommender.from_checkpoint``) reproduces the training-time catalogue vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.model.config import ModelConfig
from genrec.model.encoders import ItemEncoder


def _enc(vocab: int, seed: int = 0) -> ItemEncoder:
    torch.manual_seed(seed)
    return ItemEncoder(ModelConfig.from_name("tiny", item_id_vocab=vocab))


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(-5, 10 ** 12), min_size=1, max_size=40, unique=True),
       queries=st.lists(st.integers(-5, 10 ** 12), min_size=1, max_size=60), extra=st.integers(0, 8))
def test_slots_equal_a_dict_lookup(keys, queries, extra):  # noqa: ANN001
    enc = _enc(len(keys) + extra)
    perm = np.random.default_rng(len(keys)).permutation(keys)
    enc.set_id_keys(torch.tensor(perm))
    q = torch.tensor(queries + keys[:3])
    slot = enc.slots(q)
    ks = sorted(keys)
    want = [ks.index(x) if x in ks else -1 for x in q.tolist()]
    assert slot.tolist() == want


def test_unknown_ids_get_the_content_vector_and_known_ids_their_own():
    enc = _enc(6)
    enc.set_id_keys(torch.tensor([50, 10, 30]))
    with torch.no_grad():
        enc.id_emb.weight.normal_()  # type: ignore[union-attr]
    feats = torch.randn(5, enc.feat_dim)
    ids = torch.tensor([10, 11, 30, -1, 50])
    v = enc(feats, ids)
    content = F.normalize(enc.mlp(feats), dim=-1)
    assert torch.allclose(v[[1, 3]], content[[1, 3]], atol=1e-6)  # 11 and -1 own no vector
    assert torch.allclose(enc(feats), content, atol=1e-6)  # no ids: content only
    w = enc.id_emb.weight  # type: ignore[union-attr]
    for i, slot in ((0, 0), (2, 1), (4, 2)):  # keys sorted: 10, 30, 50
        want = F.normalize(enc.mlp(feats[i]) + w[slot], dim=-1)
        assert torch.allclose(v[i], want, atol=1e-6)
    # keyed by id: the same (feature, id) pairs in another order give the same vectors
    perm = torch.tensor([4, 2, 0, 3, 1])
    assert torch.allclose(enc(feats[perm], ids[perm]), v[perm], atol=1e-6)


def test_added_id_vectors_serve_new_ids_and_leave_known_ones_alone():
    enc = _enc(6)  # 3 of 6 slots used
    enc.set_id_keys(torch.tensor([50, 10, 30]))
    with torch.no_grad():
        enc.id_emb.weight.normal_()  # type: ignore[union-attr]
    feats = torch.randn(6, enc.feat_dim)
    known = torch.tensor([10, 30, 50])
    before = enc(feats[:3], known)
    new = torch.randn(3, enc.item_dim)
    enc.add_id_vectors(torch.tensor([40, 5, 99]), new)  # before, between and after the known ids
    assert enc.id_keys.tolist() == [5, 10, 30, 40, 50, 99]
    assert torch.equal(enc(feats[:3], known), before)
    got = enc(feats[3:], torch.tensor([40, 5, 99]))
    assert torch.allclose(got, F.normalize(enc.mlp(feats[3:]) + new, dim=-1), atol=1e-6)
    with pytest.raises(ValueError, match="none that already has a learned vector"):
        enc.add_id_vectors(torch.tensor([30]), torch.zeros(1, enc.item_dim))
    with pytest.raises(ValueError, match="expected \\[2, "):
        enc.add_id_vectors(torch.tensor([1, 2]), torch.zeros(1, enc.item_dim))
    with pytest.raises(ValueError, match="no ID vectors"):
        _enc(0).add_id_vectors(torch.tensor([1]), torch.zeros(1, enc.item_dim))


def test_bad_shapes_and_vocab_are_named():
    enc = _enc(2)
    with pytest.raises(ValueError, match="item_id_vocab=2"):
        enc.set_id_keys(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="item_ids"):
        enc(torch.randn(3, enc.feat_dim), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="no ID vectors"):
        _enc(0).set_id_keys(torch.tensor([1]))
