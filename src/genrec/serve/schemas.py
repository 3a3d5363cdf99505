"""Request/response models of the HTTP service (issue 6 items 1 and 5: input policy).

Non-standard: bounds are part of the models, so an out-of-range ``k`` / ``beam_width`` /
``diversity_lambda`` fails validation with the field's name (422); NaN/inf are rejected for every
float; unknown fields are rejected (a typo like ``beam_witdh`` is an error, not a silent default).
Item ids are strict integers (no ``true``, no ``"12"``, no ``1.5``). Unknown item ids are NOT a
validation error: the engine drops and reports them (cold start still answers).

A history item is a ``TypedDict``, not a model: pydantic checks it just as strictly (same fields,
bounds, extra keys refused, same error locations) but hands back the plain dict, which is what
the engine takes -- no per-item model object to build and ``model_dump`` again (measured: 1.1 ms
of a 1,000-item request). Keys the client left out are absent from that dict (the engine reads
them with ``.get``).
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, with_config
from typing_extensions import Annotated, NotRequired, TypedDict  # pydantic needs typing_extensions' TypedDict < 3.12

MAX_K = 1000
MAX_BEAM = 256
MAX_LAMBDA = 10.0
MAX_HISTORY = 10_000
MAX_CANDIDATES = 2_000
MAX_FUSION_WEIGHT = 1_000.0
INT64 = 2 ** 63 - 1

ItemId = Annotated[StrictInt, Field(ge=-INT64, le=INT64)]  # item ids are int64 in every table
Vocab = Optional[Union[StrictStr, StrictInt]]  # an action/surface name or its index


_ALL_SOURCES: tuple[Literal["sid", "ann"], ...] = ("sid", "ann")

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


@with_config(ConfigDict(extra="forbid", allow_inf_nan=False))
class HistoryItem(TypedDict):
    item_id: ItemId
    action: NotRequired[Vocab]
    surface: NotRequired[Vocab]
    ts: NotRequired[Optional[Annotated[StrictInt, Field(ge=-INT64, le=INT64)]]]


class FusionWeightsRequest(_Strict):
    """Per-request L1 score fusion; a weight left out takes the server's (``genrec fusion tune``'s
    choice for the served checkpoint, else the action heads alone; ``/readyz`` shows them)."""

    action_weight: Optional[StrictFloat] = Field(default=None, ge=0.0, le=MAX_FUSION_WEIGHT)
    retrieval_weight: Optional[StrictFloat] = Field(default=None, ge=0.0, le=MAX_FUSION_WEIGHT)
    sid_weight: Optional[StrictFloat] = Field(default=None, ge=0.0, le=MAX_FUSION_WEIGHT)


class RecommendRequest(_Strict):
    history: list[HistoryItem] = Field(max_length=MAX_HISTORY)
    surface: Vocab = None
    request_ts: Optional[StrictInt] = Field(default=None, ge=-INT64, le=INT64)
    k: StrictInt = Field(default=10, ge=1, le=MAX_K)
    beam_width: StrictInt = Field(default=20, ge=1, le=MAX_BEAM)
    diversity_lambda: StrictFloat = Field(default=0.0, ge=0.0, le=MAX_LAMBDA)
    sources: list[Literal["sid", "ann"]] = Field(default_factory=lambda: list(_ALL_SOURCES), min_length=1, max_length=2)
    rank: StrictBool = True
    fusion: Optional[FusionWeightsRequest] = None
    exclude_history: StrictBool = Field(
        default=False,
        description="Unseen items only: return none of the items in `history` -- every one given, also those "
                    "older than the newest context window the model reads (retrieval over-fetches by as many, so "
                    "`k` items still come back while the catalogue has them). Default false: items already in the "
                    "history may be recommended again.")


class RankRequest(_Strict):
    history: list[HistoryItem] = Field(max_length=MAX_HISTORY)
    candidates: list[ItemId] = Field(min_length=1, max_length=MAX_CANDIDATES)
    surface: Vocab = None
    request_ts: Optional[StrictInt] = Field(default=None, ge=-INT64, le=INT64)


class Timings(BaseModel):
    encode: float = 0.0
    sid: float = 0.0
    ann: float = 0.0
    rank: float = 0.0
    total: float = 0.0


class RecommendedItem(BaseModel):
    item_id: int
    score: float
    action_probs: Optional[dict[str, float]]
    sid: Optional[list[int]]
    sources: list[str]


class RecommendResponse(BaseModel):
    items: list[RecommendedItem]
    dropped_items: list[int]
    truncated_items: int
    degraded: bool
    cold_start: bool = False
    index_version: str
    timings_ms: Timings


class RankedItem(BaseModel):
    item_id: int
    score: float
    action_probs: Optional[dict[str, float]]  # None on a cold start (no known history item)


class RankResponse(BaseModel):
    items: list[RankedItem]
    unknown_candidates: list[int]
    dropped_items: list[int]
    truncated_items: int
    cold_start: bool = False
    index_version: str
    timings_ms: Timings


class ErrorResponse(BaseModel):
    error: str
    message: str
    fields: list[str] = Field(default_factory=list)
