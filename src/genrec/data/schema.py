"""The canonical schema every ingestor produces and every later stage reads.

* ``events(user_id, item_id, surface, action, timestamp, seq)`` -- one row per interaction.
  ``seq`` is the 0-based position of the row in its user's history after sorting by
  (timestamp, source order); it is the order leave-one-out splits and feedviews use,
  because many datasets have ties in ``timestamp`` (MovieLens) or no time at all (Amazon:
  ``timestamp == seq``).
* ``items(item_id, title, text, attributes)`` -- ``text`` is what content encoders read;
  ``attributes`` is a JSON object string (genres, year, categories, brand, ...).
* ``feedviews(user_id, request_ts, request_seq, surface, item_ids, labels)`` -- one row per
  request: the slate shown and, per slate item, a bitmask over the action vocabulary
  (bit ``c`` set = action ``c`` happened; 0 = impression only).

The action vocabulary, the surfaces and which actions count as positive engagement are
*data*: they live in :class:`DatasetInfo`, saved in the tables' manifest, not in code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("surface", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("seq", pa.int32(), nullable=False),
    ]
)

ITEMS_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("title", pa.string(), nullable=True),
        pa.field("text", pa.string(), nullable=False),
        pa.field("attributes", pa.string(), nullable=False),
    ]
)

FEEDVIEWS_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("request_ts", pa.int64(), nullable=False),
        pa.field("request_seq", pa.int32(), nullable=False),
        pa.field("surface", pa.string(), nullable=False),
        pa.field("item_ids", pa.list_(pa.field("element", pa.int64(), nullable=False)), nullable=False),
        pa.field("labels", pa.list_(pa.field("element", pa.int32(), nullable=False)), nullable=False),
    ]
)

IMPRESSION = "impression"


@dataclass
class DatasetInfo:
    """What the data means: vocabularies and how feedviews were formed."""

    name: str
    actions: list[str]
    """Action vocabulary, index = bit in feedview labels. Does not contain ``impression``."""
    positive_actions: list[str]
    """Actions that count as engagement: next-item retrieval targets and 'interacted' feedviews."""
    surfaces: list[str]
    feedview_rule: str
    """Human-readable statement of how feedviews were formed: synthesised from the events (every bundled dataset),
    or read from an impressions file (``impressions``)."""
    action_rule: str = ""
    has_timestamps: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    time_rule: str = ""
    """How the source's timestamps became ``events.timestamp`` (int64 epoch seconds, UTC): the format read,
    the zone assumed, the unit. Empty for datasets whose files hold epoch seconds as they are."""
    impressions: bool = False
    """True: the feedviews are logged slates from an impressions file (:mod:`genrec.data.ingest.impressions`;
    label 0 = shown, not engaged), not chunks of the events, so slate item j is NOT the event ``request_seq + j``:
    the join finds the slate holding an event by its item and action bit (:mod:`genrec.data.join`)."""

    def action_index(self) -> dict[str, int]:
        return {a: i for i, a in enumerate(self.actions)}

    def surface_index(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.surfaces)}

    def positive_mask(self) -> int:
        idx = self.action_index()
        m = 0
        for a in self.positive_actions:
            m |= 1 << idx[a]
        return m

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DatasetInfo":
        return cls(**d)


@dataclass
class Dataset:
    """An ingested dataset in memory: the three canonical tables plus their meaning."""

    info: DatasetInfo
    events: pa.Table
    items: pa.Table
    feedviews: pa.Table
    source: dict[str, Any] = field(default_factory=dict)
    """What was read: paths, sizes, checksums."""
