"""The one attention predicate vs a slow construction written from the rules in words (exhaustive)."""

from __future__ import annotations

import itertools

import pytest
import torch

from genrec.kernels.attention import _dense_mask
from genrec.model.layout import ACTION, CAND, DENSE, PAD, build_layout
from genrec.model.mask import make_mask_mod, reference_mask

LAYOUTS = [("pinger", False), ("pinger", True), ("tiger", False), ("dense", False), ("hstu", False)]


def slow_tokens(length: int, n_slots: int, layout: str, serving: bool, L: int, k: int) -> list[dict]:
    """Token list of one row, written out from the layout description (not from layout.py)."""
    toks: list[dict] = []
    for i in range(n_slots):
        if layout == "pinger" and not serving:
            slots = [("sid", lvl) for lvl in range(1, L)] + [("dense", 0)]
        elif layout == "tiger":
            slots = [("sid", lvl) for lvl in range(1, L + 1)]
        elif layout == "hstu":
            slots = [("dense", 0), ("action", 0)]
        else:
            slots = [("dense", 0)]
        for what, lvl in slots:
            toks.append({"item": i, "what": what if i < length else "pad", "level": lvl})
    for _ in range(k):
        toks.append({"item": length, "what": "cand", "level": 0})
    return toks


def slow_visible(toks: list[dict], qi: int, ki: int, layout: str) -> bool:
    q, k = toks[qi], toks[ki]
    if q["what"] == "pad":
        return qi == ki  # a padding query sees only itself
    if k["what"] == "pad":
        return False  # padding keys are never visible
    if q["what"] == "cand":
        if qi == ki:
            return True
        if k["what"] == "cand":
            return False  # never another candidate
        if layout == "pinger":
            return k["what"] == "dense"  # every history dense token, no SID token
        return True  # every history token
    if k["what"] == "cand":
        return False  # no history token sees a candidate
    if layout == "pinger":
        if q["what"] == "dense":  # rule 1
            return k["what"] == "dense" and k["item"] <= q["item"]
        if q["what"] == "sid":  # rule 2
            if k["what"] == "dense":
                return k["item"] < q["item"]
            return k["what"] == "sid" and k["item"] == q["item"] and k["level"] <= q["level"]
        return False  # rule 3
    return ki <= qi  # tiger / dense / hstu: causal over tokens


KIND_OF = {"dense": DENSE, "cand": CAND, "pad": PAD, "action": ACTION}


@pytest.mark.parametrize("layout,serving", LAYOUTS)
def test_predicate_matches_slow_construction_exhaustively(layout: str, serving: bool) -> None:
    cases = 0
    for n_slots, L, k in itertools.product(range(1, 5), range(2, 5), range(0, 4)):
        lengths = torch.arange(0, n_slots + 1)  # every valid length 0..n_slots in one padded batch
        lay = build_layout(lengths, n_slots, layout, L, k, serving)
        got = reference_mask(lay.meta, layout=layout)  # [B, S, S]
        for b, length in enumerate(lengths.tolist()):
            toks = slow_tokens(length, n_slots, layout, serving, L, k)
            assert len(toks) == got.shape[1]
            for t, tk in enumerate(toks):
                kind = tk["level"] if tk["what"] == "sid" else KIND_OF[tk["what"]]
                assert int(lay.meta.kind[b, t]) == kind, (layout, n_slots, L, k, b, t)
                if tk["what"] != "pad":
                    assert int(lay.meta.pos[b, t]) == tk["item"]
            for qi, ki in itertools.product(range(len(toks)), repeat=2):
                want = slow_visible(toks, qi, ki, layout)
                assert bool(got[b, qi, ki]) == want, (layout, serving, n_slots, L, k, length, qi, ki)
            assert got[b].any(-1).all()  # every query sees something: no NaN rows
        cases += 1
    assert cases == 4 * 3 * 4


def test_mask_mod_index_form_equals_reference_mask() -> None:
    lay = build_layout(torch.tensor([3, 1, 4, 0]), 4, "pinger", 4, 3)
    ref = reference_mask(lay.meta, layout="pinger")
    b, s = lay.meta.shape
    via_mod = _dense_mask(make_mask_mod(lay.meta, lay.meta, "pinger"), b, s, s, torch.device("cpu"))[:, 0]
    assert torch.equal(ref, via_mod)


def test_serving_layout_is_the_training_mask_restricted_to_dense_tokens() -> None:
    lengths = torch.tensor([4, 2, 3])
    train = build_layout(lengths, 4, "pinger", 3, 2)
    serve = build_layout(lengths, 4, "pinger", 3, 2, serving=True)
    keep_idx = torch.cat([train.dense_index, train.cand_index])
    m_train = reference_mask(train.meta, layout="pinger")[:, keep_idx][:, :, keep_idx]
    m_serve = reference_mask(serve.meta, layout="pinger")
    assert torch.equal(m_train, m_serve)


def test_bad_layout_arguments_raise() -> None:
    with pytest.raises(ValueError, match="lengths"):
        build_layout(torch.tensor([5]), 4, "pinger", 3)
    with pytest.raises(Exception, match="layout"):
        build_layout(torch.tensor([1]), 4, "nope", 3)


def test_kernel_reference_mask_agrees_with_the_predicate() -> None:
    """The Triton kernel's slow twin (genrec.kernels.reference) must encode the same PinGER rules."""
    ref_mod = pytest.importorskip("genrec.kernels.reference")
    for n_slots, L in itertools.product(range(1, 5), range(2, 5)):
        lengths = torch.arange(0, n_slots + 1)
        lay = build_layout(lengths, n_slots, "pinger", L)
        ours = reference_mask(lay.meta, layout="pinger")
        theirs = ref_mod.item_block_mask(lengths, n_slots, L)
        real = (lay.meta.kind != PAD)[:, :, None]  # padding query rows differ by convention (self vs none)
        assert torch.equal(ours & real, theirs & real), (n_slots, L)
