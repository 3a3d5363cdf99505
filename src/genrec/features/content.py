"""Content vectors: one float32 row per catalogue item, from its text or from a file.

PinGER (its SIDs come from PinCLIP) and TIGER quantise a *pretrained content embedding*
into Semantic IDs, and PinGER's dense history token concatenates a content vector
(PinCLIP there) with an engagement vector. We have no PinCLIP, so the content vector
comes from one of three sources chosen by a ``spec`` string:

* ``"tfidf"`` -- dependency-light default: TF-IDF over word 1-2 grams plus
  within-word character 3-5 grams of ``items["text"]``, reduced by a seeded SVD and
  L2-normalised. Deterministic for a seed. This is an LSA embedding, not a neural one.
* ``"st:<name or local path>"`` -- a sentence-transformers encoder (optional extra
  ``genrec[text]``, imported lazily), outputs L2-normalised.
* ``"file:<path>"`` -- user-supplied vectors (Parquet or ``.npy`` + ``item_ids.npy``),
  used as given (not normalised).

Non-standard choice: ``dim`` is an *upper bound* for every source. TF-IDF is cut to
``min(dim, rank)``; an encoder's or a file's vectors wider than ``dim`` are projected
onto their top ``dim`` principal directions (seeded, deterministic) and, for
encoders, re-normalised; narrower ones are kept as they are. ``dim=None`` keeps the
native width (64 for TF-IDF).

Rows are always aligned to ``items["item_id"]`` order.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp

from genrec.errors import ConfigError, DataError, MissingDataError

DEFAULT_TFIDF_DIM = 64
DENSE_SVD_MAX = 2000
DENSE_SVD_MAX_ENTRIES = 16_000_000
"""The SVD is exact (LAPACK on a dense float64 copy, <= 128 MB) when the smaller side is at most
DENSE_SVD_MAX and the matrix has at most DENSE_SVD_MAX_ENTRIES entries; randomized otherwise."""


# --------------------------------------------------------------------------- helpers


def catalogue_ids(items: pa.Table) -> np.ndarray:
    """``items["item_id"]`` as int64, checked for nulls and duplicates."""
    if "item_id" not in items.column_names:
        raise DataError("items table has no 'item_id' column", field="item_id")
    col = items.column("item_id")
    if col.null_count:
        raise DataError(f"{col.null_count} null item_id values in items table", field="item_id")
    ids = col.to_numpy().astype(np.int64, copy=False)  # [n]
    _check_unique(ids, where="items table")
    return ids


def _check_unique(ids: np.ndarray, *, where: str | Path, field: str = "item_id") -> None:
    """Raise naming the first duplicate (by row, 1-based) if ``ids`` has one."""
    if ids.size < 2:
        return
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    if dup.size:
        # second occurrence with the smallest row index
        rows = order[dup + 1]
        row = int(rows.min())
        first = int(np.flatnonzero(ids == ids[row])[0])
        raise DataError(
            f"duplicate item_id {int(ids[row])} (row {row + 1}; first seen at row {first + 1})",
            path=str(where), line=row + 1, field=field,
        )


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation; all-zero rows stay zero. ``x``: [n, d] -> [n, d] float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)  # [n, 1]
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def truncated_svd(m: np.ndarray | sp.spmatrix, k: int, *, seed: int, method: str = "auto"
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-``k`` SVD ``m ~= U diag(S) Vt`` with deterministic signs.

    ``method``: ``"exact"`` (LAPACK on a dense copy), ``"randomized"`` (sklearn's seeded
    ``randomized_svd``, sparse-friendly) or ``"auto"`` (exact when the matrix is small, see
    DENSE_SVD_MAX / DENSE_SVD_MAX_ENTRIES). ``k`` must be ``<= min(m.shape)``. Returns U [r, k], S [k], Vt [k, c].
    """
    from sklearn.utils.extmath import randomized_svd, svd_flip  # scikit-learn loads in ~2 s: only this path needs it

    r, c = m.shape
    if k < 1 or k > min(r, c):
        raise ValueError(f"k={k} must be in [1, {min(r, c)}] for a {r}x{c} matrix")
    if method not in ("auto", "exact", "randomized"):
        raise ValueError(f"method must be 'auto', 'exact' or 'randomized', got {method!r}")
    small = min(r, c) <= DENSE_SVD_MAX and r * c <= DENSE_SVD_MAX_ENTRIES
    if method == "exact" or (method == "auto" and small):
        dense = m.toarray() if isinstance(m, sp.spmatrix | sp.sparray) else np.asarray(m)
        u, s, vt = np.linalg.svd(dense.astype(np.float64), full_matrices=False)
        u, vt = svd_flip(u[:, :k], vt[:k])
        return u, s[:k], vt
    u, s, vt = randomized_svd(m, n_components=k, n_oversamples=max(10, k // 2), n_iter=5,
                              power_iteration_normalizer="LU", flip_sign=True, random_state=seed)
    return u, s, vt


Encode = Callable[[np.ndarray], np.ndarray]
"""A fitted projection or encoder applied to more rows: [m, d] -> [m, d']."""


def _fit_project_down(x: np.ndarray, dim: int | None, *, seed: int) -> tuple[np.ndarray, Encode]:
    """Project ``x`` [n, d] onto its top ``dim`` principal directions when ``dim < d``; also the projection,
    for more rows (``(y - mean) Vt^T``: the same numbers for ``x``'s rows when the SVD is exact)."""
    if dim is None or dim >= x.shape[1]:
        return x, lambda y: np.asarray(y, dtype=np.float32)
    mean = x.astype(np.float64).mean(axis=0, keepdims=True)  # [1, d]
    centred = x.astype(np.float64) - mean  # [n, d]
    k = min(dim, min(centred.shape))
    u, s, vt = truncated_svd(centred, k, seed=seed)
    out = np.zeros((x.shape[0], dim), dtype=np.float32)
    out[:, :k] = u * s  # [n, k]

    def project(y: np.ndarray) -> np.ndarray:
        res = np.zeros((y.shape[0], dim), dtype=np.float32)
        res[:, :k] = (np.asarray(y, np.float64) - mean) @ vt.T  # [m, k]
        return res

    return out, project


def _project_down(x: np.ndarray, dim: int | None, *, seed: int) -> np.ndarray:
    """Project ``x`` [n, d] onto its top ``dim`` principal directions when ``dim < d``."""
    return _fit_project_down(x, dim, seed=seed)[0]


# --------------------------------------------------------------------------- tf-idf


def tfidf_vectors(texts: list[str], *, dim: int = DEFAULT_TFIDF_DIM, seed: int = 0) -> np.ndarray:
    """LSA vectors: TF-IDF (word 1-2 grams ‖ char_wb 3-5 grams) -> SVD -> L2. [n, min(dim, n, V)].

    Each of the two TF-IDF blocks is row-L2-normalised by scikit-learn, so both count equally.
    Items with empty text get all-zero rows.
    """
    return tfidf_fit(texts, dim=dim, seed=seed)[0]


def tfidf_fit(texts: list[str], *, dim: int = DEFAULT_TFIDF_DIM, seed: int = 0
              ) -> tuple[np.ndarray, Callable[[list[str]], np.ndarray]]:
    """:func:`tfidf_vectors` and the fitted encoder for more texts: their TF-IDF rows under the same vocabulary
    and idf, folded into the LSA space (``X_new Vt^T``, L2-normalised) -- for the fitted texts the same vectors
    when the SVD is exact (:data:`DENSE_SVD_MAX`), the standard LSA fold-in either way."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # (scikit-learn: ~2 s to load, this path only)

    if dim < 1:
        raise ConfigError(f"content dim must be >= 1, got {dim}")
    if not any(t.strip() for t in texts):
        raise DataError("every item text is empty: nothing to build TF-IDF vectors from", field="text")
    word = TfidfVectorizer(analyzer="word", ngram_range=(1, 2), lowercase=True, sublinear_tf=True,
                           token_pattern=r"(?u)\b\w+\b", dtype=np.float32)
    char = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), lowercase=True, sublinear_tf=True,
                           dtype=np.float32)
    x = sp.hstack([word.fit_transform(texts), char.fit_transform(texts)], format="csr")  # [n, V]
    k = min(dim, min(x.shape))
    u, s, vt = truncated_svd(x, k, seed=seed)  # U [n, k], S [k], Vt [k, V]

    def encode(more: list[str]) -> np.ndarray:
        xn = sp.hstack([word.transform(more), char.transform(more)], format="csr")  # [m, V]
        return l2_normalize(np.asarray(xn @ vt.T))  # [m, k]

    return l2_normalize(u * s), encode  # LSA document vectors U S (= X V): [n, k]


# --------------------------------------------------------------------------- sentence-transformers


@functools.lru_cache(maxsize=1)
def _load_encoder(model: str, device: str | None) -> Any:
    """Load (and keep the last) sentence-transformers encoder, so repeated calls do not reload it."""
    from sentence_transformers import SentenceTransformer  # optional and heavy: only the sentence-model encoder

    return SentenceTransformer(model, device=device)


def st_vectors(texts: list[str], model: str, *, batch_size: int = 64, device: str | None = None
               ) -> np.ndarray:
    """Encode ``texts`` with a sentence-transformers model (name or local folder). [n, d], L2-normalised."""
    try:
        import sentence_transformers  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            "content spec 'st:...' needs the sentence-transformers package: "
            "pip install 'genrec[text]'  (or: pip install sentence-transformers)"
        ) from e
    local = Path(model).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ConfigError(f"content spec 'st:{model}': {local} is not a model folder")
        model = str(local.resolve())
    try:
        enc = _load_encoder(model, device)
    except OSError as e:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise MissingDataError(
            f"could not load sentence-transformers model {model!r}"
            + (" (HF_HUB_OFFLINE=1: give a local model folder)" if offline else "")
            + f": {e}"
        ) from e
    out = enc.encode(texts, batch_size=batch_size, show_progress_bar=sys.stderr.isatty(),
                     convert_to_numpy=True, normalize_embeddings=True)  # [n, d]
    return np.ascontiguousarray(out, dtype=np.float32)


# --------------------------------------------------------------------------- file


def _check_finite(vecs: np.ndarray, path: Path) -> None:
    bad = ~np.isfinite(vecs).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"vector has NaN or infinite values (row {row + 1})", path=path, line=row + 1,
                        field="vector")


def _read_parquet_vectors(path: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(path)
    names = table.column_names
    if "item_id" not in names:
        raise DataError("no 'item_id' column", path=path, field="item_id")
    ids_col = table.column("item_id")
    if ids_col.null_count:
        row = int(np.flatnonzero(ids_col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError("null item_id", path=path, line=row + 1, field="item_id")
    if not pa.types.is_integer(ids_col.type):
        raise DataError(f"item_id must be an integer column, got {ids_col.type}", path=path, field="item_id")
    ids = ids_col.to_numpy().astype(np.int64)  # [m]
    if "vector" in names:
        col = table.column("vector").combine_chunks()
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
                or pa.types.is_fixed_size_list(col.type)):
            raise DataError(f"'vector' must be a list<float> column, got {col.type}", path=path, field="vector")
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"null vector (row {row + 1})", path=path, line=row + 1, field="vector")
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)  # [m]
        d = int(lengths[0]) if lengths.size else 0
        ragged = np.flatnonzero(lengths != d)
        if ragged.size:
            row = int(ragged[0])
            raise DataError(f"ragged vectors: row {row + 1} has {int(lengths[row])} values, row 1 has {d}",
                            path=path, line=row + 1, field="vector")
        if d == 0:
            raise DataError("vectors are empty", path=path, field="vector")
        flat = pc.list_flatten(col)
        if flat.null_count:
            pos = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"null value inside vector (row {pos // d + 1})", path=path, line=pos // d + 1,
                            field="vector")
        vecs = flat.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(ids), d)  # [m, d]
    else:
        vcols = [c for c in names if c.startswith("v") and c[1:].isdigit()]
        if not vcols:
            raise DataError("no vector columns: expected 'vector' (list<float>) or v0..v{d-1}", path=path,
                            field="vector")
        want = [f"v{i}" for i in range(len(vcols))]
        if sorted(vcols, key=lambda c: int(c[1:])) != want:
            raise DataError(f"vector columns must be v0..v{len(vcols) - 1} with no gaps, got {sorted(vcols)}",
                            path=path, field="vector")
        cols = []
        for c in want:
            col = table.column(c)
            if col.null_count:
                row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise DataError(f"null value (row {row + 1})", path=path, line=row + 1, field=c)
            cols.append(col.to_numpy().astype(np.float32))
        vecs = np.stack(cols, axis=1)  # [m, d]
    return ids, vecs


def _read_npy_vectors(path: Path) -> tuple[np.ndarray, np.ndarray]:
    ids_path = path.with_name("item_ids.npy")
    if not ids_path.exists():
        raise MissingDataError(f"{path} needs its item ids beside it in {ids_path}")
    try:
        vecs = np.load(path, allow_pickle=False)
    except ValueError as e:  # object arrays (ragged rows) need pickle
        raise DataError(f"cannot read vectors ({e}); ragged rows are not allowed", path=path,
                        field="vector") from e
    ids = np.load(ids_path, allow_pickle=False)
    if vecs.ndim != 2:
        raise DataError(f"vectors must be a 2-D array [n_items, d], got shape {vecs.shape}", path=path,
                        field="vector")
    if not np.issubdtype(vecs.dtype, np.number):
        raise DataError(f"vectors must be numeric, got dtype {vecs.dtype}", path=path, field="vector")
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise DataError(f"item ids must be a 1-D integer array, got {ids.dtype} {ids.shape}", path=ids_path,
                        field="item_id")
    if len(ids) != len(vecs):
        raise DataError(f"{len(ids)} item ids but {len(vecs)} vectors in {path}", path=ids_path,
                        field="item_id")
    return ids.astype(np.int64), vecs.astype(np.float32)


def read_vector_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(item ids [m], vectors [m, d]) of a user-supplied vector file (see :func:`file_vectors`)."""
    if not path.exists():
        raise MissingDataError(f"vector file {path} does not exist")
    if path.suffix == ".npy":
        return _read_npy_vectors(path)
    if path.suffix in (".parquet", ".pq") or path.is_dir():
        return _read_parquet_vectors(path)
    raise ConfigError(f"vector file {path}: expected a .parquet or .npy file")


def file_vectors(path: str | Path, item_ids: np.ndarray) -> np.ndarray:
    """Read user-supplied vectors and align them to ``item_ids`` [n] -> [n, d] float32.

    Parquet: ``item_id`` + ``vector`` list<float>, or ``item_id`` + ``v0..v{d-1}``.
    ``.npy``: a [m, d] array with its ids in ``item_ids.npy`` in the same folder.
    Rows for items outside the catalogue are ignored; every catalogue item must be present.
    """
    path = Path(path).expanduser()
    ids, vecs = read_vector_file(path)
    where = path.with_name("item_ids.npy") if path.suffix == ".npy" else path
    _check_unique(ids, where=where)
    _check_finite(vecs, path)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    pos = np.searchsorted(sorted_ids, item_ids)  # [n]
    pos_c = np.minimum(pos, len(sorted_ids) - 1)
    found = (len(sorted_ids) > 0) & (sorted_ids[pos_c] == item_ids)
    if not found.all():
        missing = item_ids[~found]
        raise DataError(
            f"{missing.size} catalogue item(s) have no vector, first missing item_id {int(missing[0])}",
            path=path, field="item_id",
        )
    return np.ascontiguousarray(vecs[order[pos_c]])  # [n, d]


# --------------------------------------------------------------------------- entry point


def parse_spec(spec: str) -> tuple[str, str]:
    """``"tfidf"`` -> ("tfidf", ""), ``"st:NAME"`` -> ("st", NAME), ``"file:PATH"`` -> ("file", PATH)."""
    if spec == "tfidf":
        return "tfidf", ""
    kind, sep, arg = spec.partition(":")
    if sep and kind in ("st", "file") and arg:
        return kind, arg
    raise ConfigError(f"content spec {spec!r}: expected 'tfidf', 'st:<model name or path>' or 'file:<path>'")


def content_vectors(items: pa.Table, spec: str = "tfidf", *, dim: int | None = None, seed: int = 0,
                    batch_size: int = 64, device: str | None = None) -> np.ndarray:
    """Content vectors [n_items, d] float32, rows aligned to ``items["item_id"]`` order.

    ``dim`` is an upper bound (see the module docstring); ``seed`` fixes every SVD;
    ``batch_size`` and ``device`` are for ``st:`` encoders only.
    """
    return content_encoder(items, spec, dim=dim, seed=seed, batch_size=batch_size, device=device)[0]


def _texts(items: pa.Table, ids: np.ndarray) -> list[str]:
    if "text" not in items.column_names:
        raise DataError("items table has no 'text' column", field="text")
    col = items.column("text")
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"null text for item_id {int(ids[row])}", line=row + 1, field="text")
    return [str(t) for t in col.to_pylist()]


def content_encoder(items: pa.Table, spec: str = "tfidf", *, dim: int | None = None, seed: int = 0,
                    batch_size: int = 64, device: str | None = None
                    ) -> tuple[np.ndarray, Callable[[pa.Table], np.ndarray]]:
    """:func:`content_vectors` of ``items``, and the encoder as fitted on them for more items (a table of the
    same form; rows in its order): the TF-IDF vocabulary, idf and SVD, the principal directions a projection
    to ``dim`` chose, stay as they are -- new items land in the same space (:mod:`genrec.features.extend`)."""
    kind, arg = parse_spec(spec)
    if dim is not None and dim < 1:
        raise ConfigError(f"content dim must be >= 1, got {dim}")
    ids = catalogue_ids(items)
    if kind == "file":
        vecs, project = _fit_project_down(file_vectors(arg, ids), dim, seed=seed)
        return vecs, lambda more: project(file_vectors(arg, catalogue_ids(more)))
    texts = _texts(items, ids)
    if kind == "tfidf":
        vecs, fold = tfidf_fit(texts, dim=DEFAULT_TFIDF_DIM if dim is None else dim, seed=seed)
        return vecs, lambda more: fold(_texts(more, catalogue_ids(more)))
    vecs = st_vectors(texts, arg, batch_size=batch_size, device=device)

    def encode(more: pa.Table) -> np.ndarray:
        return st_vectors(_texts(more, catalogue_ids(more)), arg, batch_size=batch_size, device=device)

    if dim is not None and dim < vecs.shape[1]:
        vecs, project = _fit_project_down(vecs, dim, seed=seed)
        return l2_normalize(vecs), lambda more: l2_normalize(project(encode(more)))
    return vecs, encode
