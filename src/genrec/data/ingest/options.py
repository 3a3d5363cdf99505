"""Ingest options: one dataclass shared by every ingestor (each reads the fields it needs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from genrec.data.ingest.common import RatingRule
from genrec.data.ingest.feedviews import DEFAULT_SLATE_SIZE
from genrec.data.ingest.timestamps import check_time_format
from genrec.errors import ConfigError


@dataclass(frozen=True)
class ColumnMapping:
    """Column names of a generic events file. ``None`` = the column does not exist.

    No ``timestamp`` column: file order is time (``has_timestamps=False``, timestamp = position).
    No ``action`` column: every row is action ``"interact"``. No ``surface``: one surface ``"default"``.

    An impressions file (``IngestOptions.impressions_path``) names its user, item, timestamp, action and
    surface columns like the events file, plus ``request`` and ``position`` (:mod:`.impressions`).
    """

    user: str = "user_id"
    item: str = "item_id"
    timestamp: str | None = "timestamp"
    action: str | None = "action"
    surface: str | None = None
    """Where the event happened (home, search, ...): ``--surface-col``."""
    title: str = "title"
    """Items file: title column (optional in the file)."""
    text: str = "text"
    """Items file: text column (optional; built from the title + attributes when absent)."""
    request: str = "request_id"
    """Impressions file: the request (one feedview per value): ``--request-col``."""
    position: str = "position"
    """Impressions file: the item's place in the slate (an integer; the slate is ordered by it): ``--position-col``."""


@dataclass(frozen=True)
class IngestOptions:
    rating_rule: RatingRule = field(default_factory=RatingRule)
    """MovieLens: explicit rating -> action."""
    slate_size: int = DEFAULT_SLATE_SIZE
    """Feedviews: interactions per synthesised request."""
    download: bool = False
    """Fetch missing MovieLens files from GroupLens (never done implicitly)."""
    checksum: bool = True
    """Record the sha256 of every file read in ``Dataset.source``."""
    columns: ColumnMapping = field(default_factory=ColumnMapping)
    """generic: column names."""
    map_ids: bool | None = None
    """generic: number user/item ids 0..n-1 (originals kept: items.attributes, extra.user_ids). None (default):
    when an id is not an integer; True (``--map-ids``): always; False (``--no-map-ids``): never (a non-integer
    id is a DataError)."""
    time_format: str = "auto"
    """generic: how the timestamp column is written: auto | iso | epoch-s | epoch-ms | a strptime pattern
    (``--time-format``; see :mod:`genrec.data.ingest.timestamps`). Stored as epoch seconds either way."""
    actions: tuple[str, ...] | None = None
    """generic: the action vocabulary in bit order (default: sorted distinct values)."""
    positive_actions: tuple[str, ...] | None = None
    """generic: which actions are engagement (default: all)."""
    delimiter: str = ","
    """generic CSV: field delimiter."""
    items_path: str | None = None
    """generic: items file (Parquet/CSV); default ``items.parquet``/``items.csv`` beside the events."""
    impressions_path: str | None = None
    """generic: impressions file (Parquet/CSV, one row per shown item; ``--impressions``): its requests replace
    the feedviews synthesised from the events (:mod:`genrec.data.ingest.impressions`). Default: none."""

    def __post_init__(self) -> None:
        if not isinstance(self.slate_size, int) or self.slate_size < 1:
            raise ConfigError(f"--slate-size: must be a positive integer, got {self.slate_size!r}")
        if not isinstance(self.rating_rule, RatingRule):
            raise ConfigError(f"rating_rule: expected a RatingRule, got {type(self.rating_rule).__name__}")
        if not self.delimiter:
            raise ConfigError("--delimiter: must not be empty")
        if self.map_ids not in (None, True, False):
            raise ConfigError(f"map_ids (--map-ids / --no-map-ids): expected True, False or None (numbered when an "
                              f"id is not an integer), got {self.map_ids!r}")
        check_time_format(self.time_format)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
