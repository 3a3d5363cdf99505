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
from genrec.kernels.cascade import (  # noqa: E402
    NumSplits,
    cascade_attention,
    cascade_attention_torch,
    cascade_attention_triton,
    cascade_num_splits,
)
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


def _poison(mp: pytest.MonkeyPatch) -> None:
    """NaN-filled output and split scratch: every output row and every split's partial must be written."""
    mp.setattr(cascade, "_empty", lambda like: torch.full_like(like, float("nan")))
    mp.setattr(cascade, "_scratch", lambda shape, device: torch.full(shape, float("nan"), device=device))


@needs_triton
@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_triton_cascade_overwrites_poisoned_output(monkeypatch: pytest.MonkeyPatch, num_splits: int) -> None:
    _poison(monkeypatch)
    xs = _inputs(2, 7, 2, 3, 19, 16, torch.float32, seed=9)
    hist_len = torch.tensor([19, 0])
    out = cascade_attention_triton(*(x.to(DEVICE) for x in xs), hist_len.to(DEVICE), block_m=16, block_n=16, num_splits=num_splits)
    assert not torch.isnan(out).any()
    assert (out.cpu() - cascade_attention_ref(*xs, hist_len)).abs().max() < 1e-4


@needs_triton
@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    B=st.integers(1, 3), W=st.integers(1, 8), H=st.integers(1, 2), t=st.sampled_from([1, 2, 3, 5]),
    n=st.integers(0, 90), D=st.sampled_from([16, 32]), num_splits=st.sampled_from([2, 3, 5, "auto"]), data=st.data(),
)
def test_triton_cascade_split_kv_matches_reference_fp32(B, W, H, t, n, D, num_splits, data) -> None:
    # hist_len per request in [0, n]: empty histories, histories shorter than one chunk, and
    # lengths that are not a multiple of the 16-key block, so some splits see no keys at all.
    hist_len = torch.tensor(data.draw(st.lists(st.integers(0, n), min_size=B, max_size=B)))
    xs = _inputs(B, W, H, t, n, D, torch.float32, data.draw(st.integers(0, 2**16)))
    with pytest.MonkeyPatch.context() as mp:
        _poison(mp)
        mp.setattr(cascade, "_MIN_CHUNK_KEYS", 32)  # "auto" splits once n >= 64 here
        out = cascade_attention_triton(*(x.to(DEVICE) for x in xs), hist_len.to(DEVICE), block_m=16, block_n=16, num_splits=num_splits)
    assert not torch.isnan(out).any()
    assert (out.cpu() - cascade_attention_ref(*xs, hist_len)).abs().max() < 1e-4


@needs_triton
@pytest.mark.parametrize("num_splits", [2, 3, 5, "auto"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_cascade_split_kv_half_precision(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, num_splits: NumSplits) -> None:
    monkeypatch.setattr(cascade, "_MIN_CHUNK_KEYS", 32)  # let "auto" split a history the interpreter can afford
    xs = _inputs(3, 4, 2, 3, 100, 32, dtype, seed=5)
    hist_len = torch.tensor([100, 0, 45])  # 45: shorter than a chunk at S=2, not a multiple of 16
    assert cascade_num_splits(xs[0], xs[1], "auto", block_m=16, block_n=16) == 3  # auto does split here
    out = cascade_attention_triton(*(x.to(DEVICE) for x in xs), hist_len.to(DEVICE), block_m=16, block_n=16, num_splits=num_splits)
    ref = cascade_attention_ref(*(x.float() for x in xs), hist_len)
    assert out.dtype == dtype
    rel = (out.float().cpu() - ref).norm() / ref.norm()
    assert rel < (1e-2 if dtype == torch.bfloat16 else 3e-3), f"relative error {rel:.2e}"


def test_auto_num_splits_heuristic() -> None:
    def auto(B: int, W: int, H: int, t: int, n: int, D: int = 64, block_n: int = 64) -> int:
        q, kh = torch.empty(B, W, H, t, D, device="meta"), torch.empty(B, H, n, D, device="meta")
        return cascade_num_splits(q, kh, "auto", block_n=block_n)  # meta tensors: 132 SMs, as interpreted

    # The benchmark shape, 8 x 12 = 96 programs at W=10: a 1,000-key history is too short to split
    # (measured: no gain); a 16,000-key one gets 3 splits (288 >= 2 x 132 programs).
    assert auto(8, 10, 12, 3, 1000) == 1
    assert auto(8, 10, 12, 3, 16000) == 3
    # Wide W already fills the GPU: no split, however long the history.
    assert all(auto(8, W, 12, 3, 16000) == 1 for W in (60, 100, 400))
    # Chunks never shorter than _MIN_CHUNK_KEYS of the history capacity; S = 1 below that.
    min_chunk = cascade._MIN_CHUNK_KEYS
    assert auto(1, 1, 1, 3, 100 * min_chunk) == 100
    assert auto(1, 1, 1, 3, 2 * min_chunk - 1) == 1 and auto(1, 1, 1, 3, 0) == 1
    assert auto(1, 1, 1, 3, 2 * min_chunk) == 2
    assert cascade_num_splits(torch.empty(1, 1, 1, 1, 16), torch.empty(1, 1, 4, 16), 4) == 4
    for bad in (0, -1, 1.5, "two", True):
        with pytest.raises(ValueError, match="num_splits"):
            cascade_num_splits(torch.empty(1, 1, 1, 1, 16), torch.empty(1, 1, 4, 16), bad)  # type: ignore[arg-type]


def test_dispatch_uses_torch_path_with_grad_or_on_cpu() -> None:
    xs = [x.requires_grad_() for x in _inputs(1, 3, 1, 2, 5, 16, torch.float32, seed=2)]
    out = cascade_attention(*xs, torch.tensor([4]))
    assert out.grad_fn is not None  # the differentiable PyTorch path
    torch.testing.assert_close(out, cascade_attention_ref(*xs, torch.tensor([4])), atol=1e-5, rtol=1e-5)


def test_cascade_rejects_bad_input() -> None:
    q, kh, vh, ks, vs = _inputs(1, 2, 1, 3, 5, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="hist_len"):
        cascade_attention_torch(q, kh, vh, ks, vs, torch.tensor([6]))
    with pytest.raises(ValueError, match=r"hist_len: values must lie in \[0, 5\], got \[-1\]"):
        cascade_attention_torch(q, kh, vh, ks, vs, torch.tensor([-1]))
    with pytest.raises(ValueError, match="k_suf"):
        cascade_attention_torch(q, kh, vh, ks[:, :1], vs, torch.tensor([5]))
    with pytest.raises(ValueError, match="head dim"):
        bad = _inputs(1, 2, 1, 3, 5, 8, torch.float32, seed=0)
        cascade_attention_triton(*bad, torch.tensor([5]))


def test_opcheck_cascade_op() -> None:
    """The op that torch.compile calls in place of the Triton launch: schema and fake tensor checked,
    and its output the twin's (here under the interpreter on the CPU)."""
    q, kh, vh, ks, vs = (x.to(DEVICE) for x in _inputs(2, 3, 2, 2, 9, 16, torch.float32, seed=4))
    hl = torch.tensor([9, 4], device=DEVICE)
    torch.library.opcheck(torch.ops.genrec.cascade_fwd.default, (q, kh, vh, ks, vs, hl, 0.25, 1),
                          test_utils=("test_schema", "test_faketensor"))
    for splits in (1, 2):
        out = torch.ops.genrec.cascade_fwd(q, kh, vh, ks, vs, hl, 0.25, splits)
        torch.testing.assert_close(out, cascade_attention_torch(q, kh, vh, ks, vs, hl, 0.25), atol=1e-5, rtol=1e-5)


def test_compiled_cascade_is_one_graph_around_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traced by torch.compile, cascade_attention calls the op (one graph, no break), and the compiled
    function equals the twin. The dispatch sends only CUDA tensors there, so on the CPU the test lets
    it take CPU tensors (the interpreter runs the kernel)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    q, kh, vh, ks, vs = (x.to(DEVICE) for x in _inputs(2, 4, 2, 1, 7, 16, torch.float32, seed=5))
    hl = torch.tensor([7, 3], device=DEVICE)
    monkeypatch.setattr(cascade, "_kernel_device", lambda q: True)
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    f = torch.compile(lambda q, kh, vh, ks, vs: cascade_attention(q, kh, vh, ks, vs, hl) * 2, backend=counter,
                      fullgraph=True)
    with torch.no_grad():
        out = f(q, kh, vh, ks, vs)
    torch._dynamo.reset()
    assert counter.frame_count == 1
    targets = [str(n.target) for g in counter.graphs for n in g.graph.nodes]
    assert any("cascade_fwd" in t for t in targets), targets
    torch.testing.assert_close(out, 2 * cascade_attention_torch(q, kh, vh, ks, vs, hl), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("D,kernel", [(16, True), (128, True), (24, False), (96, False), (8, False), (256, False)])
def test_dispatch_sends_only_the_kernels_head_dims_to_it(D: int, kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head dim the kernel does not take (e.g. 96: d_model 768 over 8 heads) must not raise on a GPU: it
    runs the PyTorch form, the same function. (CUDA is stood in for by letting the check see CPU tensors.)"""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q = torch.empty(1, 1, 1, 1, D)
    assert cascade._kernel_device(q) is kernel
    monkeypatch.undo()
    used: list[str] = []
    monkeypatch.setattr(cascade, "_kernel_device", lambda q: cascade.kernel_head_dim(q.shape[-1]))
    monkeypatch.setattr(cascade, "cascade_attention_triton", lambda *a, **k: used.append("triton") or
                        cascade_attention_torch(*a[:6]))
    xs = _inputs(1, 3, 1, 2, 5, D, torch.float32, seed=3)
    with torch.no_grad():
        out = cascade_attention(*xs, torch.tensor([4]))
    assert used == (["triton"] if kernel else [])
    torch.testing.assert_close(out, cascade_attention_ref(*xs, torch.tensor([4])), atol=1e-5, rtol=1e-5)
