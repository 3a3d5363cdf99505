"""The constrained-decoding trie step as two Triton launches (PinGER §serving, "约束解码"; STATIC).

:class:`genrec.decode.trie_torch.TorchTrie` answers the two queries of one constrained decode
step with plain PyTorch ops: ``valid_mask`` (which next codes exist below each beam's node) and
``advance`` (each surviving beam's child node). On a GPU at beam 100 that is ~10–20 tiny kernels
per query: the step is launch-bound (0.57 ms measured on an H200 for a CSR level, against a
0.30 ms target). Here each query is ONE launch over the same device arrays, with the same
answers (tested equal to the torch path and to the CPU trie under the Triton interpreter).

What is non-standard:

* **valid_mask, CSR levels**: one program per queried node; it reads the node's child segment
  ``codes[offsets[j]:offsets[j+1]]`` in chunks of ``CHUNK_F`` and ORs a [CHUNK_F, BLOCK_K]
  equality test into its mask row -- no scatter, so no write races inside the program. Dense
  levels read the ``has_child`` row instead (one coalesced load).
* **advance**: a lower-bound binary search for the code inside the node's own child segment
  (codes ascend within a node), ``LOG_F`` fixed iterations for the level's largest fan-out,
  ``BLOCK`` queries per program.
* A node id outside ``[0, n_d)`` (the torch path raises on those above the range) and a code
  outside ``[0, K)`` read as "no node" / "no edge": the kernels never read out of bounds.

Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["advance_triton", "valid_mask_triton"]


@triton.jit
def _valid_mask_kernel(NODES, OFFSETS, CODES, DENSE, OUT, n_nodes, K,
                       HAS_DENSE: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK_F: tl.constexpr):
    row = tl.program_id(0)
    node = tl.load(NODES + row)
    alive = (node >= 0) & (node < n_nodes)
    safe = tl.where(alive, node, 0)
    cols = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    in_k = cols < K
    if HAS_DENSE:
        live = (tl.zeros([BLOCK_K], dtype=tl.int32) + alive.to(tl.int32)) > 0  # [BLOCK_K] (a vector mask)
        v = tl.load(DENSE + safe * K + cols, mask=in_k & live, other=0)  # [BLOCK_K] uint8
        ok = v != 0
    else:
        start = tl.load(OFFSETS + safe)
        count = tl.where(alive, tl.load(OFFSETS + safe + 1) - start, 0)
        acc = tl.zeros([BLOCK_K], dtype=tl.int32)
        for f0 in range(0, count, CHUNK_F):
            f = f0 + tl.arange(0, CHUNK_F)  # [CHUNK_F]
            fm = f < count
            c = tl.load(CODES + start + f, mask=fm, other=-1)  # [CHUNK_F]
            hit = (c[:, None] == cols[None, :]) & fm[:, None]  # [CHUNK_F, BLOCK_K]
            acc = tl.maximum(acc, tl.max(hit.to(tl.int32), axis=0))
        ok = acc > 0
    tl.store(OUT + row * K + cols, ok.to(tl.uint8), mask=in_k)


@triton.jit
def _advance_kernel(NODES, QCODES, OFFSETS, CODES, CHILDREN, OUT, N, n_nodes, K,
                    BLOCK: tl.constexpr, LOG_F: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    m = i < N
    node = tl.load(NODES + i, mask=m, other=-1)
    q = tl.load(QCODES + i, mask=m, other=-1)
    ok = m & (node >= 0) & (node < n_nodes) & (q >= 0) & (q < K)
    safe = tl.where(ok, node, 0)
    lo = tl.load(OFFSETS + safe, mask=ok, other=0)
    end = tl.load(OFFSETS + safe + 1, mask=ok, other=0)
    hi = end
    for _ in tl.static_range(LOG_F):  # lower bound of q in codes[lo:hi)
        active = lo < hi
        mid = (lo + hi) // 2
        c = tl.load(CODES + mid, mask=active, other=0)
        right = active & (c < q)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & (c >= q), mid, hi)
    inside = ok & (lo < end)
    found = inside & (tl.load(CODES + lo, mask=inside, other=-1) == q)
    child = tl.load(CHILDREN + lo, mask=found, other=-1)
    tl.store(OUT + i, tl.where(found, child, -1), mask=m)


def _check_device(t: torch.Tensor, name: str) -> None:
    if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{name}: needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); use TorchTrie's torch path")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def valid_mask_triton(node_ids: torch.Tensor, offsets: torch.Tensor, codes: torch.Tensor,
                      has_child: torch.Tensor | None, k: int, *, chunk_f: int = 16) -> torch.Tensor:
    """bool [N, k]: which codes exist below each node (int64 [N] ids at one depth, -1 = none).

    ``offsets`` int64 [n_d + 1] and ``codes`` int64 [edges] are the level's CSR arrays;
    ``has_child`` bool [n_d, k] its dense table, or None (then the CSR segments are read)."""
    _check_device(node_ids, "valid_mask_triton")
    n = node_ids.shape[0]
    out = torch.empty(n, k, dtype=torch.uint8, device=node_ids.device)  # [N, K]
    if n == 0 or k == 0:
        return out.view(torch.bool)
    dense = has_child.view(torch.uint8) if has_child is not None else out  # (unused pointer when CSR)
    _valid_mask_kernel[(n,)](
        node_ids.contiguous(), offsets, codes, dense, out, offsets.numel() - 1, k,
        HAS_DENSE=has_child is not None, BLOCK_K=_next_pow2(k), CHUNK_F=chunk_f, num_warps=4,
    )
    return out.view(torch.bool)


def advance_triton(node_ids: torch.Tensor, sel_codes: torch.Tensor, offsets: torch.Tensor, codes: torch.Tensor,
                   children: torch.Tensor, k: int, max_fanout: int, *, block: int = 128) -> torch.Tensor:
    """int64 [N]: the child of each node along each code (-1 where there is none), by binary
    search in the node's child segment. ``max_fanout`` (the level's largest fan-out) fixes the
    search's iteration count."""
    _check_device(node_ids, "advance_triton")
    n = node_ids.shape[0]
    out = torch.empty(n, dtype=torch.int64, device=node_ids.device)  # [N]
    if n == 0:
        return out
    if codes.numel() == 0:
        return out.fill_(-1)
    _advance_kernel[(triton.cdiv(n, block),)](
        node_ids.contiguous(), sel_codes.contiguous(), offsets, codes, children, out, n, offsets.numel() - 1, k,
        BLOCK=block, LOG_F=max(1, int(max_fanout).bit_length() + 1), num_warps=4,
    )
    return out
