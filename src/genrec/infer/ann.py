"""Dense retrieval: a Faiss index over the model's L2-normalised item vectors.

UniPinRec §3.3.2: the index stores each item's vector, and ``search_and_reconstruct``
returns candidate ids *and* their stored vectors in one call, so the ranking step uses
exactly the retrieval representation with no second embedder pass. Inner product on
unit vectors (= cosine). ``kind``: ``flat`` (exact; default for catalogues up to ~1M),
``ivf`` (IVF-Flat, ``nlist``/``nprobe``) or ``hnsw`` (``m``/``ef_search``).
Saved atomically as one folder: ``index.faiss`` + ``item_ids.npy`` + ``manifest.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from genrec.errors import ConfigError, DataError
from genrec.workdir import atomic_dir, atomic_write_json, manifest, read_json


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

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k item ids [B, k] (-1 where fewer exist) and their scores [B, k]."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        scores, rows = self.index.search(q, k)
        return self._ids(rows), scores

    def search_and_reconstruct(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top-k ids [B, k], scores [B, k] and the stored vectors [B, k, D] in one call."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        scores, rows, vecs = self.index.search_and_reconstruct(q, k)
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
