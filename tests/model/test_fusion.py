"""SID fusion's one-row fast path against the whole causal layer (its slow twin), on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

from genrec.model.config import ModelConfig
from genrec.model.encoders import SidEmbedding
from genrec.model.fusion import SidFusion
from tests.model.test_model_equivalence import make_batch, make_model


def _fusion(seed: int, **over) -> SidFusion:
    torch.manual_seed(seed)
    cfg = ModelConfig.from_name("tiny", **{"dropout": 0.0, **over})
    f = SidFusion(cfg)
    with torch.no_grad():  # the slot marker starts at zero; make it matter
        f.dense_slot.normal_()
    return f


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("over", [dict(), dict(norm="layernorm", sid_levels=2, sid_codebook_sizes=[5, 7]),
                                  dict(n_heads=1), dict(sid_levels=4, sid_codebook_sizes=[6, 5, 4, 3])])
def test_fast_fusion_equals_the_whole_layer_forward_and_backward(seed: int, over: dict) -> None:
    f = _fusion(seed, **over)
    g = torch.Generator().manual_seed(100 + seed)
    lead = [(3, 7), (11,), (2, 1, 5)][seed % 3]
    d, L = f.dense_slot.shape[0], f.levels
    sid = torch.randn(*lead, L, d, generator=g, requires_grad=True)
    dense = torch.randn(*lead, d, generator=g, requires_grad=True)
    grad = torch.randn(*lead, d, generator=g)

    fast = f(sid, dense)
    ref = f.forward_reference(sid, dense)
    assert fast.shape == ref.shape == (*lead, d)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)

    got = torch.autograd.grad(fast, [sid, dense, *f.parameters()], grad, allow_unused=True)
    want = torch.autograd.grad(ref, [sid, dense, *f.parameters()], grad, allow_unused=True)
    for name, a, b in zip(["sid", "dense", *(n for n, _ in f.named_parameters())], got, want):
        if b is None:
            assert a is None or not a.abs().any(), name
            continue
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("over", [dict(), dict(norm="layernorm", sid_levels=2, sid_codebook_sizes=[5, 7]),
                                  dict(sid_levels=4, sid_codebook_sizes=[6, 5, 4, 3])])
@pytest.mark.parametrize("n_items", [1, 4, 60])  # 1 and 4: fewer SID tokens than codebook rows (projected per
# token); 60: more (projected per codebook row and gathered)
def test_fusion_from_codes_equals_the_whole_layer_forward_and_backward(seed: int, over: dict, n_items: int) -> None:
    f = _fusion(seed, **over)
    cfg = ModelConfig.from_name("tiny", **{"dropout": 0.0, **over})
    torch.manual_seed(50 + seed)
    emb = SidEmbedding(cfg)
    g = torch.Generator().manual_seed(200 + seed)
    d, L = f.dense_slot.shape[0], f.levels
    lead = (2, n_items // 2) if n_items > 1 else (1,)
    codes = torch.stack([torch.randint(0, k, lead, generator=g) for k in cfg.sid_codebook_sizes], -1)
    dense = torch.randn(*lead, d, generator=g, requires_grad=True)
    grad = torch.randn(*lead, d, generator=g)

    fast = f.forward_codes(codes, emb, dense)
    ref = f.forward_reference(emb(codes), dense)
    assert fast.shape == ref.shape == (*lead, d)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)

    params = [dense, *f.parameters(), *emb.parameters()]
    names = ["dense", *(n for n, _ in f.named_parameters()), *(f"emb.{n}" for n, _ in emb.named_parameters())]
    got = torch.autograd.grad(fast, params, grad, allow_unused=True)
    want = torch.autograd.grad(ref, params, grad, allow_unused=True)
    for name, a, b in zip(names, got, want):
        if b is None:
            assert a is None or not a.abs().any(), name
            continue
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_fusion_from_codes_bad_codes_name_the_level() -> None:
    f = _fusion(0)
    cfg = ModelConfig.from_name("tiny", dropout=0.0)
    emb = SidEmbedding(cfg)
    d, L = f.dense_slot.shape[0], f.levels
    codes = torch.zeros(40, L, dtype=torch.int64)
    codes[17, 1] = cfg.sid_codebook_sizes[1]  # one past the level-2 codebook
    with pytest.raises(ValueError, match=r"sid_codes\[\.\.\., level 2\]"):
        f.forward_codes(codes, emb, torch.randn(40, d))
    with pytest.raises(ValueError, match="sid_codes"):
        f.forward_codes(codes[:, :2], emb, torch.randn(40, d))


def test_fast_fusion_only_reads_its_own_item() -> None:
    """Per-item function: changing one item's inputs changes that item's output row only."""
    f = _fusion(0)
    d, L = f.dense_slot.shape[0], f.levels
    sid, dense = torch.randn(4, L, d), torch.randn(4, d)
    base = f(sid, dense)
    sid2 = sid.clone()
    sid2[2, 0] += 1.0
    out = f(sid2, dense)
    assert not torch.allclose(out[2], base[2])
    torch.testing.assert_close(out[[0, 1, 3]], base[[0, 1, 3]], rtol=0, atol=0)


def test_fast_fusion_applies_dropout_in_training_only() -> None:
    f = _fusion(1, dropout=0.5)
    d, L = f.dense_slot.shape[0], f.levels
    sid, dense = torch.randn(64, L, d), torch.randn(64, d)
    f.eval()
    torch.testing.assert_close(f(sid, dense), f.forward_reference(sid, dense), rtol=1e-5, atol=1e-5)
    f.train()
    torch.manual_seed(0)
    a = f(sid, dense)
    torch.manual_seed(1)
    b = f(sid, dense)
    assert not torch.allclose(a, b)  # stochastic in training, as the whole layer is


def test_fast_fusion_bad_shapes_name_the_inputs() -> None:
    f = _fusion(0)
    d, L = f.dense_slot.shape[0], f.levels
    with pytest.raises(ValueError, match="sid_emb"):
        f(torch.randn(3, L + 1, d), torch.randn(3, d))


@pytest.mark.parametrize("layout", ["pinger", "dense"])
def test_model_outputs_equal_with_the_reference_fusion(layout: str) -> None:
    model = make_model(9, layout=layout, sid_fusion=True, target_condition=True)
    batch = make_batch(model.config, [5, 2, 7], 7, 3, seed=4)
    fast = model(batch)
    fusion, embed = model.fusion, model.sid_emb
    assert fusion is not None and embed is not None
    fusion.forward_codes = lambda codes, _, dense: fusion.forward_reference(embed(codes), dense)  # type: ignore[method-assign]
    ref = model(batch)
    torch.testing.assert_close(fast.hidden, ref.hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.user_vecs, ref.user_vecs, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_fast_fusion_bf16_on_gpu_close_to_fp32_reference() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    f = _fusion(2, d_model=128, n_heads=2, d_ff=256).cuda()
    d, L = f.dense_slot.shape[0], f.levels
    sid, dense = torch.randn(8, 256, L, d, device="cuda"), torch.randn(8, 256, d, device="cuda")
    ref = f.forward_reference(sid, dense)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fast = f(sid, dense)
    err = (fast.float() - ref).abs().max() / ref.abs().max()
    assert err < 2e-2, float(err)
    # from codes: the SID tokens' keys and values gathered from per-codebook projections
    cfg = ModelConfig.from_name("tiny", dropout=0.0, d_model=128, n_heads=2, d_ff=256)
    emb = SidEmbedding(cfg).cuda()
    codes = torch.stack([torch.randint(0, k, (8, 256), device="cuda") for k in cfg.sid_codebook_sizes], -1)
    ref = f.forward_reference(emb(codes), dense)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fast = f.forward_codes(codes, emb, dense)
    err = (fast.float() - ref).abs().max() / ref.abs().max()
    assert err < 2e-2, float(err)
