"""Temperature sampling of SID beams: the diversity baseline PinGER compares against and rejects.

PinGER §decoding ("beam 为什么要加多样性惩罚"): the usual remedy for beams collapsing onto a
few first-level codes is temperature sampling, which the paper finds loses on both counts
(at T=1.5 fewer distinct first-level codes survive, and many generated SIDs do not
exist) because sampling changes the selection but not the scores. This module exists to
reproduce that comparison.

Definition used here (non-standard details): at every level the W survivors are drawn
*without replacement* from all (beam, code) candidates of a row with probability
∝ softmax(candidate score / T), where the candidate score is the cumulative log-prob of
the extended prefix (so the draw is ∝ p(prefix)^(1/T)). Drawing without replacement is
done with the Gumbel-top-k trick (add i.i.d. Gumbel noise to score/T, take top-W), which
has the same law as sequential sampling without replacement. Kept beams carry their raw
log-probs; the final beams are sorted by them. T → 0 gives plain beam search; ``seed``
makes runs reproducible on a given device. A trie constrains sampling like beam search
(``constrain=True``) or only reports ``valid`` (``constrain=False``, the paper's setting).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from genrec.decode.beam import BeamResult, Selector, StepFn, _check_args, advance_state, finalize, init_state
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError


def gumbel_topk_selector(temperature: float, generator: torch.Generator) -> Selector:
    """Selector drawing ``n_keep`` candidates without replacement ∝ softmax(cand / T)."""

    def select(cand: torch.Tensor, prefix: torch.Tensor, n_keep: int) -> torch.Tensor:
        flat = cand.reshape(cand.shape[0], -1)  # [B, C]
        u = torch.rand(flat.shape, generator=generator, device=flat.device, dtype=torch.float64)
        gumbel = -torch.log(-torch.log(u.clamp(min=1e-300)))  # [B, C] standard Gumbel
        key = flat.to(torch.float64) / temperature + gumbel  # -inf stays -inf: never drawn before finite ones
        return torch.topk(key, n_keep, dim=1).indices  # [B, n_keep]

    return select


def temperature_sampling(
    step_fn: StepFn,
    batch_size: int,
    levels: int,
    codebook_sizes: Sequence[int],
    beam_width: int,
    *,
    temperature: float = 1.0,
    seed: int = 0,
    trie: TorchTrie | None = None,
    constrain: bool = True,
    device: torch.device | str = "cpu",
) -> BeamResult:
    """Decode like :func:`genrec.decode.beam.beam_search` but draw the survivors at every level
    (see module docstring). Result beams are sorted by cumulative log-prob, descending."""
    _check_args(levels, codebook_sizes, beam_width, trie)
    if not temperature > 0.0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")
    dev = torch.device(device)
    generator = torch.Generator(device=dev)
    generator.manual_seed(int(seed))
    select = gumbel_topk_selector(temperature, generator)
    state = init_state(batch_size, dev, trie=trie)
    for _ in range(levels):
        logprobs = step_fn(state.prefix)
        state, _ = advance_state(state, logprobs, beam_width, select, trie=trie, constrain=constrain)
    order = torch.sort(state.scores, dim=1, descending=True, stable=True).indices  # [B, W']
    state.prefix = torch.gather(state.prefix, 1, order[:, :, None].expand_as(state.prefix))
    state.scores = torch.gather(state.scores, 1, order)
    if state.nodes is not None:
        state.nodes = torch.gather(state.nodes, 1, order)
    return finalize(state, beam_width, trie=trie)
