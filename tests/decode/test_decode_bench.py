"""Constrained-step timing: batched TorchTrie mask + one beam step vs a Python-loop reference.

As a test it only checks, at a small size, that the reference it times computes the same
thing. ``python tests/decode/test_decode_bench.py [--items N] [--device cuda]`` prints the
timing table (B=16, W=100, K=256, 4 levels, 1M random items by default).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch
from test_decode_trie_torch import build_trie_arrays

from genrec.decode import TorchTrie, beam_step
from genrec.decode.beam import BeamState


def loop_valid_mask(offsets: np.ndarray, codes: np.ndarray, nodes: np.ndarray, k: int) -> torch.Tensor:
    """Reference: one Python iteration per beam over the CSR arrays."""
    mask = np.zeros((len(nodes), k), dtype=bool)
    for i, j in enumerate(nodes):
        if j >= 0:
            mask[i, codes[offsets[j] : offsets[j + 1]]] = True
    return torch.from_numpy(mask)


def loop_step(
    offsets: np.ndarray, codes: np.ndarray, scores: torch.Tensor, nodes: np.ndarray, logprobs: torch.Tensor, width: int
) -> torch.Tensor:
    """Reference beam step: per-beam masks, then per-row top-W; returns kept flat indices [B, W]."""
    b, wc, k = logprobs.shape
    out = []
    for r in range(b):
        mask = loop_valid_mask(offsets, codes, nodes[r], k)  # [Wc, K]
        cand = (scores[r, :, None] + logprobs[r]).masked_fill(~mask, float("-inf"))
        out.append(torch.topk(cand.reshape(-1), width).indices)
    return torch.stack(out)


def setup(n_items: int, ks: list[int], b: int, w: int, depth: int, seed: int = 0, device: str = "cpu"):  # noqa: ANN201
    rng = np.random.default_rng(seed)
    table = np.stack([rng.integers(0, k, size=n_items) for k in ks], axis=1)
    arrays = build_trie_arrays(table)
    trie = TorchTrie.from_arrays(arrays["offsets"], arrays["codes"], arrays["children"], ks, device)
    prefix = torch.from_numpy(table[rng.integers(0, n_items, size=b * w), :depth]).reshape(b, w, depth)  # real prefixes
    nodes = trie.walk(prefix)[..., -1]  # [B, W]
    scores = torch.randn(b, w, dtype=torch.float32)
    logprobs = torch.log_softmax(torch.randn(b, w, ks[depth]), dim=-1)
    return arrays, trie, BeamState(prefix.to(device), scores.to(device), nodes), logprobs.to(device)


def test_loop_reference_agrees_with_batched_step() -> None:
    ks = [8, 8, 8]
    for depth in range(3):
        arrays, trie, state, logprobs = setup(300, ks, b=3, w=5, depth=depth)
        off, cod = arrays["offsets"][depth], arrays["codes"][depth]
        nodes = state.nodes.numpy()
        assert torch.equal(loop_valid_mask(off, cod, nodes.reshape(-1), 8), trie.valid_mask(depth, state.nodes.reshape(-1)))
        new, parent = beam_step(state, logprobs, 5, trie=trie)
        want = loop_step(off, cod, state.scores, nodes, logprobs, 5)
        assert torch.equal(parent, want // 8) and torch.equal(new.prefix[:, :, -1], want % 8)


def _time(fn: Callable[[], object], device: str, reps: int) -> float:
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--levels", type=int, default=4)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks, b, w, dev = [args.k] * args.levels, args.batch, args.width, args.device
    print(f"B={b} W={w} K={args.k} L={args.levels} items={args.items} device={dev} threads={args.threads}")
    print("depth | layout | n_d      | mask ms | mask CSR ms | step λ=0 ms | step λ=1 ms | loop mask ms | loop step ms")
    for depth in range(1, args.levels):
        arrays, trie, state, logprobs = setup(args.items, ks, b, w, depth, device=dev)
        flat = state.nodes.reshape(-1)
        off, cod, nodes = arrays["offsets"][depth], arrays["codes"][depth], state.nodes.cpu().numpy()
        t_mask = _time(lambda: trie.valid_mask(depth, flat), dev, 20)
        t_csr = _time(lambda: trie.valid_mask(depth, flat, force_csr=True), dev, 20)
        t_step = _time(lambda: beam_step(state, logprobs, w, trie=trie), dev, 10)
        t_div = _time(lambda: beam_step(state, logprobs, w, trie=trie, diversity_lambda=1.0), dev, 3)
        t_lmask = _time(lambda: loop_valid_mask(off, cod, nodes.reshape(-1), args.k), "cpu", 5)
        t_lstep = _time(lambda: loop_step(off, cod, state.scores.cpu(), nodes, logprobs.cpu(), w), "cpu", 3)
        layout = "dense" if trie.is_dense(depth) else "CSR"
        print(
            f"{depth:5d} | {layout:6s} | {trie.n_nodes(depth):8d} | {t_mask:7.2f} | {t_csr:11.2f} | "
            f"{t_step:11.2f} | {t_div:11.2f} | {t_lmask:12.2f} | {t_lstep:12.2f}"
        )


if __name__ == "__main__":
    main()
