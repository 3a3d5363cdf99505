"""Count-min sketch: (ε, δ) guarantee on a Zipf stream, parity with a slow pure-Python twin."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from genrec.errors import ConfigError
from genrec.model.sketch import CountMinSketch, cms_dims

P = (1 << 31) - 1


def slow_bucket(x: int, a: list[int], b: int, width: int) -> int:
    """The documented hash, in Python big ints: ((a · limbs(x) + b) mod p) mod width."""
    u = x % (1 << 64)  # two's complement view of int64
    limbs = [u & ((1 << 22) - 1), (u >> 22) & ((1 << 22) - 1), (u >> 44) & ((1 << 20) - 1)]
    return ((sum(ai * li for ai, li in zip(a, limbs)) + b) % P) % width


def slow_estimates(stream: list[int], query: list[int], sk: CountMinSketch) -> list[float]:
    tables = [[0] * sk.width for _ in range(sk.depth)]
    for x in stream:
        for r in range(sk.depth):
            tables[r][slow_bucket(x, sk.hash_a[r].tolist(), int(sk.hash_b[r]), sk.width)] += 1
    return [float(min(tables[r][slow_bucket(q, sk.hash_a[r].tolist(), int(sk.hash_b[r]), sk.width)]
                      for r in range(sk.depth))) for q in query]


def test_dims_follow_the_formula() -> None:
    assert cms_dims(0.01, 0.01) == (math.ceil(math.e / 0.01), math.ceil(math.log(100)))
    assert cms_dims(0.001, 0.05) == (2719, 3)
    with pytest.raises(ConfigError, match="epsilon"):
        cms_dims(0.0, 0.1)
    with pytest.raises(ConfigError, match="delta"):
        cms_dims(0.1, 1.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zipf_stream_guarantee(seed: int) -> None:
    eps, delta = 0.002, 0.05
    rng = np.random.default_rng(seed)
    # skewed stream: Zipf(1.2) over a large id space, with big random 64-bit-ish ids
    ranks = rng.zipf(1.2, size=100_000)
    ranks = ranks[ranks < 20_000]
    id_of_rank = rng.integers(-(2**62), 2**62, size=20_000)
    stream = torch.from_numpy(id_of_rank[ranks])
    sk = CountMinSketch.from_error(eps, delta, seed=seed)
    for chunk in stream.split(7_000):  # vectorised, several calls
        sk.add(chunk)
    N = stream.numel()
    assert sk.total == N
    truth = Counter(stream.tolist())
    items = torch.tensor(list(truth.keys()))
    true_counts = torch.tensor([truth[i] for i in items.tolist()], dtype=torch.float64)
    est = sk.estimate(items)
    assert bool((est >= true_counts).all()), "count-min must never under-count"
    violations = (est - true_counts > eps * N).double().mean().item()
    assert violations <= delta
    # heavy hitters are close to exact (relative error small)
    top = true_counts.argmax()
    assert est[top] - true_counts[top] <= eps * N


def test_matches_slow_twin_on_random_stream() -> None:
    rng = np.random.default_rng(7)
    stream = rng.integers(-(2**63), 2**63 - 1, size=300).tolist() + [5, 5, 5, -1, -1]
    sk = CountMinSketch(width=37, depth=4, seed=3)
    sk.add(torch.tensor(stream))
    query = stream[:50] + [123456789, -987654321]
    assert sk.estimate(torch.tensor(query)).tolist() == slow_estimates(stream, query, sk)


@settings(max_examples=30, deadline=None)
@given(stream=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=0, max_size=60),
       width=st.integers(1, 16), depth=st.integers(1, 4), seed=st.integers(0, 1000))
def test_never_undercounts_and_equals_twin(stream: list[int], width: int, depth: int, seed: int) -> None:
    sk = CountMinSketch(width, depth, seed)
    sk.add(torch.tensor(stream, dtype=torch.int64))
    query = list(set(stream))[:20]
    est = sk.estimate(torch.tensor(query, dtype=torch.int64)).tolist()
    c = Counter(stream)
    assert all(e >= c[q] for e, q in zip(est, query))
    assert est == slow_estimates(stream, query, sk)


def test_weights_decay_and_merge() -> None:
    sk = CountMinSketch(width=1000, depth=3, seed=0)
    sk.add(torch.tensor([1, 2, 3]), weights=torch.tensor([2.0, 0.5, 1.0]))
    sk.decay(0.5)
    assert sk.total == pytest.approx(1.75)
    est = sk.estimate(torch.tensor([1, 2, 3]))
    assert bool((est >= torch.tensor([1.0, 0.25, 0.5], dtype=torch.float64)).all())
    other = CountMinSketch(width=1000, depth=3, seed=0)
    other.add(torch.tensor([1]))
    sk.merge(other)
    assert sk.estimate(torch.tensor([1])).item() >= 2.0
    with pytest.raises(ValueError, match="same width"):
        sk.merge(CountMinSketch(width=999, depth=3, seed=0))
    with pytest.raises(ValueError, match="non-negative"):
        sk.add(torch.tensor([1]), weights=torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="decay factor"):
        sk.decay(0.0)
    with pytest.raises(TypeError, match="integer"):
        sk.add(torch.tensor([1.5]))


def test_log_q_frequency_order_and_bounds() -> None:
    sk = CountMinSketch(width=4096, depth=4, seed=0)
    assert sk.log_q(torch.tensor([1, 2])).tolist() == [0.0, 0.0]  # nothing seen: no correction
    sk.add(torch.tensor([1] * 80 + [2] * 15 + [3] * 5))
    lq = sk.log_q(torch.tensor([[1, 2], [3, 99]]), n_sampled=1)
    assert lq.shape == (2, 2) and lq.dtype == torch.float32
    assert lq[0, 0].item() == pytest.approx(math.log(0.80), abs=1e-6)
    assert lq[0, 1].item() == pytest.approx(math.log(0.15), abs=1e-6)
    assert lq[1, 1].item() == pytest.approx(math.log(1 / 100), abs=1e-6)  # unseen -> min_count 1
    assert sk.log_q(torch.tensor([1]), n_sampled=10).item() == 0.0  # clipped at Q = 1


def test_state_dict_roundtrip_through_safetensors(tmp_path) -> None:
    sk = CountMinSketch(width=50, depth=3, seed=9)
    sk.add(torch.randint(0, 1000, (500,)))
    save_file(sk.state_dict(), str(tmp_path / "cms.safetensors"))
    back = CountMinSketch.from_state_dict(load_file(str(tmp_path / "cms.safetensors")))
    q = torch.arange(1000)
    assert torch.equal(back.estimate(q), sk.estimate(q))
    assert back.total == sk.total and back.seed == 9
    wrong = CountMinSketch(width=51, depth=3)
    with pytest.raises(ValueError, match="width"):
        wrong.load_state_dict(sk.state_dict())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_device_sketch_equals_the_cpu_sketch(device: str) -> None:
    """The sketch on a device (updates and queries with no host round trip) answers exactly
    like the CPU sketch, including before any update (zeros) and after a state-dict trip."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(5)
    ref, dev = CountMinSketch(97, 4, seed=3), CountMinSketch(97, 4, seed=3).to(device)
    probe = torch.randint(-10**12, 10**12, (300,), generator=g)
    assert torch.equal(dev.log_q(probe.to(device), n_sampled=7).cpu(), ref.log_q(probe, n_sampled=7))
    for _ in range(5):
        ids = torch.randint(0, 500, (400,), generator=g)
        ref.add(ids)
        dev.add(ids.to(device))
    assert dev.device.type == device and dev.total == ref.total
    assert torch.equal(dev.estimate(probe.to(device)).cpu(), ref.estimate(probe))
    assert torch.equal(dev.log_q(probe.to(device), n_sampled=7).cpu(), ref.log_q(probe, n_sampled=7))
    back = CountMinSketch(97, 4, seed=0).to(device)
    back.load_state_dict(dev.state_dict())
    assert torch.equal(back.estimate(probe).cpu(), ref.estimate(probe))
