"""Dense retrieval: a Faiss index over the model's L2-normalised item vectors.

UniPinRec §3.3.2: the index stores each item's vector, and ``search_and_reconstruct``
returns candidate ids *and* their stored vectors in one call, so the ranking step uses
exactly the retrieval representation with no second embedder pass. Inner product on
unit vectors (= cosine). ``kind``: ``flat`` (exact; default for catalogues up to ~1M),
``ivf`` (IVF-Flat, ``nlist``/``nprobe``) or ``hnsw`` (``m``/``ef_search``).
Saved atomically as one folder: ``index.faiss`` + ``item_ids.npy`` + ``manifest.json``.

:class:`DeviceFlatSearch` answers a flat index's searches on the model's GPU (one matmul and a top-k over the
index's own vectors, kept there): no host round trip of the user vectors, no host threads. The faiss search is its
twin (tests); :func:`device_search` chooses (``$GENREC_ANN_SEARCH``: auto | faiss | device).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faiss
import numpy as np
import torch

from genrec.errors import ConfigError, DataError
from genrec.workdir import atomic_dir, atomic_write_json, manifest, read_json

if TYPE_CHECKING:
    from genrec.catalog import ItemCatalog


@dataclass(frozen=True)
class AnnConfig:
    kind: str = "flat"
    nlist: int = 1024
    nprobe: int = 32
    m: int = 32
    ef_search: int = 128
    ef_construction: int = 200


class AnnIndex:
    """Item-vector index answering top-k by inner product, with the stored vectors."""

    def __init__(self, index: faiss.Index, item_ids: np.ndarray, cfg: AnnConfig) -> None:
        self.index = index
        self.item_ids = np.asarray(item_ids, dtype=np.int64)
        self.cfg = cfg

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    @classmethod
    def build(cls, vectors: np.ndarray, item_ids: np.ndarray, cfg: AnnConfig | None = None) -> "AnnIndex":
        cfg = cfg or AnnConfig()
        x = np.ascontiguousarray(vectors, dtype=np.float32)  # [N, D]
        if x.ndim != 2 or len(x) != len(item_ids):
            raise DataError(f"vectors {x.shape} and item_ids ({len(item_ids)}) do not align", field="vectors")
        if not np.isfinite(x).all():
            bad = int(np.argwhere(~np.isfinite(x).all(axis=1))[0, 0])
            raise DataError("non-finite value in item vector", line=bad, field="vectors")
        if len(np.unique(item_ids)) != len(item_ids):
            raise DataError("duplicate item ids", field="item_ids")
        d = x.shape[1]
        if cfg.kind == "flat":
            index: faiss.Index = faiss.IndexFlatIP(d)
        elif cfg.kind == "ivf":
            nlist = max(1, min(cfg.nlist, len(x) // 39 or 1))
            quant = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quant, d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(x)
            index.nprobe = min(cfg.nprobe, nlist)
            index.make_direct_map()  # needed by search_and_reconstruct
        elif cfg.kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, cfg.m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = cfg.ef_construction
            index.hnsw.efSearch = cfg.ef_search
        else:
            raise ConfigError(f"ann.kind must be flat|ivf|hnsw, got {cfg.kind!r}")
        index.add(x)
        return cls(index, item_ids, cfg)

    def vectors(self) -> np.ndarray:
        """The stored item vectors, f32 ``[N, D]`` in ``item_ids`` order."""
        if len(self) == 0:
            return np.zeros((0, self.dim), np.float32)
        return np.asarray(self.index.reconstruct_n(0, len(self)), dtype=np.float32)

    def search(self, queries: np.ndarray | torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k item ids [B, k] (-1 where fewer exist) and their scores [B, k]."""
        scores, rows = self.index.search(_host(queries), k)
        return self._ids(rows), scores

    def search_and_reconstruct(self, queries: np.ndarray | torch.Tensor, k: int
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top-k ids [B, k], scores [B, k] and the stored vectors [B, k, D] in one call."""
        scores, rows, vecs = self.index.search_and_reconstruct(_host(queries), k)
        return self._ids(rows), scores, vecs

    def _ids(self, rows: np.ndarray) -> np.ndarray:
        out = np.full(rows.shape, -1, dtype=np.int64)
        ok = rows >= 0
        out[ok] = self.item_ids[rows[ok]]
        return out

    def save(self, folder: str | Path, *, overwrite: bool = True) -> None:
        with atomic_dir(folder, overwrite=overwrite) as tmp:
            faiss.write_index(self.index, str(tmp / "index.faiss"))
            np.save(tmp / "item_ids.npy", self.item_ids)
            atomic_write_json(tmp / "manifest.json", manifest(
                "ann_index", inputs={}, params=asdict(self.cfg), counts={"items": len(self), "dim": self.dim}))

    @classmethod
    def load(cls, folder: str | Path) -> "AnnIndex":
        folder = Path(folder)
        m = read_json(folder / "manifest.json")
        index = faiss.read_index(str(folder / "index.faiss"))
        cfg = AnnConfig(**m["params"])
        if cfg.kind == "ivf":
            ivf = faiss.extract_index_ivf(index)
            ivf.nprobe = cfg.nprobe
            ivf.make_direct_map()
        return cls(index, np.load(folder / "item_ids.npy"), cfg)


def _host(queries: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(queries, torch.Tensor):
        queries = queries.detach().float().cpu().numpy()
    return np.ascontiguousarray(queries, dtype=np.float32)


class DeviceFlatSearch:
    """A flat :class:`AnnIndex`'s exact search on a torch device: its vectors copied there once, each search one
    matmul and a top-k, answered as the index answers (ids, scores and stored vectors; past the index's end row -1,
    the lowest float32 score and nan vectors, as faiss). Everything else (``save``, ``item_ids``, ``cfg``, ...) is
    the index's."""

    def __init__(self, index: AnnIndex, device: str | torch.device) -> None:
        if index.cfg.kind != "flat":
            raise ConfigError(f"a device search answers a flat index exactly; this one is {index.cfg.kind!r}")
        self.index = index
        self.vecs = torch.from_numpy(index.vectors()).to(device)  # [N, D] float32
        self.device = self.vecs.device
        self._rows_of: tuple[ItemCatalog, torch.Tensor] | None = None  # position_rows's table, per catalogue

    def __len__(self) -> int:
        return len(self.index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.index, name)

    def _top(self, queries: np.ndarray | torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.as_tensor(queries).to(self.device, torch.float32)
        got = min(k, len(self))
        with torch.autocast(self.device.type, enabled=False):  # float32 as faiss, under a bf16 server's autocast too
            scores, at = torch.topk(q @ self.vecs.T, got, dim=1) if got else (
                q.new_zeros((len(q), 0)), torch.zeros((len(q), 0), dtype=torch.long, device=self.device))
        if got < k:  # as faiss answers past the index's end: row -1, the lowest float32 score (vectors nan)
            scores = torch.cat([scores, scores.new_full((len(q), k - got), float(np.finfo(np.float32).min))], 1)
            at = torch.cat([at, at.new_full((len(q), k - got), -1)], 1)
        return scores, at

    def search(self, queries: np.ndarray | torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, at = self._top(queries, k)
        return self.index._ids(at.cpu().numpy()), scores.cpu().numpy()

    def search_and_reconstruct(self, queries: np.ndarray | torch.Tensor, k: int
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scores, at, vecs = self.search_t(queries, k)
        return self.index._ids(at.cpu().numpy()), scores.cpu().numpy(), vecs.cpu().numpy()

    def search_t(self, queries: np.ndarray | torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`search_and_reconstruct` left on the device: (scores [Q, k], index positions int64 [Q, k] (-1 past
        the index's end), the vectors [Q, k, D] (nan there)); :meth:`position_rows` maps positions to rows."""
        scores, at = self._top(queries, k)
        vecs = self.vecs[at.clamp(min=0)]
        if k > len(self):  # the padded columns' vectors are nan, as faiss gives them
            vecs[:, len(self):] = float("nan")
        return scores, at, vecs

    def position_rows(self, catalog: ItemCatalog) -> torch.Tensor:
        """int64 [N] on the device: the catalogue row of each index position (-1: an item the catalogue lacks),
        made once per catalogue."""
        if self._rows_of is None or self._rows_of[0] is not catalog:
            rows = catalog.rows(self.index._ids(np.arange(len(self), dtype=np.int64)), strict=False)
            self._rows_of = (catalog, torch.as_tensor(rows, dtype=torch.int64, device=self.device))
        return self._rows_of[1]


ANN_SEARCHES = ("auto", "faiss", "device")


def device_search(index: AnnIndex, device: str | torch.device, mode: str | None = None
                  ) -> AnnIndex | DeviceFlatSearch:
    """The index's searches where they run best: ``mode`` (else ``$GENREC_ANN_SEARCH``, else "auto"): "faiss" the
    index itself, "device" the :class:`DeviceFlatSearch` on ``device`` (a flat index), "auto" that on a CUDA
    device for a flat index, else faiss."""
    m = (mode or os.environ.get("GENREC_ANN_SEARCH") or "auto").strip().lower()
    if m not in ANN_SEARCHES:
        raise ConfigError(f"the ANN search must be one of {', '.join(ANN_SEARCHES)} (GENREC_ANN_SEARCH), got {m!r}")
    if m == "device" or (m == "auto" and torch.device(device).type == "cuda" and index.cfg.kind == "flat"):
        return DeviceFlatSearch(index, device)
    return index
