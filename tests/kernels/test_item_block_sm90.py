"""The Gluon (Hopper) item-block kernels: forward, dq and the dense keys' dk/dv.

No interpreter runs Gluon; on a CPU machine the kernels are compiled for sm_90 and their machine
code inspected by ``test_inspect_item_block_cpu.py``. On a Hopper GPU they are checked here against
the fp32 reference on fresh random inputs, outputs filled with NaN first. Everywhere else the
``sm90_*`` switches must fall back to the Triton kernels and change nothing.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from genrec.kernels import item_block_sm90 as sm90  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig  # noqa: E402
from genrec.kernels.reference import item_block_attention_ref  # noqa: E402

T = 5


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def test_switches_fall_back_off_hopper() -> None:
    """On a CPU (interpreter) or a non-Hopper GPU the sm90 switches change nothing."""
    if _hopper():
        pytest.skip("a Hopper GPU runs the Gluon kernels; tested below")
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("the Triton kernels need a GPU or TRITON_INTERPRET=1")
    from genrec.kernels.item_block import item_block_attention

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 2, 7 * T, 32, generator=g).to(dev) for _ in range(4))
    lengths = torch.tensor([7, 4], dtype=torch.int32, device=dev)
    plain = ItemBlockConfig(block_m=16, block_n=16)
    on = plain.replace(sm90_fwd=(64, 64, 4, 2), sm90_dq=(64, 64, 4, 2), sm90_dense_kv=(64, 32, 4, 3))
    res = []
    for cfg in (plain, on):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = item_block_attention(*xs, lengths, T, config=cfg)
        res.append((out, *torch.autograd.grad(out, xs, do)))
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_config_rejects_malformed_sm90_tiles() -> None:
    with pytest.raises(ValueError, match="sm90_fwd"):
        ItemBlockConfig(sm90_fwd=(64, 64, 4))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sm90_dense_kv"):
        ItemBlockConfig(sm90_dense_kv=(64, 0, 4, 2))
    with pytest.raises(ValueError, match="register-operand count"):
        ItemBlockConfig(sm90_dq=(64, 64, 4, 2, 3))  # Q and dO are the only two
    assert ItemBlockConfig(sm90_dq=(64, 64, 4, 2, 2), sm90_dense_kv=(64, 16, 4, 3, 0)).sm90_dq == (64, 64, 4, 2, 2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


@pytest.mark.gpu
@pytest.mark.skipif(not (_hopper() and sm90.HAVE_GLUON), reason="needs a Hopper GPU and Gluon")
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("n,lengths", [(1, [1, 0]), (13, [13, 7]), (150, [150, 101]), (300, [0, 299])])
@pytest.mark.parametrize("layout", ["contiguous", "model"])
@pytest.mark.parametrize("variant", ["plain", "regs_lpt", "tuned"])
def test_sm90_kernels_match_reference(D, n, lengths, layout, variant, monkeypatch) -> None:
    from genrec.kernels import item_block
    from genrec.kernels.item_block import item_block_attention

    # every output row must be written: allocations start as NaN
    monkeypatch.setattr(item_block, "_empty", lambda shape, like, dtype=None: torch.full(
        tuple(shape), float("nan"), device=like.device, dtype=dtype or like.dtype))
    g = torch.Generator(device="cuda").manual_seed(n * D)
    q, k, v, do = (torch.randn(2, 2, n * T, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    rs = [x.float().requires_grad_() for x in (q, k, v)]
    ref = item_block_attention_ref(*rs, lens, T)
    gref = torch.autograd.grad(ref, rs, do.float())
    cfg = ItemBlockConfig.tuned(D).replace(sm90_fwd=(64, 64, 4, 2), sm90_dq=(64, 64, 4, 2), sm90_dense_kv=(64, 32, 4, 3))
    if variant == "regs_lpt":  # the loops' A operands from registers, the grid heads-first
        cfg = cfg.replace(sm90_fwd=(64, 64, 4, 2, 1), sm90_dq=(64, 64, 4, 2, 2), sm90_dense_kv=(64, 16, 4, 3, 2), lpt=True)
    elif variant == "tuned":  # the model's own tiles (head dim 64: 3-stage rings, operands in registers)
        cfg = ItemBlockConfig.tuned(D)
        assert cfg.sm90_fwd and cfg.sm90_dq and cfg.sm90_dense_kv
    if layout == "model":  # head-split views of one [B, S, 3, H, D] projection; dO a transposed view
        qkv = torch.stack([x.transpose(1, 2) for x in (q, k, v)], 2).contiguous()
        xs = [x.detach().requires_grad_() for x in qkv.permute(2, 0, 3, 1, 4)]
        g_out = do.transpose(1, 2).contiguous().transpose(1, 2)
        assert not xs[0].is_contiguous() and sm90.tma_ready(*xs, g_out)
    else:
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        g_out = do
    out = item_block_attention(*xs, lens, T, config=cfg)
    grads = torch.autograd.grad(out, xs, g_out)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *gref)):
        assert not torch.isnan(a).any(), f"{name}: rows left unwritten"
        err = _rel(a, b)
        assert err < 1e-2, f"{name}: relative error {err:.2e}"
    # the forward alone, lse included, against the Triton forward
    o1, l1 = item_block.item_block_attention_fwd(q, k, v, lens, T, config=ItemBlockConfig(sm90_fwd=(64, 64, 4, 2)))
    o2, l2 = item_block.item_block_attention_fwd(q, k, v, lens, T, config=ItemBlockConfig.tuned(D).replace(sm90_fwd=None))
    assert _rel(o1, o2) < 1e-2 and (l1 - l2).abs().max() < 1e-2


def test_tma_ready_names_what_tma_can_read_in_place() -> None:
    x = torch.zeros(2, 4, 10, 64, dtype=torch.bfloat16)
    assert sm90.tma_ready(x)
    qkv = torch.zeros(2, 10, 3, 4, 64, dtype=torch.bfloat16)
    assert sm90.tma_ready(*qkv.permute(2, 0, 3, 1, 4))  # the model's head-split views
    assert not sm90.tma_ready(x.transpose(-1, -2))  # last dim not contiguous
    assert not sm90.tma_ready(torch.zeros(2, 4, 10, 12, dtype=torch.bfloat16))  # 24-byte rows
    assert not sm90.tma_ready(torch.zeros(2 * 4 * 10 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 4, 10, 64))  # start
