"""The model's attention switch: the Triton item-block path equals the reference path (GPU),
and is forced off on CPU (the reference runs there)."""

import pytest
import torch

from genrec.kernels.attention import resolve_impl
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel, ModelBatch


def _batch(cfg: ModelConfig, device: str, b: int = 3, n: int = 9) -> ModelBatch:
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([n, n - 3, 2])[:b]
    sid = torch.stack([torch.randint(0, k, (b, n), generator=g) for k in cfg.sid_codebook_sizes], -1)
    return ModelBatch(
        actions=torch.randint(0, cfg.n_actions, (b, n), generator=g).to(device),
        surfaces=torch.zeros(b, n, dtype=torch.long, device=device),
        lengths=lengths.to(device), sid_codes=sid.to(device),
        item_feats=torch.randn(b, n, cfg.item_feat_dim, generator=g).to(device),
    )


def test_triton_is_forced_off_on_cpu():
    assert resolve_impl("triton", "cpu") == "reference"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [
    # fp32 failed on the H200 until 2026-11-30: the loss had user_vecs.square().mean(), a constant for
    # L2-normalised vectors, so the user head's gradients were rounding noise compared with noise
    torch.float32,
    torch.bfloat16,
])
@pytest.mark.parametrize("d_model", [
    64,
    256,  # head dim 128: on a Hopper GPU in bf16 the Gluon kernels, reading the model's head-split views
])
def test_model_forward_backward_triton_equals_reference(dtype, d_model, monkeypatch):
    from genrec.kernels import item_block

    calls: dict[str, int] = {}

    def counted(name: str):
        real = getattr(item_block, name)

        def launch(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)
        return launch

    for name in ("launch_fwd_sm90", "launch_dq_sm90", "launch_dense_kv_sm90"):  # count the Gluon launches
        monkeypatch.setattr(item_block, name, counted(name))
    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", d_model=d_model, n_heads=2, sid_levels=4, sid_codebook_sizes=[8, 8, 8, 4],
                                n_actions=3, n_surfaces=1)
    ref = GenRecModel(cfg.replace(attn_impl="reference")).cuda().eval()
    tri = GenRecModel(cfg.replace(attn_impl="triton")).cuda().eval()
    tri.load_state_dict(ref.state_dict())
    batch = _batch(cfg, "cuda")
    # a fixed direction: the user vectors are L2-normalised, so a sum of their squares would be constant
    w = torch.randn(cfg.item_dim, generator=torch.Generator().manual_seed(2)).cuda()
    outs = []
    for m in (ref, tri):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            o = m(batch)
        v = o.item_valid  # padding rows differ by design (reference: sees itself; kernel: writes 0)
        loss = sum(x.float()[v].square().mean() for x in o.sid_logits) + (o.user_vecs.float()[v] @ w).square().mean()
        loss.backward()
        outs.append((o, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (o1, g1), (o2, g2) = outs
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    valid = o1.item_valid
    for a, b in zip(o1.sid_logits, o2.sid_logits):
        assert torch.allclose(a.float()[valid], b.float()[valid], atol=tol, rtol=tol)
    assert torch.allclose(o1.user_vecs.float()[valid], o2.user_vecs.float()[valid], atol=tol, rtol=tol)
    for n in g1:
        rel = (g1[n] - g2[n]).norm() / (g1[n].norm() + 1e-12)
        assert rel < (1e-3 if dtype == torch.float32 else 5e-2), (n, float(rel))
    hopper_bf16_128 = torch.cuda.get_device_capability()[0] == 9 and dtype == torch.bfloat16 and d_model == 256
    if hopper_bf16_128 and item_block.sm90_available(torch.empty(1, device="cuda", dtype=dtype)):
        assert set(calls) == {"launch_fwd_sm90", "launch_dq_sm90", "launch_dense_kv_sm90"}, calls
    else:
        assert not calls, calls


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tiger", "dense"])
def test_causal_layouts_fast_path_on_gpu_equals_reference(layout, monkeypatch):
    """On CUDA a token-causal layout's full forward runs SDPA is_causal (attn_impl auto); the
    explicit-mask reference (attn_impl reference) gives the same valid hidden states and gradients."""
    monkeypatch.delenv("GENREC_ATTN", raising=False)
    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", d_model=64, n_heads=2, layout=layout, sid_levels=4,
                                sid_codebook_sizes=[8, 8, 8, 4], n_actions=3, n_surfaces=1, dropout=0.0)
    ref = GenRecModel(cfg.replace(attn_impl="reference")).cuda().eval()
    fast = GenRecModel(cfg.replace(attn_impl="auto")).cuda().eval()
    fast.load_state_dict(ref.state_dict())
    batch = _batch(cfg, "cuda")
    outs = []
    for m in (ref, fast):
        o = m(batch)
        real = o.layout.meta.kind != -2
        w = torch.randn(o.hidden.shape, generator=torch.Generator().manual_seed(1)).cuda()
        (o.hidden * w)[real].sum().backward()
        outs.append((o.hidden.detach()[real], {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (h1, g1), (h2, g2) = outs
    torch.testing.assert_close(h2, h1, atol=1e-4, rtol=1e-4)
    for n in g1:
        assert (g1[n] - g2[n]).norm() <= 1e-3 * (g1[n].norm() + 1e-12), n


@pytest.mark.parametrize("d_model,n_heads,kernel", [(32, 2, True), (48, 2, False), (96, 1, False), (64, 4, True)])
def test_item_block_kernel_only_at_the_head_dims_it_takes(d_model: int, n_heads: int, kernel: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Under attn_impl=triton a head dim the kernel does not take (24, 96: not a power of two) trains with
    the reference mask instead of raising mid-run; 16 and 16 x 2 take the kernel's mask."""
    from genrec.kernels.attention import ItemBlockMask
    from genrec.model import backbone

    monkeypatch.setattr(backbone, "resolve_impl", lambda impl, device, elems=None: "triton")  # as on a GPU
    cfg = ModelConfig.from_name("tiny", d_model=d_model, n_heads=n_heads, sid_levels=3, sid_codebook_sizes=[4, 4, 4],
                                n_actions=3, n_surfaces=1, attn_impl="triton")
    from genrec.model.layout import build_layout

    lay = build_layout(torch.tensor([9, 6, 2]), 9, cfg.layout, cfg.sid_levels)
    mask = GenRecModel(cfg).backbone._mask(lay.meta, lay.meta, cfg.layout, torch.device("cpu"), 0)
    assert isinstance(mask, ItemBlockMask) is kernel
    if not kernel:
        assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool


def test_auto_takes_the_item_block_kernel_where_the_pinger_mask_is_too_big(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under auto on a GPU a PinGER training mask past AUTO_FLEX_MIN_MASK_ELEMS goes to the item-block kernel
    (flex would fall back to a dense mask under dropout); explicit flex keeps flex; the serving layout (one dense
    token per item, same layout name) never takes the kernel, even where its token count divides into items."""
    from genrec.kernels.attention import ItemBlockMask
    from genrec.model import backbone
    from genrec.model.layout import build_layout

    monkeypatch.setattr(backbone, "resolve_impl", lambda impl, device, elems=None: "flex")  # a big mask on a GPU
    monkeypatch.setattr(backbone, "gpu_fast_path", lambda choice, device: choice in ("auto", "triton"))
    monkeypatch.setattr(backbone, "prepare_mask", lambda *a: "flex-or-dense")
    monkeypatch.delenv("GENREC_ATTN", raising=False)
    picked = {}
    for impl in ("auto", "flex"):
        for serving in (False, True):
            cfg = ModelConfig.from_name("tiny", d_model=32, n_heads=2, sid_levels=3, sid_codebook_sizes=[4, 4, 4],
                                        n_actions=3, n_surfaces=1, attn_impl=impl, dropout=0.0)
            # 12 items: 12 serving tokens divide into 3-token "items" too
            lay = build_layout(torch.tensor([12, 6, 2]), 12, cfg.layout, cfg.sid_levels, serving=serving)
            mask = GenRecModel(cfg).eval().backbone._mask(lay.meta, lay.meta, cfg.layout, torch.device("cpu"), 0)
            picked[impl, serving] = mask
    assert isinstance(picked["auto", False], ItemBlockMask)
    assert picked["auto", False].lengths.tolist() == [12, 6, 2]
    assert picked["auto", True] == picked["flex", False] == picked["flex", True] == "flex-or-dense"


def test_triton_never_reads_the_serving_layout_as_item_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from genrec.kernels.attention import ItemBlockMask
    from genrec.model import backbone
    from genrec.model.layout import build_layout

    monkeypatch.setattr(backbone, "resolve_impl", lambda impl, device, elems=None: "triton")  # as on a GPU
    cfg = ModelConfig.from_name("tiny", d_model=32, n_heads=2, sid_levels=3, sid_codebook_sizes=[4, 4, 4],
                                n_actions=3, n_surfaces=1, attn_impl="triton")
    model = GenRecModel(cfg).eval()
    for serving, kernel in ((False, True), (True, False)):
        lay = build_layout(torch.tensor([12, 6, 2]), 12, cfg.layout, cfg.sid_levels, serving=serving)
        mask = model.backbone._mask(lay.meta, lay.meta, cfg.layout, torch.device("cpu"), 0)
        assert isinstance(mask, ItemBlockMask) is kernel, serving
