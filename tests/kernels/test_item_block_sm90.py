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
@pytest.mark.parametrize("variant", ["plain", "regs_lpt", "tuned", "persistent"])
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
    elif variant == "persistent":  # the tuned tiles, the forward on a persistent grid of 2 programs per SM
        cfg = ItemBlockConfig.tuned(D)
        cfg = cfg.replace(sm90_fwd=(*cfg.sm90_fwd[:4], cfg.sm90_fwd[4] if len(cfg.sm90_fwd) > 4 else 0, 2))
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


@pytest.mark.gpu
@pytest.mark.skipif(not (_hopper() and sm90.HAVE_GLUON), reason="needs a Hopper GPU and Gluon")
@pytest.mark.parametrize("D,a_regs", [(64, 1), (128, 0)])
@pytest.mark.parametrize("programs", [1, 3, 7])
def test_sm90_persistent_forward_equals_one_block_per_program(D, a_regs, programs) -> None:
    """A persistent forward whose few programs each loop over many query blocks (their loads issued
    while the block before finishes, the K/V ring's slots and phases running on across blocks) writes
    exactly what one program per block writes, every row of it."""
    import math

    g = torch.Generator(device="cuda").manual_seed(programs * D)
    q, k, v = (torch.randn(3, 2, 301 * T, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    lens = torch.tensor([301, 0, 250], dtype=torch.int32, device="cuda")
    outs = []
    for kw in ({}, {"programs": programs}):
        out, lse = torch.full_like(q, float("nan")), torch.full(q.shape[:3], float("nan"), device="cuda")
        sm90.launch_fwd_sm90(q, k, v, lens, out, lse, T, 1 / math.sqrt(D), a_regs=a_regs, **kw)
        assert not (out.isnan().any() or lse.isnan().any())
        outs.append((out, lse))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_config_takes_a_persistent_forward_only() -> None:
    assert ItemBlockConfig(sm90_fwd=(64, 64, 4, 2, 0, 2)).sm90_fwd == (64, 64, 4, 2, 0, 2)
    with pytest.raises(ValueError, match="sm90_dq"):
        ItemBlockConfig(sm90_dq=(64, 64, 4, 2, 0, 2))
    with pytest.raises(ValueError, match="persistent programs per SM"):
        ItemBlockConfig(sm90_fwd=(64, 64, 4, 2, 0, 9))


def test_tma_ready_names_what_tma_can_read_in_place() -> None:
    x = torch.zeros(2, 4, 10, 64, dtype=torch.bfloat16)
    assert sm90.tma_ready(x)
    qkv = torch.zeros(2, 10, 3, 4, 64, dtype=torch.bfloat16)
    assert sm90.tma_ready(*qkv.permute(2, 0, 3, 1, 4))  # the model's head-split views
    assert not sm90.tma_ready(x.transpose(-1, -2))  # last dim not contiguous
    assert not sm90.tma_ready(torch.zeros(2, 4, 10, 12, dtype=torch.bfloat16))  # 24-byte rows
    assert not sm90.tma_ready(torch.zeros(2 * 4 * 10 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 4, 10, 64))  # start
