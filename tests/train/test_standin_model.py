"""A small real next-item model (embedding + GRU) implementing the trainer protocol.

Used by the trainer / checkpoint / DDP tests in place of the real genrec model, and runnable as
a torchrun worker script (``__main__`` below) for the 2-process DDP test.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from genrec.model.losses import sampled_softmax_loss
from genrec.train.config import TrainConfig
from genrec.train.distributed import shard_batch
from genrec.train.trainer import IterSpec, Trainer


class TinyNextItem(nn.Module):
    """Item ids [B, S+1] (0 = padding) -> GRU user states -> full-catalogue softmax on the next item."""

    def __init__(self, n_items: int = 40, d: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.n_items = n_items
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)

    def user_states(self, seq: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.drop(self.emb(seq)))  # [B, S, D]
        return self.proj(self.norm(h))  # [B, S, D]

    def training_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        seq = batch["seq"]  # [B, S+1]
        inp, tgt = seq[:, :-1], seq[:, 1:]  # [B, S]
        valid = (inp > 0) & (tgt > 0)  # [B, S]
        u = self.user_states(inp)[valid]  # [P, D]
        pos = tgt[valid]  # [P]
        catalogue = torch.arange(1, self.n_items + 1, device=seq.device)  # [N]
        cat_vecs = self.emb(catalogue)  # [N, D]
        loss = sampled_softmax_loss(
            u, self.emb(pos), pos, cat_vecs, catalogue,
            torch.zeros(pos.shape[0], device=seq.device), torch.zeros(self.n_items, device=seq.device),
            0.5, in_batch_negatives=False)
        return {"loss": loss, "item": loss.detach(), "user_norm": u.detach().norm(dim=-1).mean(),
                "n_items": valid.sum(), "n_tokens": (seq > 0).sum()}


def make_sequences(n_users: int = 64, seq_len: int = 8, n_items: int = 40, seed: int = 0) -> torch.Tensor:
    """Synthetic users with Markov-ish item sequences and left padding of varying length: [U, S+1]."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(1, n_items + 1, (n_users, 1), generator=g)
    steps = torch.randint(1, 4, (n_users, seq_len), generator=g)
    seq = (start + torch.cumsum(torch.cat([torch.zeros(n_users, 1, dtype=torch.long), steps], 1), 1) - 1) % n_items + 1
    pad = torch.randint(0, seq_len // 2, (n_users,), generator=g)
    seq[torch.arange(seq_len + 1)[None, :] < pad[:, None]] = 0
    return seq  # [U, S+1]


def make_factory(data: torch.Tensor, crash_at: int | None = None):
    """Deterministic, resumable batches: epoch permutation from (seed, epoch); sharded by rank."""

    def factory(spec: IterSpec) -> Iterator[dict[str, torch.Tensor]]:
        per_epoch = data.shape[0] // spec.batch_size
        step = spec.start_step
        while True:
            if crash_at is not None and step == crash_at:
                raise RuntimeError(f"simulated crash before step {step}")
            epoch, k = divmod(step, per_epoch)
            perm = torch.randperm(data.shape[0], generator=torch.Generator().manual_seed(spec.seed * 1000 + epoch))
            rows = perm[k * spec.batch_size:(k + 1) * spec.batch_size]
            yield shard_batch({"seq": data[rows]}, spec.rank, spec.world_size)
            step += 1

    return factory


def tiny_config(**kw: Any) -> TrainConfig:
    overrides = [f"{k}={v}" for k, v in kw.items()]
    return TrainConfig.from_name("cpu-tiny", overrides)


def test_standin_learns() -> None:
    torch.manual_seed(0)
    model = TinyNextItem(dropout=0.0)
    data = make_sequences()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = last = None
    for i in range(40):
        out = model.training_step({"seq": data})
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        first = first if first is not None else out["loss"].item()
        last = out["loss"].item()
    assert last < 0.7 * first
    assert int(out["n_items"]) == int(((data[:, :-1] > 0) & (data[:, 1:] > 0)).sum())


def test_factory_is_resumable_and_sharded() -> None:
    data = make_sequences()
    f = make_factory(data)
    full = f(IterSpec(0, 3, 0, 1, 16))
    batches = [next(full)["seq"] for _ in range(7)]
    later = f(IterSpec(5, 3, 0, 1, 16))
    assert torch.equal(next(later)["seq"], batches[5])
    r0, r1 = next(f(IterSpec(5, 3, 0, 2, 16)))["seq"], next(f(IterSpec(5, 3, 1, 2, 16)))["seq"]
    assert torch.equal(torch.cat([r0, r1]), batches[5])


# ---------------------------------------------------------------------------- torchrun worker

def run_worker(workdir: str, steps: int, out: str, device: str = "cpu", *, log_every: int = 1, ckpt_every: int = 0,
               crash_at: int | None = None, resume: bool = False) -> None:
    """Train the stand-in for ``steps`` on a GLOBAL batch of 16; rank 0 writes params + metrics. ``crash_at``: every
    rank raises when it fetches that batch (0-based); ``resume``: go on from the workdir's checkpoint."""
    from safetensors.torch import save_file

    from genrec.train.distributed import all_reduce_weighted, broadcast_object, cleanup, init_distributed

    torch.set_num_threads(1)
    info = init_distributed(device)
    torch.manual_seed(0)
    model = TinyNextItem(dropout=0.0)
    cfg = tiny_config(total_steps=steps, ckpt_every=ckpt_every, log_every=log_every, batch_size=16, grad_clip=0.5,
                      device=device)
    trainer = Trainer(model, make_factory(make_sequences(), crash_at=crash_at), cfg, workdir, dist_info=info)
    result = trainer.fit(resume=resume)
    reduced, total = all_reduce_weighted({"x": float(info.rank + 1)}, float(info.rank + 2), info)
    bcast = broadcast_object({"from": info.rank, "v": [1.5, "a"]}, info)
    if info.rank == 0:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, out + ".safetensors")
        Path(out + ".json").write_text(json.dumps({
            "world": info.world_size, "backend": info.backend, "reduced": reduced, "total": total,
            "bcast": bcast, "history": result.history}))
    else:
        Path(out + f".rank{info.rank}.json").write_text(json.dumps({"bcast": bcast, "reduced": reduced}))
    cleanup()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--crash-at", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    run_worker(a.workdir, a.steps, a.out, a.device, log_every=a.log_every, ckpt_every=a.ckpt_every,
               crash_at=a.crash_at, resume=a.resume)
    sys.exit(0)
