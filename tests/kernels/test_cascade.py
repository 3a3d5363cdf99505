"""Cascade attention (shared history + per-beam suffix, LSE merge) vs the per-beam slow twin."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

from genrec.kernels import cascade  # noqa: E402
from genrec.kernels.cascade import cascade_attention, cascade_attention_torch, cascade_attention_triton  # noqa: E402
from genrec.kernels.reference import cascade_attention_ref  # noqa: E402

_INTERPRETED = type(cascade._cascade_fwd_kernel).__name__ == "InterpretedFunction"
needs_triton = pytest.mark.skipif(
    not (_INTERPRETED or torch.cuda.is_available()),
    reason="genrec.kernels.cascade was imported before TRITON_INTERPRET=1 was set and there is no GPU",
)
DEVICE = "cpu" if _INTERPRETED or not torch.cuda.is_available() else "cuda"


def _inputs(B: int, W: int, H: int, t: int, n: int, D: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, ks, vs = (torch.randn(B, W, H, t, D, generator=g).to(dtype) for _ in range(3))
    kh, vh = (torch.randn(B, H, n, D, generator=g).to(dtype) for _ in range(2))
    return q, kh, vh, ks, vs


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 2), W=st.integers(1, 6), H=st.integers(1, 2), t=st.integers(1, 4),
    n=st.integers(0, 12), D=st.sampled_from([8, 16]), data=st.data(),
)
def test_torch_cascade_matches_reference_fwd_bwd(B, W, H, t, n, D, data) -> None:
    hist_len = torch.tensor(data.draw(st.lists(st.integers(0, n), min_size=B, max_size=B)))
    xs = [x.requires_grad_() for x in _inputs(B, W, H, t, n, D, torch.float32, data.draw(st.integers(0, 2**16)))]
    out = cascade_attention_torch(*xs, hist_len)
    ref = cascade_attention_ref(*xs, hist_len)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    do = torch.randn_like(out)
    for name, a, b in zip(["q", "k_hist", "v_hist", "k_suf", "v_suf"], torch.autograd.grad(out, xs, do), torch.autograd.grad(ref, xs, do)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"d{name}: {m}")


@needs_triton
@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    B=st.integers(1, 2), W=st.integers(1, 12), H=st.integers(1, 2), t=st.sampled_from([1, 2, 3, 5]),
    n=st.integers(0, 40), D=st.sampled_from([16, 32]), block_m=st.sampled_from([16, 32]), data=st.data(),
)
def test_triton_cascade_matches_reference_fp32(B, W, H, t, n, D, block_m, data) -> None:
    hist_len = torch.tensor(data.draw(st.lists(st.integers(0, n), min_size=B, max_size=B)))
    xs = _inputs(B, W, H, t, n, D, torch.float32, data.draw(st.integers(0, 2**16)))
    out = cascade_attention_triton(*(x.to(DEVICE) for x in xs), hist_len.to(DEVICE), block_m=block_m, block_n=16)
    assert (out.cpu() - cascade_attention_ref(*xs, hist_len)).abs().max() < 1e-4


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_cascade_half_precision(dtype: torch.dtype) -> None:
    xs = _inputs(2, 10, 2, 3, 37, 32, dtype, seed=4)
    hist_len = torch.tensor([37, 20])
    out = cascade_attention_triton(*(x.to(DEVICE) for x in xs), hist_len.to(DEVICE), block_m=16, block_n=16)
    ref = cascade_attention_ref(*(x.float() for x in xs), hist_len)
    assert out.dtype == dtype
    rel = (out.float().cpu() - ref).norm() / ref.norm()
    assert rel < (1e-2 if dtype == torch.bfloat16 else 3e-3), f"relative error {rel:.2e}"


@needs_triton
def test_triton_cascade_overwrites_poisoned_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cascade, "_empty", lambda like: torch.full_like(like, float("nan")))
    xs = _inputs(2, 7, 2, 3, 19, 16, torch.float32, seed=9)
    hist_len = torch.tensor([19, 0])
    out = cascade_attention_triton(*(x.to(DEVICE) for x in xs), hist_len.to(DEVICE), block_m=16, block_n=16)
    assert not torch.isnan(out).any()
    assert (out.cpu() - cascade_attention_ref(*xs, hist_len)).abs().max() < 1e-4


def test_dispatch_uses_torch_path_with_grad_or_on_cpu() -> None:
    xs = [x.requires_grad_() for x in _inputs(1, 3, 1, 2, 5, 16, torch.float32, seed=2)]
    out = cascade_attention(*xs, torch.tensor([4]))
    assert out.grad_fn is not None  # the differentiable PyTorch path
    torch.testing.assert_close(out, cascade_attention_ref(*xs, torch.tensor([4])), atol=1e-5, rtol=1e-5)


def test_cascade_rejects_bad_input() -> None:
    q, kh, vh, ks, vs = _inputs(1, 2, 1, 3, 5, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="hist_len"):
        cascade_attention_torch(q, kh, vh, ks, vs, torch.tensor([6]))
    with pytest.raises(ValueError, match="k_suf"):
        cascade_attention_torch(q, kh, vh, ks[:, :1], vs, torch.tensor([5]))
    with pytest.raises(ValueError, match="head dim"):
        bad = _inputs(1, 2, 1, 3, 5, 8, torch.float32, seed=0)
        cascade_attention_triton(*bad, torch.tensor([5]))
