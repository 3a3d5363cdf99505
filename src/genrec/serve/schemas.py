"""Request/response models of the HTTP service (issue 6 items 1 and 5: input policy).

Non-standard: bounds are part of the models, so an out-of-range ``k`` / ``beam_width`` /
``diversity_lambda`` fails validation with the field's name (422); NaN/inf are rejected for every
float; unknown fields are rejected (a typo like ``beam_witdh`` is an error, not a silent default).
Item ids are strict integers (no ``true``, no ``"12"``, no ``1.5``) -- unless the run's ids were remapped
(``genrec data prepare generic`` with string ids, or ``--map-ids``): then the app takes the ``SourceId*``
models, whose item ids are the source file's own (strings; a number is read as its text) and whose answers
name items by them (:func:`api_models` picks the set; :mod:`genrec.serve.ids` translates at the boundary).
Unknown item ids are NOT a validation error: the engine drops and reports them (cold start still answers).

Every field the client sees has a ``description`` and every body an ``examples`` entry: ``/docs`` and
``/openapi.json`` show them.

A history item is a ``TypedDict``, not a model: pydantic checks it just as strictly (same fields,
bounds, extra keys refused, same error locations) but hands back the plain dict, which is what
the engine takes -- no per-item model object to build and ``model_dump`` again (measured: 1.1 ms
of a 1,000-item request). Keys the client left out are absent from that dict (the engine reads
them with ``.get``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    ValidationInfo,
    field_validator,
    model_validator,
    with_config,
)
from typing_extensions import Annotated, NotRequired, TypedDict  # pydantic needs typing_extensions' TypedDict < 3.12

from genrec.errors import DataError
from genrec.infer.history import HistoryColumns
from genrec.serve.explain import Explain

MAX_K = 1000
MAX_BEAM = 256
MAX_LAMBDA = 10.0
MAX_HISTORY = 10_000
MAX_CANDIDATES = 2_000
MAX_FUSION_WEIGHT = 1_000.0
INT64 = 2 ** 63 - 1
MAX_ID_CHARS = 1024

ItemId = Annotated[StrictInt, Field(ge=-INT64, le=INT64)]  # item ids are int64 in every table


def _source_id_text(v: Any) -> Any:
    """A source-file item id as text: a string as given, an integer as its digits (anything else fails)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, str):
        return v
    raise ValueError("an item id of this run is the source file's id: a string, or an integer read as its text")


SourceItemId = Annotated[str, BeforeValidator(_source_id_text), Field(min_length=1, max_length=MAX_ID_CHARS),
                         WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}],
                                         "description": "The item's id in the source file (the run's ids were "
                                                        "remapped); a number is matched as its text."})]
"""An item id of a run whose ids were remapped: the source file's id (``"m242"``; ``242`` is read as ``"242"``)."""
Vocab = Optional[Union[StrictStr, StrictInt]]  # an action/surface name or its index


_ALL_SOURCES: tuple[Literal["sid", "ann"], ...] = ("sid", "ann")

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Timestamp = Annotated[StrictInt, Field(ge=-INT64, le=INT64)]


@with_config(ConfigDict(extra="forbid", allow_inf_nan=False))
class HistoryItem(TypedDict):
    """One event of the user's history, oldest first: the item, and optionally the action taken on it (name or
    index; default the first positive action), the surface it happened on (default the first) and its time
    (epoch seconds)."""

    item_id: ItemId
    action: NotRequired[Vocab]
    surface: NotRequired[Vocab]
    ts: NotRequired[Optional[Timestamp]]


@with_config(ConfigDict(extra="forbid", allow_inf_nan=False))
class SourceIdHistoryItem(TypedDict):
    """A history event of a run whose ids were remapped: ``item_id`` is the source file's id."""

    item_id: SourceItemId
    action: NotRequired[Vocab]
    surface: NotRequired[Vocab]
    ts: NotRequired[Optional[Timestamp]]


_COLUMNS_DOC = ("The user's events as columns, oldest first: `item_id[i]` and, where a column is given, `action[i]`, "
                "`surface[i]`, `ts[i]` (null: the default) are one event, as in `history`. Every column given holds "
                "one value per item_id. The same answer as `history`, read without an object per event (cheaper "
                "for long histories).")


class HistoryColumnsBody(_Strict):
    """A history as columns (``history_columns``): one list per field of ``HistoryItem``."""

    item_id: list[ItemId] = Field(max_length=MAX_HISTORY, description="The events' items.")
    action: Optional[list[Vocab]] = Field(default=None, max_length=MAX_HISTORY,
                                          description="Each event's action (name or index; null: the default).")
    surface: Optional[list[Vocab]] = Field(default=None, max_length=MAX_HISTORY,
                                           description="Each event's surface (name or index; null: the default).")
    ts: Optional[list[Optional[Timestamp]]] = Field(default=None, max_length=MAX_HISTORY,
                                                    description="Each event's time, epoch seconds (null: none).")

    @model_validator(mode="after")
    def _one_value_per_item(self) -> "HistoryColumnsBody":
        try:  # the rule is HistoryColumns' (a 422 here, naming history_columns)
            self.columns()
        except DataError as e:
            raise ValueError(f"{e.field}: {e.reason}") from None
        return self

    def columns(self) -> HistoryColumns:
        return HistoryColumns(self.item_id, self.action, self.surface, self.ts)


class SourceIdHistoryColumnsBody(HistoryColumnsBody):
    """``history_columns`` of a run whose ids were remapped: the source file's item ids."""

    item_id: list[SourceItemId] = Field(  # type: ignore[assignment]
        max_length=MAX_HISTORY, description="The events' items (the source file's ids).")


class _OneHistory(_Strict):
    """A request's history, given one way: ``history`` (events) or ``history_columns`` (declared first, so that
    ``history``'s check sees it; a missing history is an error naming ``history``)."""

    @field_validator("history", mode="after", check_fields=False)
    @classmethod
    def _exactly_one_history(cls, v: Any, info: ValidationInfo) -> Any:
        if "history_columns" not in info.data:  # history_columns itself failed: its error says why
            return v
        if v is None and info.data["history_columns"] is None:
            raise ValueError("required: the user's events as `history` (a list of events) or as `history_columns`")
        if v is not None and info.data["history_columns"] is not None:
            raise ValueError("give the history once: `history` or `history_columns`, not both")
        return v

    def the_history(self) -> Sequence[Any]:
        """The history as given: the list of event dicts, or a :class:`HistoryColumns`."""
        h: Any = getattr(self, "history")
        return h if h is not None else getattr(self, "history_columns").columns()


class FusionWeightsRequest(_Strict):
    """Per-request L1 score fusion; a weight left out takes the server's (``genrec fusion tune``'s
    choice for the served checkpoint, else the action heads alone; ``/readyz`` shows them)."""

    action_weight: Optional[StrictFloat] = Field(default=None, ge=0.0, le=MAX_FUSION_WEIGHT,
                                                 description="a: weight of the action heads' utility.")
    retrieval_weight: Optional[StrictFloat] = Field(default=None, ge=0.0, le=MAX_FUSION_WEIGHT,
                                                    description="w: weight of the dense retrieval logit (user "
                                                                "vector . item vector).")
    sid_weight: Optional[StrictFloat] = Field(default=None, ge=0.0, le=MAX_FUSION_WEIGHT,
                                              description="v: weight of the log-probability of the item's SID under "
                                                          "the SID beams.")
    transition_weight: Optional[StrictFloat] = Field(
        default=None, ge=0.0, le=MAX_FUSION_WEIGHT,
        description="t: weight of log P(item | the history's last item), from the served run's item pairs (> 0 needs "
                    "the table `genrec fusion tune` stores with a transition term; 0 leaves the term out).")
    history_weight: Optional[StrictFloat] = Field(
        default=None, ge=-MAX_FUSION_WEIGHT, le=MAX_FUSION_WEIGHT,
        description="h: added to the score of an item the request's history holds (negative demotes what the user "
                    "already had, positive promotes a repeat; 0 leaves the term out).")


_HISTORY_DOC = ("The user's events, oldest first (the newest context window of known items is read). Item ids "
                "not in the catalogue are dropped and listed in `dropped_items`; with no known item the answer "
                "is a cold start (popularity).")
_FUSION_DOC = ("This request's L1 fusion weights; a weight left out takes the server's (`/readyz` -> "
               "`l1_fusion`).")


class RecommendRequest(_OneHistory):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"history": [{"item_id": 50, "action": "like"}, {"item_id": 172}, {"item_id": 181, "ts": 1700000000}],
         "k": 10, "beam_width": 20, "diversity_lambda": 0.0, "sources": ["sid", "ann"], "rank": True},
        {"history": [{"item_id": 50}], "k": 5, "fusion": {"action_weight": 0.0, "retrieval_weight": 1.0,
                                                           "sid_weight": 0.05}, "exclude_history": True}]})

    history_columns: Optional[HistoryColumnsBody] = Field(default=None, description=_COLUMNS_DOC)
    history: Optional[list[HistoryItem]] = Field(default=None, max_length=MAX_HISTORY, validate_default=True,
                                                 description=_HISTORY_DOC)
    surface: Vocab = Field(default=None, description="The surface the request is for (name or index; default: "
                                                     "the last history event's).")
    request_ts: Optional[StrictInt] = Field(default=None, ge=-INT64, le=INT64,
                                            description="The request's time, epoch seconds (default: the last "
                                                        "history event's).")
    k: StrictInt = Field(default=10, ge=1, le=MAX_K, description="How many items to return.")
    beam_width: StrictInt = Field(default=20, ge=1, le=MAX_BEAM, description="SID beam width.")
    diversity_lambda: StrictFloat = Field(default=0.0, ge=0.0, le=MAX_LAMBDA,
                                          description="PinGER's prefix-depth diversity penalty on the SID beams.")
    sources: list[Literal["sid", "ann"]] = Field(default_factory=lambda: list(_ALL_SOURCES), min_length=1, max_length=2,
                                                 description="The retrieval stages: SID beam search, dense ANN search "
                                                             "(with ranking and a transition weight > 0, the last "
                                                             "item's most frequent successors join them).")
    rank: StrictBool = Field(default=True, description="Rank the retrieved union by the L1 score (false: order "
                                                       "by retrieval).")
    fusion: Optional[FusionWeightsRequest] = Field(default=None, description=_FUSION_DOC)
    exclude_history: StrictBool = Field(
        default=False,
        description="Unseen items only: return none of the items in `history` -- every one given, also those "
                    "older than the newest context window the model reads (retrieval over-fetches by as many, so "
                    "`k` items still come back while the catalogue has them). Default false: items already in the "
                    "history may be recommended again.")
    explain: StrictBool = Field(
        default=False,
        description="Also return `explain`: what each stage found for this request -- the history with titles "
                    "and which events the model read, the SID beams (codes, log-probabilities, the item each "
                    "reaches), the ANN items with their scores, the items' titles (the explorer page at `/` "
                    "shows it). The items are the same as without it; the request is never micro-batched.")


class SourceIdRecommendRequest(RecommendRequest):
    """``/v1/recommend`` for a run whose ids were remapped: history item ids are the source file's."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"history": [{"item_id": "m242", "action": "like"}, {"item_id": "m302"}], "k": 10},
        {"history": [{"item_id": "m242"}, {"item_id": 51}], "k": 5, "exclude_history": True}]})

    history_columns: Optional[SourceIdHistoryColumnsBody] = Field(default=None,  # type: ignore[assignment]
                                                                  description=_COLUMNS_DOC)
    history: Optional[list[SourceIdHistoryItem]] = Field(  # type: ignore[assignment]
        default=None, max_length=MAX_HISTORY, validate_default=True, description=_HISTORY_DOC)


_RANK_BEAMS_DOC = ("Only when the SID weight is > 0: the SID beams the candidates' log P(SID) term is read from "
                   "(as /v1/recommend's `{}`).")


class RankRequest(_OneHistory):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"history": [{"item_id": 50, "action": "like"}, {"item_id": 172}], "candidates": [181, 258, 7, 9]},
        {"history": [{"item_id": 50}], "candidates": [181, 258], "fusion": {"retrieval_weight": 1.0}}]})

    history_columns: Optional[HistoryColumnsBody] = Field(default=None, description=_COLUMNS_DOC)
    history: Optional[list[HistoryItem]] = Field(default=None, max_length=MAX_HISTORY, validate_default=True,
                                                 description=_HISTORY_DOC)
    candidates: list[ItemId] = Field(min_length=1, max_length=MAX_CANDIDATES,
                                     description="The items to score. Those not in the catalogue are left out and "
                                                 "listed in `unknown_candidates`.")
    surface: Vocab = Field(default=None, description="The surface the request is for (name or index; default: "
                                                     "the last history event's).")
    request_ts: Optional[StrictInt] = Field(default=None, ge=-INT64, le=INT64,
                                            description="The request's time, epoch seconds (default: the last "
                                                        "history event's).")
    fusion: Optional[FusionWeightsRequest] = Field(default=None, description=_FUSION_DOC)
    beam_width: StrictInt = Field(default=20, ge=1, le=MAX_BEAM, description=_RANK_BEAMS_DOC.format("beam_width"))
    diversity_lambda: StrictFloat = Field(default=0.0, ge=0.0, le=MAX_LAMBDA,
                                          description=_RANK_BEAMS_DOC.format("diversity_lambda"))


class SourceIdRankRequest(RankRequest):
    """``/v1/rank`` for a run whose ids were remapped: history and candidate ids are the source file's."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"history": [{"item_id": "m242", "action": "like"}, {"item_id": "m302"}], "candidates": ["m51", "m86", "m9"]}]})

    history_columns: Optional[SourceIdHistoryColumnsBody] = Field(default=None,  # type: ignore[assignment]
                                                                  description=_COLUMNS_DOC)
    history: Optional[list[SourceIdHistoryItem]] = Field(  # type: ignore[assignment]
        default=None, max_length=MAX_HISTORY, validate_default=True, description=_HISTORY_DOC)
    candidates: list[SourceItemId] = Field(  # type: ignore[assignment]
        min_length=1, max_length=MAX_CANDIDATES,
        description="The items to score (source-file ids). Those not in the catalogue are left out and listed in "
                    "`unknown_candidates`.")


class Timings(BaseModel):
    """Server time per stage, milliseconds."""

    encode: float = 0.0
    sid: float = 0.0
    ann: float = 0.0
    rank: float = 0.0
    total: float = 0.0


_L1 = ("a * sum_c u_c * p_c + w * (user vector . item vector) + v * log P(item's SID): the action heads' "
       "probabilities p_c weighed by the utility u_c (+1 positive actions, -1 negative ones, or the utility "
       "`genrec fusion tune` stored), the dense retrieval logit and the SID log-probability, with the served "
       "fusion weights (`/readyz` -> `l1_fusion`) or the request's `fusion`")
_COLD = "1 / (1 + the item's place in the training data's popularity order, 0 = most interacted)"
_PROBS = ("Per action, the ranking head's probability that the user takes that action on the item. Each action "
          "is an independent sigmoid (e.g. view and like can both be near 1): they do not sum to 1. null on a "
          "cold start{}.")
_ITEM_ID = "The item's id{}."
_SOURCE = " (the source file's id: the run's ids were remapped)"

RECOMMEND_SCORE = (f"What `items` is sorted by, highest first. Ranked (`rank`: true, the default): the L1 score {_L1}"
                   " -- /v1/rank gives the same number for the same item, history and `fusion`. Not ranked: a "
                   "single source's own score (SID beam log-probability, or ANN inner product), with both sources "
                   f"1 / (1 + place in their round-robin merge). Cold start: {_COLD}.")
RANK_SCORE = (f"What `items` is sorted by, highest first (ties in the request's order): the L1 score {_L1} -- the "
              f"same number /v1/recommend's ranked `score` gives the same item for the same history and `fusion`. "
              f"Cold start: {_COLD}.")

_EX_PROBS = {"view": 0.91, "like": 0.83, "dislike": 0.12}
_EX_TIMES = {"encode": 1.9, "sid": 4.2, "ann": 0.3, "rank": 1.1, "total": 7.6}


class RecommendedItem(BaseModel):
    item_id: int = Field(description=_ITEM_ID.format(""))
    score: float = Field(description=RECOMMEND_SCORE)
    action_probs: Optional[dict[str, float]] = Field(description=_PROBS.format(" or when not ranked"))
    sid: Optional[list[int]] = Field(description="The item's Semantic ID, one code per level (null: a model "
                                                 "without SIDs).")
    sources: list[str] = Field(description="The retrieval stages that found it: `sid` (beam search), `ann` (dense "
                                           "search), `transition` (the last history item's most frequent successors); `popular` "
                                           "on a cold start.")


class SourceIdRecommendedItem(RecommendedItem):
    item_id: str = Field(description=_ITEM_ID.format(_SOURCE))  # type: ignore[assignment]


def _recommend_example(ids: list[Any]) -> dict[str, Any]:
    return {"items": [{"item_id": ids[0], "score": 1.62, "action_probs": _EX_PROBS, "sid": [3, 17, 5],
                       "sources": ["sid", "ann"]},
                      {"item_id": ids[1], "score": 1.41, "action_probs": {"view": 0.88, "like": 0.71, "dislike": 0.18},
                       "sid": [3, 2, 9], "sources": ["ann"]}],
            "dropped_items": [ids[2]], "truncated_items": 0, "degraded": False, "cold_start": False,
            "index_version": "step-000500@3f9c2a1b7e+genrec_v0001.2+v0001", "timings_ms": _EX_TIMES}


_DROPPED = ("History item ids not in the catalogue, in request order: left out, not an error{}.")
_META = {
    "truncated_items": "Known history events older than the newest context window the model reads (left out).",
    "cold_start": "True when no history item was known: the answer is by popularity, without action "
                  "probabilities.",
    "index_version": "The served model: `<checkpoint>@<weights+features hash>+<tables version>+<SID version>` "
                     "(and the stored fusion weights); it changes on a hot swap. /readyz's `versions` spells it "
                     "out, with the tables and SID versions the checkpoint was trained on.",
    "timings_ms": "Server time per stage, milliseconds.",
}


class RecommendResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_recommend_example([50, 181, 99999])]})

    items: list[RecommendedItem] = Field(description="The recommended items, best first.")
    dropped_items: list[int] = Field(description=_DROPPED.format(""))
    truncated_items: int = Field(description=_META["truncated_items"])
    degraded: bool = Field(description="True when the ranking stage failed (two-process mode): the items are "
                                       "ordered by retrieval.")
    cold_start: bool = Field(default=False, description=_META["cold_start"])
    index_version: str = Field(description=_META["index_version"])
    timings_ms: Timings = Field(description=_META["timings_ms"])
    explain: Optional[Explain] = Field(default=None, description="With the request's `explain`: what each stage "
                                                                 "found (null otherwise).")


class SourceIdRecommendResponse(RecommendResponse):
    model_config = ConfigDict(json_schema_extra={"examples": [_recommend_example(["m51", "m86", "m999"])]})

    items: list[SourceIdRecommendedItem] = Field(  # type: ignore[assignment]
        description="The recommended items, best first.")
    dropped_items: list[str] = Field(description=_DROPPED.format(_SOURCE))  # type: ignore[assignment]


class RankedItem(BaseModel):
    item_id: int = Field(description=_ITEM_ID.format(""))
    score: float = Field(description=RANK_SCORE)
    action_probs: Optional[dict[str, float]] = Field(description=_PROBS.format(""))


class SourceIdRankedItem(RankedItem):
    item_id: str = Field(description=_ITEM_ID.format(_SOURCE))  # type: ignore[assignment]


def _rank_example(ids: list[Any]) -> dict[str, Any]:
    return {"items": [{"item_id": ids[0], "score": 1.62, "action_probs": _EX_PROBS},
                      {"item_id": ids[1], "score": 0.97, "action_probs": {"view": 0.64, "like": 0.49, "dislike": 0.16}}],
            "unknown_candidates": [ids[2]], "dropped_items": [], "truncated_items": 0, "cold_start": False,
            "index_version": "step-000500@3f9c2a1b7e+genrec_v0001.2+v0001",
            "timings_ms": {**_EX_TIMES, "sid": 0.0, "ann": 0.0}}


_UNKNOWN = "Candidates not in the catalogue, in request order: left out{}."


class RankResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_rank_example([258, 7, 12345678])]})

    items: list[RankedItem] = Field(description="The known candidates, best first (ties in the request's order).")
    unknown_candidates: list[int] = Field(description=_UNKNOWN.format(""))
    dropped_items: list[int] = Field(description=_DROPPED.format(""))
    truncated_items: int = Field(description=_META["truncated_items"])
    cold_start: bool = Field(default=False, description=_META["cold_start"])
    index_version: str = Field(description=_META["index_version"])
    timings_ms: Timings = Field(description=_META["timings_ms"])


class SourceIdRankResponse(RankResponse):
    model_config = ConfigDict(json_schema_extra={"examples": [_rank_example(["m51", "m86", "m999"])]})

    items: list[SourceIdRankedItem] = Field(  # type: ignore[assignment]
        description="The known candidates, best first (ties in the request's order).")
    unknown_candidates: list[str] = Field(description=_UNKNOWN.format(_SOURCE))  # type: ignore[assignment]
    dropped_items: list[str] = Field(description=_DROPPED.format(_SOURCE))  # type: ignore[assignment]


class ErrorResponse(BaseModel):
    error: str
    message: str
    fields: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class ApiModels:
    """The request and response bodies of ``/v1/recommend`` and ``/v1/rank`` for one kind of run."""

    recommend_request: type[RecommendRequest]
    recommend_response: type[RecommendResponse]
    rank_request: type[RankRequest]
    rank_response: type[RankResponse]


def api_models(source_ids: bool) -> ApiModels:
    """The bodies of a run whose ids are the tables' integers (``source_ids`` False: strict int64 ids), or of
    one whose ids were remapped (True: the source file's ids, in and out)."""
    if source_ids:
        return ApiModels(SourceIdRecommendRequest, SourceIdRecommendResponse, SourceIdRankRequest,
                         SourceIdRankResponse)
    return ApiModels(RecommendRequest, RecommendResponse, RankRequest, RankResponse)
