"""Triton item-block attention (PinGER §3.3.4) vs the PyTorch twin, under the CPU interpreter.

TRITON_INTERPRET must be set before triton is imported, hence the module-level setdefault.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

from genrec.kernels import item_block  # noqa: E402
from genrec.kernels.item_block import ItemBlockConfig, item_block_attention, item_block_attention_fwd  # noqa: E402
from genrec.kernels.reference import item_block_attention_ref, item_block_mask  # noqa: E402

_INTERPRETED = type(item_block._item_block_fwd_kernel).__name__ == "InterpretedFunction"
pytestmark = pytest.mark.skipif(
    not (_INTERPRETED or torch.cuda.is_available()),
    reason="genrec.kernels.item_block was imported before TRITON_INTERPRET=1 was set and there is no GPU",
)
DEVICE = "cpu" if _INTERPRETED else "cuda"


def _inputs(B: int, H: int, n_items: int, T: int, D: int, dtype: torch.dtype, seed: int, transposed: bool = False):
    g = torch.Generator().manual_seed(seed)
    shape = (B, n_items * T, H, D) if transposed else (B, H, n_items * T, D)
    xs = [torch.randn(shape, generator=g).to(dtype) for _ in range(4)]
    if transposed:  # [B, S, H, D] storage seen as [B, H, S, D]: non-contiguous head/seq strides
        xs = [x.transpose(1, 2) for x in xs]
    return [x.to(DEVICE) for x in xs]


def _run_both(q, k, v, do, lengths, T, block_m, block_n, config=None):
    qk = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    if config is None:
        out = item_block_attention(*qk, lengths, T, block_m=block_m, block_n=block_n)
    else:
        out = item_block_attention(*qk, lengths, T, config=config)
    grads = torch.autograd.grad(out, qk, do)
    # the reference runs on the CPU in fp32 whatever device the kernel ran on (callers compare a.cpu() to it)
    qr = [x.detach().float().cpu().requires_grad_() for x in (q, k, v)]
    ref = item_block_attention_ref(*qr, lengths.cpu(), T)
    grads_ref = torch.autograd.grad(ref, qr, do.float().cpu())
    return out, grads, ref, grads_ref


# No shrinking: every example runs the interpreter, and a failing draw is already small.
@settings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    T=st.sampled_from([1, 2, 3, 5]),
    n_items=st.integers(1, 12),
    D=st.sampled_from([16, 32]),
    B=st.integers(1, 2),
    H=st.integers(1, 2),
    block_m=st.sampled_from([16, 32]),
    transposed=st.booleans(),
    data=st.data(),
)
def test_fp32_forward_backward_match_reference(T, n_items, D, B, H, block_m, transposed, data) -> None:
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, n_items), min_size=B, max_size=B)), dtype=torch.int32)
    q, k, v, do = _inputs(B, H, n_items, T, D, torch.float32, seed=data.draw(st.integers(0, 2**16)), transposed=transposed)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths.to(DEVICE), T, block_m, 16)
    assert (out.cpu() - ref).abs().max() < 1e-4
    for name, g, gr in zip("qkv", grads, grads_ref):
        assert (g.cpu() - gr).abs().max() < 1e-4, f"d{name}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,n_items,D", [(5, 9, 32), (3, 12, 16)])
def test_half_precision_close_to_fp32_reference(dtype: torch.dtype, T: int, n_items: int, D: int) -> None:
    q, k, v, do = _inputs(2, 2, n_items, T, D, dtype, seed=7)
    lengths = torch.tensor([n_items, n_items - 4], dtype=torch.int32, device=DEVICE)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths, T, 16, 16)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    tol = 1e-2 if dtype == torch.bfloat16 else 3e-3
    for name, a, b in [("out", out, ref), *zip(("dq", "dk", "dv"), grads, grads_ref)]:
        rel = (a.float().cpu() - b).norm() / b.norm()
        assert rel < tol, f"{name}: relative error {rel:.2e}"


def test_many_blocks_long_row() -> None:
    # 40 items: several query blocks, several dense-key tiles in the dense dk/dv kernel.
    T, n_items, D = 2, 40, 16
    q, k, v, do = _inputs(2, 1, n_items, T, D, torch.float32, seed=13)
    lengths = torch.tensor([n_items, 23], dtype=torch.int32, device=DEVICE)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths, T, 16, 16)
    assert (out.cpu() - ref).abs().max() < 1e-4
    for name, g, gr in zip("qkv", grads, grads_ref):
        assert (g.cpu() - gr).abs().max() < 1e-4, f"d{name}"


@pytest.mark.parametrize("D", [64, 128])
def test_default_config_fp32_at_model_head_dims(D: int) -> None:
    # item_block_attention with no configuration, fp32, at the head dims models use. On an H200 the
    # uncapped default tiles needed 321 KB of shared memory at head dim 128 and failed to launch; here
    # (the interpreter in CI, the GPU under `bash benchmarks/gpu.sh python3 -m pytest -m gpu`) the capped ones must also compute the right thing.
    T, n_items = 5, 13
    q, k, v, do = _inputs(1, 1, n_items, T, D, torch.float32, seed=5 + D)
    lengths = torch.tensor([n_items - 2], dtype=torch.int32, device=DEVICE)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths, T, 64, 64)
    assert (out.cpu() - ref).abs().max() < 1e-4
    for name, g, gr in zip("qkv", grads, grads_ref):
        assert (g.cpu() - gr).abs().max() < 1e-4, f"d{name}"


def test_poisoned_buffers_are_fully_overwritten(monkeypatch: pytest.MonkeyPatch) -> None:
    def nan_empty(shape, like, dtype=None):
        return torch.full(tuple(shape), float("nan"), device=like.device, dtype=dtype or like.dtype)

    monkeypatch.setattr(item_block, "_empty", nan_empty)
    T, n_items, D = 3, 11, 16
    q, k, v, do = _inputs(2, 2, n_items, T, D, torch.float32, seed=3)
    lengths = torch.tensor([n_items, 4], dtype=torch.int32, device=DEVICE)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths, T, 16, 16)
    for name, a, b in [("out", out, ref), *zip(("dq", "dk", "dv"), grads, grads_ref)]:
        assert not torch.isnan(a).any(), f"{name}: NaN left in the buffer"
        assert (a.cpu() - b).abs().max() < 1e-4, name
    pad = slice(4 * T, None)
    assert torch.all(out[1, :, pad] == 0) and all(torch.all(g[1, :, pad] == 0) for g in grads)
    _, lse = item_block_attention_fwd(q, k, v, lengths, T, block_m=16, block_n=16)
    assert not torch.isnan(lse).any()


def test_logsumexp_matches_masked_scores() -> None:
    T, n_items, D = 5, 7, 16
    q, k, v, _ = _inputs(1, 2, n_items, T, D, torch.float32, seed=11)
    lengths = torch.tensor([6], dtype=torch.int32, device=DEVICE)
    _, lse = item_block_attention_fwd(q, k, v, lengths, T, block_m=16, block_n=16)
    mask = item_block_mask(lengths.cpu(), n_items, T)[:, None]  # [B, 1, S, S]
    s = (q.cpu() @ k.cpu().transpose(-1, -2) / D**0.5).masked_fill(~mask, float("-inf"))
    expect = torch.logsumexp(s, -1)
    valid = mask.any(-1).expand_as(expect)
    torch.testing.assert_close(lse.cpu()[valid], expect[valid], atol=1e-5, rtol=1e-5)
    assert torch.all(lse.cpu()[~valid] == 0)


@pytest.mark.parametrize("T,n_items", [(2, 16), (3, 10), (5, 6)])
def test_attention_pattern_equals_rule_mask(T: int, n_items: int) -> None:
    # One-hot V (V = identity over the S tokens) reads back each query's attention row:
    # out[s, j] = p(s, j) > 0 exactly where key j is visible to query s.
    S, D = n_items * T, 32
    g = torch.Generator().manual_seed(5)
    q, k = (0.1 * torch.randn(1, 1, S, D, generator=g) for _ in range(2))
    v = torch.eye(S, D)[None, None].contiguous()
    lengths = torch.tensor([n_items - 1], dtype=torch.int32)
    out = item_block_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), lengths.to(DEVICE), T, block_m=16, block_n=16)
    torch.testing.assert_close(out.cpu(), item_block_attention_ref(q, k, v, lengths, T), atol=1e-5, rtol=1e-5)
    pattern = out.cpu()[0, 0, :, :S] > 0
    assert torch.equal(pattern, item_block_mask(lengths, n_items, T)[0])
    torch.testing.assert_close(out.cpu().sum(-1)[0, 0, : (n_items - 1) * T], torch.ones((n_items - 1) * T))


def test_rejects_bad_input() -> None:
    q = torch.randn(1, 1, 6, 16, device=DEVICE)
    with pytest.raises(ValueError, match="T"):
        item_block_attention(q, q, q, torch.tensor([1], device=DEVICE), 4)
    with pytest.raises(ValueError, match="lengths"):
        item_block_attention(q, q, q, torch.tensor([3], device=DEVICE), 3)
    with pytest.raises(ValueError, match="head dim"):
        x = torch.randn(1, 1, 6, 24, device=DEVICE)
        item_block_attention(x, x, x, torch.tensor([2], device=DEVICE), 3)
    with pytest.raises(ValueError, match="dtype"):
        item_block_attention(q, q.double(), q, torch.tensor([2], device=DEVICE), 3)


# ---------------------------------------------------------------- tuning variants (ItemBlockConfig)
# Every knob must leave the function unchanged. Small tiles so that the shapes below have several
# query blocks, full and partial dense-key tiles, and dense dk/dv tiles past the masked diagonal.
VARIANTS = {
    "gather_dense": ItemBlockConfig(block_m=16, block_n=16, gather_dense=True),
    "split_tail": ItemBlockConfig(block_m=16, block_n=16, split_tail=True),
    "fuse_delta": ItemBlockConfig(block_m=16, block_n=16, fuse_delta=True),
    "fuse_sid_kv": ItemBlockConfig(block_m=16, block_n=16, fuse_sid_kv=True),
    "all_own_bwd_tiles": ItemBlockConfig(
        block_m=32, block_n=16, num_stages=2, gather_dense=True, split_tail=True, fuse_delta=True, fuse_sid_kv=True,
        dq_block_m=16, dq_block_n=32, dq_warps=2, dq_stages=3, kv_block_i=16, kv_block_q=32, kv_warps=2, kv_stages=3,
        sid_block_m=16, sid_warps=2,
    ),
    # register caps: compiled on a GPU (a cap that spills must still compute the same); ignored by the interpreter
    "maxnreg": ItemBlockConfig(block_m=16, block_n=16, split_tail=True, maxnreg=128, dq_maxnreg=96, kv_maxnreg=96),
    "all_wide_kv_keys": ItemBlockConfig(
        block_m=16, block_n=32, gather_dense=True, split_tail=True, fuse_delta=True, kv_block_i=32, kv_block_q=16,
    ),
    # grid (B*H, blocks): the program ids map to blocks and heads the other way round
    "lpt": ItemBlockConfig(block_m=16, block_n=16, split_tail=True, fuse_delta=True, fuse_sid_kv=True, lpt=True),
}


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs and scratch (lse, fused delta) start as NaN: every element must be written."""

    def nan_empty(shape, like, dtype=None):
        return torch.full(tuple(shape), float("nan"), device=like.device, dtype=dtype or like.dtype)

    monkeypatch.setattr(item_block, "_empty", nan_empty)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("T,n_items,lengths,transposed", [(5, 22, [22, 13, 0], False), (1, 36, [19, 36], True)])
def test_variant_fp32_matches_reference_poisoned(poisoned, variant, T, n_items, lengths, transposed) -> None:
    B, D = len(lengths), 16
    q, k, v, do = _inputs(B, 1, n_items, T, D, torch.float32, seed=17 + T, transposed=transposed)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lens, T, 0, 0, config=VARIANTS[variant])
    for name, a, b in [("out", out, ref), *zip(("dq", "dk", "dv"), grads, grads_ref)]:
        assert not torch.isnan(a).any(), f"{name}: NaN left in the buffer"
        assert (a.cpu() - b).abs().max() < 1e-4, name
    for row, n in enumerate(lengths):  # padding rows: exactly 0
        assert torch.all(out[row, :, n * T :] == 0) and all(torch.all(g[row, :, n * T :] == 0) for g in grads)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_bf16_close_to_fp32_reference(variant) -> None:
    T, n_items, D = 5, 20, 32
    q, k, v, do = _inputs(2, 1, n_items, T, D, torch.bfloat16, seed=23)
    lengths = torch.tensor([n_items, 11], dtype=torch.int32, device=DEVICE)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths, T, 0, 0, config=VARIANTS[variant])
    for name, a, b in [("out", out, ref), *zip(("dq", "dk", "dv"), grads, grads_ref)]:
        rel = (a.float().cpu() - b).norm() / b.norm()
        assert rel < 1e-2, f"{name}: relative error {rel:.2e}"


@pytest.mark.parametrize("split_tail", [False, True])
def test_rising_scores_rescale_mid_loop(split_tail: bool) -> None:
    """Dense keys scaled up item by item: later tiles raise the running max by more than 2^128, so
    a forward that failed to rescale after its first tile would overflow fp32; the output still
    equals the reference."""
    T, n_items, D = 3, 40, 16
    q, k, v, do = _inputs(2, 1, n_items, T, D, torch.float32, seed=31)
    growth = torch.arange(n_items, dtype=torch.float32).repeat_interleave(T).view(1, 1, -1, 1).to(DEVICE)
    k = k.abs() * (1.0 + growth)  # [B, H, S, D]: scores grow ~linearly with the key's item
    q = q.abs()
    lengths = torch.tensor([n_items, 29], dtype=torch.int32, device=DEVICE)
    cfg = ItemBlockConfig(block_m=16, block_n=16, split_tail=split_tail)
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths, T, 0, 0, config=cfg)
    scores = (q.cpu() @ k.cpu().transpose(-1, -2)) * 1.4426950408889634 / D ** 0.5
    # the max rises past 2^128 (fp32 overflow for a stale max) after the first tile
    assert scores.amax() - scores[..., :16 * T:T].amax() > 200
    assert torch.isfinite(out).all()
    assert ((out.cpu() - ref).abs().max() / ref.abs().max()) < 1e-4
    for name, g, gr in zip("qkv", grads, grads_ref):
        assert ((g.cpu() - gr).abs().max() / gr.abs().max()) < 1e-4, f"d{name}"


@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    T=st.sampled_from([1, 2, 3, 5]),
    n_items=st.integers(1, 30),
    flags=st.tuples(*[st.booleans() for _ in range(4)]),
    tiles=st.tuples(*[st.sampled_from([16, 32]) for _ in range(7)]),
    data=st.data(),
)
def test_random_config_fp32_matches_reference(T, n_items, flags, tiles, data) -> None:
    gather, split, fuse, fuse_sid = flags
    cfg = ItemBlockConfig(
        block_m=tiles[0], block_n=tiles[1], gather_dense=gather, split_tail=split, fuse_delta=fuse, fuse_sid_kv=fuse_sid,
        dq_block_m=tiles[2], dq_block_n=tiles[3], kv_block_i=tiles[4], kv_block_q=tiles[5], sid_block_m=tiles[6],
    )
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, n_items), min_size=2, max_size=2)), dtype=torch.int32)
    q, k, v, do = _inputs(2, 1, n_items, T, 16, torch.float32, seed=data.draw(st.integers(0, 2**16)))
    out, grads, ref, grads_ref = _run_both(q, k, v, do, lengths.to(DEVICE), T, 0, 0, config=cfg)
    assert (out.cpu() - ref).abs().max() < 1e-4
    for name, g, gr in zip("qkv", grads, grads_ref):
        assert (g.cpu() - gr).abs().max() < 1e-4, f"d{name}"


def test_config_is_validated() -> None:
    q = torch.randn(1, 1, 6, 16, device=DEVICE)
    lengths = torch.tensor([2], device=DEVICE)
    with pytest.raises(ValueError, match="num_warps"):
        ItemBlockConfig(num_warps=3)
    with pytest.raises(ValueError, match="kv_block_i"):
        ItemBlockConfig(kv_block_i=0)
    with pytest.raises(ValueError, match="sm90_dq: block_n must equal block_m"):
        ItemBlockConfig(sm90_dq=(64, 32, 4, 2))
    with pytest.raises(ValueError, match="register-operand"):
        ItemBlockConfig(sm90_fwd=(64, 64, 4, 2, 3))
    with pytest.raises(ValueError, match="config"):
        item_block_attention(q, q, q, lengths, 3, block_m=32, config=ItemBlockConfig())
    with pytest.raises(ValueError, match="config"):
        item_block_attention_fwd(q, q, q, lengths, 3, num_warps=8, config=ItemBlockConfig())
    assert ItemBlockConfig().replace(split_tail=True) == ItemBlockConfig(split_tail=True)


# ---- the same kernels as torch custom ops (what a compiled training forward calls): registration
# checked by torch.library.opcheck; inside torch.compile they equal the PyTorch twin, fwd and bwd


def _op_inputs(seed: int, B: int = 2, H: int = 2, n: int = 5, T: int = 3, D: int = 16):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(B, H, n * T, D, generator=g).to(DEVICE) for _ in range(4)]
    lengths = torch.randint(0, n + 1, (B,), generator=g).to(DEVICE)
    return xs, lengths, T


def test_opcheck_forward_op() -> None:
    (q, k, v, _), lengths, T = _op_inputs(0)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    torch.library.opcheck(torch.ops.genrec.item_block_fwd.default, (q, k, v, lengths, T, 0.25),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@pytest.mark.parametrize("seed", range(3))
def test_compiled_op_equals_reference_forward_and_backward(seed: int) -> None:
    (q, k, v, do), lengths, T = _op_inputs(seed)
    f = torch.compile(lambda q, k, v: item_block_attention(q, k, v, lengths, T), backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    got_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    out = f(*got_in)
    ref = item_block_attention_ref(*ref_in, lengths, T)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    g_got = torch.autograd.grad(out, got_in, do)
    g_ref = torch.autograd.grad(ref, ref_in, do)
    for name, a, b in zip("qkv", g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"d{name}")
