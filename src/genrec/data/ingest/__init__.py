"""Ingestors: raw public logs -> the canonical tables (events, items, feedviews).

``prepare_dataset(name, source)`` is the one entry point; ``list_datasets()`` names what it
knows. Every ingestor shares the ordering rule (per user by (timestamp, file order), ``seq``
0..n-1), the synthesised-feedview rule (:mod:`.feedviews`; UniPinRec's MAM needs requests and
no public log here has impressions; ``generic`` also reads logged ones, :mod:`.impressions`) and
the error policy (DataError names file:line and field). Nothing is downloaded unless ``IngestOptions(download=True)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from genrec.data.ingest.amazon import ingest_amazon_p5
from genrec.data.ingest.common import RatingRule
from genrec.data.ingest.feedviews import DEFAULT_SLATE_SIZE, build_feedviews, feedviews_reference
from genrec.data.ingest.generic import ingest_generic
from genrec.data.ingest.movielens import ingest_movielens
from genrec.data.ingest.options import ColumnMapping, IngestOptions
from genrec.data.ingest.taobao import ingest_taobao
from genrec.data.schema import Dataset
from genrec.errors import ConfigError, MissingDataError
from genrec.paths import data_root

__all__ = [
    "DEFAULT_SLATE_SIZE",
    "ColumnMapping",
    "DatasetSpec",
    "IngestOptions",
    "RatingRule",
    "build_feedviews",
    "feedviews_reference",
    "list_datasets",
    "prepare_dataset",
]


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    folder: str | None
    """Default folder under the data root (None: ``source`` must be given)."""
    description: str
    ingest: Callable[[str, Path, IngestOptions], Dataset]


def _movielens(name: str, folder: Path, options: IngestOptions) -> Dataset:
    return ingest_movielens(name, folder, options)


def _amazon(name: str, folder: Path, options: IngestOptions) -> Dataset:
    return ingest_amazon_p5(name, folder, options)


def _taobao(name: str, folder: Path, options: IngestOptions) -> Dataset:
    return ingest_taobao(name, folder, options)


def _generic(name: str, folder: Path, options: IngestOptions) -> Dataset:
    return ingest_generic(name, folder, options)


_SPECS = [
    DatasetSpec("movielens-100k", "movielens-100k", "MovieLens 100K: u.data (tab) + u.item (Latin-1)", _movielens),
    DatasetSpec("movielens-latest-small", "movielens-latest-small", "MovieLens latest-small: ratings.csv + movies.csv",
                _movielens),
    DatasetSpec("movielens-1m", "movielens-1m", "MovieLens 1M: ratings.dat + movies.dat ('::')", _movielens),
    DatasetSpec("movielens-10m", "movielens-10m", "MovieLens 10M: ratings.dat + movies.dat ('::')", _movielens),
    DatasetSpec("movielens-20m", "movielens-20m", "MovieLens 20M: ratings.csv + movies.csv", _movielens),
    DatasetSpec("movielens-25m", "movielens-25m", "MovieLens 25M: ratings.csv + movies.csv", _movielens),
    DatasetSpec("movielens-32m", "movielens-32m", "MovieLens 32M: ratings.csv + movies.csv", _movielens),
    DatasetSpec("amazon-beauty-2014", "amazon-beauty-2014", "Amazon Beauty 2014 5-core, P5/S3-Rec form", _amazon),
    DatasetSpec("amazon-p5", None, "Any Amazon category in P5 form (sequential_data.txt [+ datamaps, item text])",
                _amazon),
    DatasetSpec("taobao", "taobao-userbehavior-sample", "Taobao UserBehavior.csv (pv/cart/fav/buy)", _taobao),
    DatasetSpec("generic", None, "Your own Parquet/CSV events (+ optional items) with a column mapping", _generic),
]
REGISTRY: dict[str, DatasetSpec] = {s.name: s for s in _SPECS}


def list_datasets() -> list[DatasetSpec]:
    """Every dataset name :func:`prepare_dataset` accepts, with its default folder."""
    return list(_SPECS)


def prepare_dataset(
    name: str,
    source: Path | str | None = None,
    *,
    data_dir: Path | str | None = None,
    options: IngestOptions | None = None,
) -> Dataset:
    """Ingest dataset ``name`` from ``source`` (a folder of raw files; for ``generic`` also a file).

    ``source=None``: ``genrec.paths.data_root(data_dir) / <default folder>``.
    Raises MissingDataError (saying which file and where to put it), DataError (file:line, field).
    """
    if name not in REGISTRY:
        raise ConfigError(f"dataset: unknown name {name!r}; known: {', '.join(REGISTRY)}")
    spec = REGISTRY[name]
    options = options or IngestOptions()
    if options.impressions_path is not None and name != "generic":
        raise ConfigError(f"--impressions: only the generic dataset reads an impressions file ({name} synthesises "
                          f"its feedviews from the events)")
    if source is None:
        if spec.folder is None:
            raise ConfigError(f"dataset {name!r} has no default folder: give --source (a folder or file)")
        folder = data_root(data_dir) / spec.folder
        if not folder.exists() and not options.download:
            raise MissingDataError(
                f"{name}: folder {folder} does not exist. Put the raw files there, give --source, set "
                f"GENREC_DATA_DIR / --data-dir to the folder that holds {spec.folder}/"
                + (", or add --download (MovieLens only)" if name.startswith("movielens") else "")
            )
    else:
        folder = Path(source).expanduser()
        if not folder.exists():
            raise MissingDataError(f"{name}: source {folder} does not exist")
    return spec.ingest(name, folder, options)
