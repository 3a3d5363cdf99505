"""RQ-VAE quantiser (TIGER's Semantic-ID tokenizer), the learned alternative to RQ-KMeans.

An MLP encoder maps a content vector to a latent z; ``levels`` codebooks quantise z
residually (level l picks the nearest code to z minus the codes of levels < l); an MLP
decoder maps the summed codes back to the content vector. Loss = reconstruction MSE +
per level ||sg(r_l) - c_l||^2 + beta ||r_l - sg(c_l)||^2, straight-through gradients.

Non-standard here:
- Each codebook is initialised with k-means (faiss) on that level's residuals of the
  initial encoder over all training vectors, and a code unused for a whole epoch is
  re-seeded from a random residual of that level (limits dead codes).
- Same interface as :class:`genrec.sid.rqkmeans.ResidualKMeans` (``fit_encode``,
  ``encode``, ``level_errors``, ``codebook_sizes``, ``save``/``load``) so
  :mod:`genrec.sid.build` treats both alike; ``level_errors`` decodes the partial sums
  of codes, so it measures error in the input space.
- CPU float32, deterministic for a fixed seed (torch generator + faiss seed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from torch import nn

from genrec.errors import ConfigError, DataError
from genrec.sid.rqkmeans import check_vectors

__all__ = ["RQVAE"]


def _mlp(dims: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class _Net(nn.Module):
    def __init__(self, dim: int, hidden: int, latent: int, sizes: list[int]) -> None:
        super().__init__()
        self.encoder = _mlp([dim, hidden, latent])
        self.decoder = _mlp([latent, hidden, dim])
        self.codebooks = nn.ParameterList([nn.Parameter(torch.zeros(k, latent)) for k in sizes])

    def quantise(self, z: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """z [B, D] -> codes [B, L], per-level residuals and chosen codes (each [B, D])."""
        residual = z
        codes, residuals, chosen = [], [], []
        for book in self.codebooks:
            idx = torch.cdist(residual.detach(), book.detach()).argmin(dim=1)  # [B]
            c = book[idx]  # [B, D]
            codes.append(idx)
            residuals.append(residual)
            chosen.append(c)
            residual = residual - c.detach()
        return torch.stack(codes, dim=1), residuals, chosen


class RQVAE:
    """Residual-quantised autoencoder over content vectors; codes int32[n, levels]."""

    def __init__(self, levels: int, codebook_size: int | list[int], *, latent_dim: int = 32, hidden: int = 128,
                 epochs: int = 30, batch_size: int = 256, lr: float = 1e-3, beta: float = 0.25, seed: int = 0) -> None:
        if not isinstance(levels, (int, np.integer)) or levels < 1:
            raise ConfigError(f"levels must be a positive integer, got {levels!r}")
        if isinstance(codebook_size, (int, np.integer)):
            sizes = [int(codebook_size)] * levels
        else:
            sizes = [int(k) for k in codebook_size]
        if len(sizes) != levels or any(k < 1 for k in sizes):
            raise ConfigError(f"codebook_size must be >= 1, one per level (levels={levels}), got {codebook_size!r}")
        if epochs < 1 or batch_size < 1 or lr <= 0:
            raise ConfigError(f"epochs, batch_size and lr must be positive, got {epochs}, {batch_size}, {lr}")
        self.levels = int(levels)
        self.requested_sizes = sizes
        self.cfg: dict[str, Any] = {"latent_dim": int(latent_dim), "hidden": int(hidden), "epochs": int(epochs),
                    "batch_size": int(batch_size), "lr": float(lr), "beta": float(beta), "seed": int(seed)}
        self.net: _Net | None = None
        self._dim = 0
        self.stats: dict[str, Any] = {"warnings": []}

    @property
    def codebook_sizes(self) -> list[int]:
        self._require_fitted()
        assert self.net is not None
        return [int(b.shape[0]) for b in self.net.codebooks]

    @property
    def dim(self) -> int:
        self._require_fitted()
        return self._dim

    def _require_fitted(self) -> None:
        if self.net is None:
            raise ConfigError("RQVAE is not fitted: call .fit_encode(x) or RQVAE.load(...)")

    # ------------------------------------------------------------------ training
    def _init_codebooks(self, x: torch.Tensor) -> None:
        assert self.net is not None
        with torch.no_grad():
            residual = self.net.encoder(x).numpy().astype(np.float32)  # [n, D]
            for lvl, book in enumerate(self.net.codebooks):
                k = book.shape[0]
                km = faiss.Kmeans(residual.shape[1], k, niter=20, seed=self.cfg["seed"] + lvl, verbose=False)
                km.train(np.ascontiguousarray(residual))
                book.copy_(torch.from_numpy(km.centroids))
                idx = torch.cdist(torch.from_numpy(residual), book).argmin(1)
                residual = residual - np.asarray(km.centroids)[idx.numpy()]

    def fit_encode(self, x_in: Any) -> np.ndarray:
        """Train on ``x`` f32[n, d]; return its codes int32[n, levels]."""
        x_np = check_vectors(x_in, name="x")
        n, d = x_np.shape
        sizes = list(self.requested_sizes)
        for lvl, k in enumerate(sizes):
            if k > n:
                self.stats["warnings"].append(f"level {lvl}: codebook_size {k} > {n} training points; capped to {n}")
                sizes[lvl] = n
        torch.manual_seed(self.cfg["seed"])
        gen = torch.Generator().manual_seed(self.cfg["seed"])
        self._dim = d
        self.net = _Net(d, self.cfg["hidden"], self.cfg["latent_dim"], sizes)
        x = torch.from_numpy(x_np)  # [n, d]
        self._init_codebooks(x)
        opt = torch.optim.Adam(self.net.parameters(), lr=self.cfg["lr"])
        bs = min(self.cfg["batch_size"], n)
        history = []
        for _epoch in range(self.cfg["epochs"]):
            used = [torch.zeros(k, dtype=torch.bool) for k in sizes]
            perm = torch.randperm(n, generator=gen)
            total = 0.0
            for start in range(0, n, bs):
                xb = x[perm[start:start + bs]]  # [B, d]
                z = self.net.encoder(xb)  # [B, D]
                codes, residuals, chosen = self.net.quantise(z)
                q = torch.stack(chosen).sum(0)  # [B, D]
                q_st = z + (q - z).detach()  # straight-through
                recon = self.net.decoder(q_st)
                loss = nn.functional.mse_loss(recon, xb)
                for r, c in zip(residuals, chosen):
                    codebook_loss = nn.functional.mse_loss(c, r.detach())
                    commit_loss = nn.functional.mse_loss(r, c.detach())
                    loss = loss + codebook_loss + self.cfg["beta"] * commit_loss
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * xb.shape[0]
                for lvl in range(self.levels):
                    used[lvl][codes[:, lvl]] = True
            history.append(total / n)
            self._reseed_dead(x, used, gen)
        self.stats.update({"n_train": n, "dim": d, "loss_first": history[0], "loss_last": history[-1], **self.cfg})
        return self.encode(x_np)

    def _reseed_dead(self, x: torch.Tensor, used: list[torch.Tensor], gen: torch.Generator) -> None:
        assert self.net is not None
        with torch.no_grad():
            _codes, residuals, _chosen = self.net.quantise(self.net.encoder(x))
            for lvl, book in enumerate(self.net.codebooks):
                dead = torch.nonzero(~used[lvl]).flatten()
                if dead.numel():
                    pick = torch.randint(0, x.shape[0], (dead.numel(),), generator=gen)
                    book[dead] = residuals[lvl][pick]

    def fit(self, x: Any) -> "RQVAE":
        self.fit_encode(x)
        return self

    # ------------------------------------------------------------------ inference
    def encode(self, x_in: Any) -> np.ndarray:
        """Codes int32[n, levels] of ``x`` f32[n, d] with the trained encoder and codebooks."""
        self._require_fitted()
        assert self.net is not None
        x = check_vectors(x_in, name="x")
        if x.shape[1] != self._dim:
            raise DataError(f"vectors have dimension {x.shape[1]}, the model {self._dim}", field="x")
        with torch.no_grad():
            codes, _, _ = self.net.quantise(self.net.encoder(torch.from_numpy(x)))
        return codes.numpy().astype(np.int32)

    def reconstruct(self, codes: Any, levels: int | None = None) -> np.ndarray:
        """Decode the sum of the first ``levels`` codes: f32[n, d]."""
        self._require_fitted()
        assert self.net is not None
        c = np.asarray(codes, dtype=np.int64)
        use = self.levels if levels is None else int(levels)
        if c.ndim != 2 or c.shape[1] < use:
            raise DataError(f"codes must be [n, >= {use}], got shape {c.shape}", field="codes")
        with torch.no_grad():
            q = torch.zeros(c.shape[0], self.cfg["latent_dim"])
            for lvl in range(use):
                book = self.net.codebooks[lvl]
                col = c[:, lvl]
                if col.size and (col.min() < 0 or col.max() >= book.shape[0]):
                    raise DataError(f"code outside codebook of size {book.shape[0]}", field=f"codes[:, {lvl}]")
                q += book[torch.from_numpy(col)]
            return self.net.decoder(q).numpy()

    def level_errors(self, x_in: Any, codes: Any | None = None) -> list[dict[str, float]]:
        """Input-space error after decoding 1..L levels: ``[{"mse", "relative"}]``."""
        x = check_vectors(x_in, name="x")
        codes = self.encode(x) if codes is None else np.asarray(codes)
        denom = float(np.square(x, dtype=np.float64).sum()) or 1.0
        out = []
        for lvl in range(1, self.levels + 1):
            err = float(np.square(x - self.reconstruct(codes, lvl), dtype=np.float64).sum())
            out.append({"mse": err / x.shape[0], "relative": err / denom})
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        self._require_fitted()
        assert self.net is not None
        meta = {"kind": "rqvae", "levels": self.levels, "requested_sizes": self.requested_sizes, "cfg": self.cfg,
                "dim": self._dim, "sizes": self.codebook_sizes, "stats": self.stats}
        state = {k: v.detach().numpy().copy() for k, v in self.net.state_dict().items()}
        state["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8).copy()
        return state

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> "RQVAE":
        if "meta" not in state:
            raise DataError("state has no 'meta' entry", field="meta")
        meta = json.loads(np.asarray(state["meta"], dtype=np.uint8).tobytes().decode())
        if meta.get("kind") != "rqvae":
            raise DataError(f"state is a {meta.get('kind', 'rqkmeans')!r} quantiser, not 'rqvae'", field="meta")
        cfg = meta["cfg"]
        m = cls(meta["levels"], meta["requested_sizes"], **cfg)
        m._dim = int(meta["dim"])
        m.net = _Net(m._dim, cfg["hidden"], cfg["latent_dim"], meta["sizes"])
        weights = {k: torch.from_numpy(np.array(v)) for k, v in state.items() if k != "meta"}
        m.net.load_state_dict(weights)
        m.net.eval()
        m.stats = meta.get("stats", {"warnings": []})
        return m

    def save(self, path: str | Path) -> None:
        save_file(self.state_dict(), str(path))

    @classmethod
    def load(cls, path: str | Path) -> "RQVAE":
        return cls.from_state(load_file(str(path)))
