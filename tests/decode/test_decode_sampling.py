"""Temperature sampling: its draw law, determinism, the T -> 0 limit, constraints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_decode_beam import as_step_fn, random_model
from test_decode_trie_torch import make_trie, random_table

from genrec.decode import beam_search, temperature_sampling
from genrec.errors import ConfigError


def test_seed_makes_runs_reproducible() -> None:
    ks = [6, 6, 6]
    step = as_step_fn(random_model(ks, 0, scale=0.5))
    r1 = temperature_sampling(step, 2, 3, ks, 8, temperature=1.5, seed=3)
    r2 = temperature_sampling(step, 2, 3, ks, 8, temperature=1.5, seed=3)
    r3 = temperature_sampling(step, 2, 3, ks, 8, temperature=1.5, seed=4)
    assert torch.equal(r1.codes, r2.codes) and torch.equal(r1.scores, r2.scores)
    assert not torch.equal(r1.codes, r3.codes)
    assert (r1.scores[:, :-1] >= r1.scores[:, 1:]).all()  # sorted by raw log-prob


def test_tiny_temperature_is_plain_beam_search() -> None:
    ks = [5, 4, 5]
    step = as_step_fn(random_model(ks, 2))
    samp = temperature_sampling(step, 3, 3, ks, 7, temperature=1e-6, seed=0)
    beam = beam_search(step, 3, 3, ks, 7)
    assert torch.equal(samp.codes, beam.codes)
    torch.testing.assert_close(samp.scores, beam.scores)


@pytest.mark.parametrize("temperature", [0.5, 1.5])
def test_first_draw_follows_tempered_softmax(temperature: float) -> None:
    """One level, W=1: the kept code is distributed as softmax(logp / T)."""
    logp = torch.log_softmax(torch.tensor([1.0, 0.0, -0.5, -2.0], dtype=torch.float64), 0)
    n = 20000
    res = temperature_sampling(
        lambda p: logp.expand(p.shape[0], p.shape[1], 4), n, 1, [4], 1, temperature=temperature, seed=1
    )
    freq = np.bincount(res.codes[:, 0, 0].numpy(), minlength=4) / n
    want = torch.softmax(logp / temperature, 0).numpy()
    np.testing.assert_allclose(freq, want, atol=4 * math.sqrt(0.25 / n))


def test_two_draws_are_without_replacement_with_sequential_law() -> None:
    """W=2 of 3 codes: P(set {i, j}) = p_i p_j/(1-p_i) + p_j p_i/(1-p_j)."""
    logp = torch.log(torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64))
    n = 20000
    res = temperature_sampling(lambda p: logp.expand(p.shape[0], p.shape[1], 3), n, 1, [3], 2, temperature=1.0, seed=5)
    pairs = res.codes[:, :, 0].sort(dim=1).values.numpy()
    assert (pairs[:, 0] != pairs[:, 1]).all()
    p = [0.6, 0.3, 0.1]
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        want = p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j])
        got = np.mean((pairs[:, 0] == i) & (pairs[:, 1] == j))
        assert abs(got - want) < 4 * math.sqrt(0.25 / n), (i, j, got, want)


def test_constrained_sampling_emits_only_real_sids() -> None:
    ks = [4, 4, 4]
    codes = random_table(np.random.default_rng(9), 3, ks, 12)
    legal = {tuple(int(x) for x in r) for r in codes}
    trie = make_trie(codes, ks)
    step = as_step_fn(random_model(ks, 9, scale=0.3))
    con = temperature_sampling(step, 4, 3, ks, 6, temperature=2.0, seed=0, trie=trie)
    for b in range(4):
        for w in range(6):
            sid = tuple(int(c) for c in con.codes[b, w])
            assert con.valid[b, w] == (sid in legal)
            if math.isfinite(float(con.scores[b, w])):
                assert sid in legal
    free = temperature_sampling(step, 4, 3, ks, 6, temperature=2.0, seed=0, trie=trie, constrain=False)
    assert free.valid.float().mean() < con.valid.float().mean()  # unconstrained wastes beams


def test_bad_temperature_raises() -> None:
    with pytest.raises(ConfigError, match="temperature"):
        temperature_sampling(as_step_fn(random_model([3], 0)), 1, 1, [3], 2, temperature=0.0)
