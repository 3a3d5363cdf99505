"""One-launch Triton diverse beam selection vs the rescan-everything reference (PinGER §decoding).

Under the CPU interpreter: TRITON_INTERPRET must be set before triton is imported, hence the
module-level setdefault. Exact equality of the picked indices, ties included: scores come
from a small set (plain ties), with values one ulp apart (ties only after the penalty's
rounding), -inf entries (rows that run dry), all four score dtypes.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

from genrec.decode.beam import select_diverse, select_diverse_reference  # noqa: E402
from genrec.kernels import beam_select  # noqa: E402
from genrec.kernels.beam_select import select_diverse_triton, supports  # noqa: E402

_INTERPRETED = type(beam_select._select_diverse_kernel).__name__ == "InterpretedFunction"
needs_triton = pytest.mark.skipif(
    not (_INTERPRETED or torch.cuda.is_available()),
    reason="genrec.kernels.beam_select was imported before TRITON_INTERPRET=1 was set and there is no GPU",
)
DEVICE = "cpu" if _INTERPRETED or not torch.cuda.is_available() else "cuda"
INF = math.inf

# 0, -1 and its fp32 neighbour, -1 and its fp16/bf16 neighbours, -2.5, -inf: plain ties and
# ties that only appear once λ·pen is subtracted and the result rounded
VALUES = [0.0, -1.0, -1.0000001, -1.0009765625, -1.0078125, -2.5, -INF]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _prefixes(rng: np.random.Generator, b: int, wc: int, d: int, n_codes: int = 3) -> torch.Tensor:
    """int64 [b, wc, d], distinct within a row (as beam search guarantees)."""
    space = np.array(list(itertools.product(range(n_codes), repeat=d)), dtype=np.int64).reshape(n_codes**d, d)
    return torch.stack([torch.from_numpy(space[rng.permutation(len(space))[:wc]]) for _ in range(b)])


def _check(cand: torch.Tensor, prefix: torch.Tensor, n_keep: int, lam: float, penalty: str) -> torch.Tensor:
    ref = select_diverse_reference(cand, prefix, n_keep, lam, penalty)  # type: ignore[arg-type]
    got = select_diverse_triton(cand.to(DEVICE), prefix.to(DEVICE), n_keep, lam, penalty)  # type: ignore[arg-type]
    assert got.dtype == torch.int64 and got.shape == ref.shape
    assert torch.equal(got.cpu(), ref), f"\ntriton    {got.tolist()}\nreference {ref.tolist()}"
    return ref


@needs_triton
@settings(max_examples=80, deadline=None)
@given(
    b=st.integers(1, 3), wc=st.integers(1, 6), k=st.integers(1, 5), d=st.integers(0, 3),
    lam=st.sampled_from([0.0, 0.5, 1.0, 1.5, 3.0]), penalty=st.sampled_from(["sum", "max"]),
    dtype=st.sampled_from(DTYPES), p_inf=st.sampled_from([0.0, 0.3, 0.7, 1.0]), seed=st.integers(0, 2**31 - 1),
)
def test_triton_equals_reference(b, wc, k, d, lam, penalty, dtype, p_inf, seed) -> None:
    rng = np.random.default_rng(seed)
    wc = 1 if d == 0 else min(wc, 3**d)
    cand = torch.tensor(rng.choice(VALUES[:-1], size=(b, wc, k)), dtype=torch.float64)
    cand = cand.masked_fill(torch.from_numpy(rng.random((b, wc, k)) < p_inf), -INF).to(dtype)  # [B, Wc, K]
    prefix = _prefixes(rng, b, wc, d)
    n_keep = int(rng.integers(1, wc * k + 1))  # often more than the finite candidates
    ref = _check(cand, prefix, n_keep, lam, penalty)
    assert all(len(set(r)) == n_keep for r in ref.tolist())
    # the torch loop (the CPU path of select_diverse) is held to the same reference here
    assert torch.equal(select_diverse(cand, prefix, n_keep, lam, penalty), ref)  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize(("dtype", "penalty"), [(torch.float32, "sum"), (torch.float64, "max"), (torch.float16, "sum"), (torch.bfloat16, "sum")])
def test_triton_medium_shapes(dtype: torch.dtype, penalty: str) -> None:
    """More parents than a warp, K not a power of two, d = 2 with shared first levels."""
    rng = np.random.default_rng(7)
    b, wc, k, d = 2, 40, 13, 2
    cand = torch.tensor(np.round(rng.normal(size=(b, wc, k)) * 2) / 2 - 3.0)  # [B, Wc, K] half-steps: many ties
    cand = cand.masked_fill(torch.from_numpy(rng.random((b, wc, k)) < 0.4), -INF).to(dtype)
    _check(cand, _prefixes(rng, b, wc, d, n_codes=8), 60, 0.75, penalty)


@needs_triton
@pytest.mark.parametrize(("dtype", "below_one"), [
    (torch.float32, -1.0000001), (torch.float64, -1.0000000000000002), (torch.float16, -1.0009765625), (torch.bfloat16, -1.0078125),
])
def test_rounding_tie_inside_a_parent_takes_the_lower_code(dtype: torch.dtype, below_one: float) -> None:
    """-1 - 1.5 and (-1 minus one ulp) - 1.5 both round to -2.5 (half-way, to even) in every
    dtype: the reference's argmax then takes code 0 (the LOWER raw score), not the parent's
    best raw child."""
    cand = torch.tensor([[[below_one, -1.0], [0.0, -INF]]], dtype=torch.float64).to(dtype)  # [1, 2, 2]
    assert cand[0, 0, 0] < cand[0, 0, 1]
    prefix = torch.tensor([[[0, 0], [0, 1]]])  # share one level: parent 0 pays 1.5 after the first pick
    assert _check(cand, prefix, 3, 1.5, "sum").tolist() == [[2, 0, 1]]
    assert select_diverse(cand, prefix, 3, 1.5).tolist() == [[2, 0, 1]]


@needs_triton
def test_only_minus_inf_left_takes_lowest_untaken_flat_index() -> None:
    cand = torch.full((2, 3, 3), -INF)  # [2, 3, 3]
    cand[0, 2, 1] = -1.0
    cand[1, 1, 2] = 0.0
    prefix = torch.tensor([[[0], [1], [2]], [[2], [0], [1]]])
    assert _check(cand, prefix, 9, 0.5, "sum").tolist() == [[7, 0, 1, 2, 3, 4, 5, 6, 8], [5, 0, 1, 2, 3, 4, 6, 7, 8]]
    _check(cand, prefix, 4, 0.0, "max")


# ---------------------------------------------------------------------------- the paper's example
A, B, C = (12, 7), (12, 9), (40, 3)


def _example(a: list[float], b: list[float], c: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    cand = torch.full((1, 3, 4), -INF, dtype=torch.float64)  # [B=1, Wc=3 parents, K=4]
    for w, sc in enumerate((a, b, c)):
        cand[0, w, : len(sc)] = torch.tensor(sc, dtype=torch.float64)
    return cand, torch.tensor([[A, B, C]], dtype=torch.int64)  # [1, 3, 2]


def _picked(idx: torch.Tensor) -> list[tuple[str, int]]:
    return [("ABC"[int(j) // 4], int(j) % 4) for j in idx[0]]


@needs_triton
@pytest.mark.parametrize("penalty", ["sum", "max"])
def test_paper_worked_example(penalty: str) -> None:
    """PinGER: after a child of A=(12,7) is picked, B=(12,9)'s children pay λ×1, C=(40,3)'s nothing,
    A's other children λ×2 (same cases as tests/decode/test_decode_beam.py)."""
    cases = [
        (([-1.0, -1.1], [-1.2], [-1.4]), 0.5, [("A", 0), ("C", 0)]),
        (([-1.0, -1.1], [-1.2], [-1.4]), 0.0, [("A", 0), ("A", 1)]),
        (([-1.0, -1.1], [-1.2], [-1.8]), 0.5, [("A", 0), ("B", 0)]),
        (([-1.0, -1.01], [-2.5], [-2.2]), 0.5, [("A", 0), ("A", 1)]),
        (([-1.0, -3.0], [-1.25], [-1.75]), 0.5, [("A", 0), ("B", 0)]),  # B - λ ties C: B comes first
    ]
    for scores, lam, want in cases:
        cand, prefix = _example(*scores)
        assert _picked(_check(cand, prefix, 2, lam, penalty)) == want


@needs_triton
def test_penalties_add_up_over_picks_sum_vs_max() -> None:
    cand, prefix = _example([-1.0, -1.05, -1.1], [-1.9], [-5.0])
    assert _picked(_check(cand, prefix, 3, 0.5, "sum")) == [("A", 0), ("A", 1), ("B", 0)]
    assert _picked(_check(cand, prefix, 3, 0.5, "max")) == [("A", 0), ("A", 1), ("A", 2)]


def test_unsupported_calls_are_refused() -> None:
    cand, prefix = torch.zeros(1, 2, 3), torch.zeros(1, 2, 1, dtype=torch.int64)
    assert supports(cand, prefix, 6, 0.5)
    assert not supports(cand, prefix, 7, 0.5)  # n_keep > Wc*K
    assert not supports(cand, prefix, 2, math.inf)
    assert not supports(cand.to(torch.int32), prefix, 2, 0.5)
    assert not supports(torch.zeros(1, 2, beam_select.MAX_BLOCK + 1), prefix, 2, 0.5)
    with pytest.raises(ValueError, match="unsupported"):
        select_diverse_triton(cand, prefix, 7, 0.5)


# ---------------------------------------------------------------------------- GPU, compiled kernel
def _gpu_inputs(b: int, wc: int, k: int, seed: int, dtype: torch.dtype, quantise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    beam = torch.randn(b, wc, 1, generator=g) - 5.0
    cand = beam + torch.log_softmax(torch.randn(b, wc, k, generator=g) * 2, dim=2)  # [B, Wc, K]
    if quantise:  # many exact ties
        cand = torch.round(cand * 4) / 4
    cand = cand.masked_fill(torch.rand(b, wc, k, generator=g) < 0.5, -INF).to(dtype)
    rng = np.random.default_rng(seed)
    prefix = _prefixes(rng, b, wc, 2, n_codes=16)  # [B, Wc, 2]: ~12 parents share each first code
    return cand, prefix


@pytest.mark.gpu
@pytest.mark.skipif(_INTERPRETED, reason="tests the compiled kernel: run with TRITON_INTERPRET=0")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quantise", [False, True])
def test_gpu_kernel_equals_reference_w200_k256(dtype: torch.dtype, quantise: bool) -> None:
    cand, prefix = _gpu_inputs(4, 200, 256, seed=3, dtype=dtype, quantise=quantise)
    for lam, penalty in [(0.0, "sum"), (0.3, "sum"), (0.3, "max"), (2.0, "sum")]:
        ref = select_diverse_reference(cand, prefix, 200, lam, penalty)  # type: ignore[arg-type]
        got = select_diverse_triton(cand.cuda(), prefix.cuda(), 200, lam, penalty)  # type: ignore[arg-type]
        assert torch.equal(got.cpu(), ref), (dtype, quantise, lam, penalty)
    # a row with fewer finite candidates than n_keep
    sparse = torch.full_like(cand, -INF)
    sparse[:, :3, :5] = cand[:, :3, :5]
    ref = select_diverse_reference(sparse, prefix, 200, 0.3)
    assert torch.equal(select_diverse_triton(sparse.cuda(), prefix.cuda(), 200, 0.3).cpu(), ref)


@pytest.mark.gpu
@pytest.mark.skipif(_INTERPRETED, reason="tests the compiled kernel: run with TRITON_INTERPRET=0")
def test_gpu_select_diverse_dispatches_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    cand, prefix = _gpu_inputs(3, 200, 256, seed=5, dtype=torch.float32, quantise=True)
    ref = select_diverse_reference(cand, prefix, 200, 0.5)
    calls = []
    real = beam_select.select_diverse_triton
    monkeypatch.setattr(beam_select, "select_diverse_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    assert torch.equal(select_diverse(cand.cuda(), prefix.cuda(), 200, 0.5).cpu(), ref)
    assert calls == [1]
    monkeypatch.setenv("GENREC_BEAM_SELECT", "torch")  # forced off: the torch loop, same result
    assert torch.equal(select_diverse(cand.cuda(), prefix.cuda(), 200, 0.5).cpu(), ref)
    assert calls == [1]
