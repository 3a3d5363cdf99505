"""Synthetic interaction logs at any scale, streamed into the bucketed tables (issue 40).

:func:`synthesize` writes ``events``, ``feedviews`` and ``items`` for ``users`` x ``items`` with about
``events`` rows (exactly ``events`` unless ``users * min_events`` exceeds it: then it refuses) into
``WORKDIR/tables`` through :meth:`genrec.data.store.TableStore.open_writer`, a chunk of whole users at a
time, so memory is bounded by the chunk (and O(users + items) arrays), not by ``events``. The work
directory is then read by ``features build``, ``sid build`` and ``train`` like an ingested one.

The generative model (every knob is a :class:`SynthConfig` field):

* **Items** ``1..items``: popularity ``w = rank^-zipf`` (ranks a random permutation of the ids); each item
  belongs to one of ``topics`` latent topics (equal sizes), and, within its topic, to a *series* of
  ``series_size`` items of neighbouring popularity. An item holding more than ``topic_share`` of an average
  topic's mass is spread over that many more topics (Zipf's head would otherwise be most of its topic's
  draws: sessions replaying one item). Item text is built from the item's own topic's two words, its
  series' word and the id (a content encoder sees topic and series); ``attributes`` holds the own topic,
  series, a price and a year as JSON.
* **Users** ``1..users``: history lengths ``min_events`` + a lognormal share (``length_sigma``) of the
  rest, rounded so they sum to ``events`` exactly; 1..``topics_per_user`` preferred topics, drawn in
  proportion to the topics' popularity mass.
* **Sequences**: sessions of geometric length (mean ``session_len``). At a session start, and within a
  session with probability ``topic_switch`` a step, the topic is redrawn: one of the user's preferred
  topics, or (probability ``explore``) any topic by mass. An event either *follows the series* of the
  previous item (probability ``series_follow``; an item-to-item transition: next item drawn by popularity
  within that series) or is drawn by popularity within the current topic. Both draws leave the
  popularity distribution stationary, so the item marginal is Zipf(``zipf``) in expectation; an immediate
  repeat of the previous item is drawn once more, which trims the head slightly (fitted slope ~0.98-0.99
  for ``zipf=1``; about 3% of consecutive events repeat an item).
* **Time**: epoch seconds from ``start`` + a uniform offset in ``span_days``; gaps of 1 + exponential
  (mean ``gap_seconds``) within a session and 60 s + exponential (mean ``session_gap_hours``) between
  sessions: strictly increasing per user; ``seq`` = 0..n-1.
* **Surfaces** drawn with ``surfaces``' shares at each session start and (probability
  ``surface_switch``) within a session. **Actions**: with probability ``action_item_corr`` the item's
  own typical action (drawn once per item from the shares), else a fresh draw from ``actions``' shares,
  so both marginals equal the configured shares in expectation and the ranking head has an item signal.
* **Feedviews** as every ingestor synthesises them (:mod:`genrec.data.ingest.feedviews`, same rule text).

Determinism: every random number of a user's history is a hash of (``seed``, user id, position, stream)
(splitmix64), and the catalogue and the history lengths are drawn for the whole population up front, so
the tables depend on ``seed`` and the configuration only -- not on ``chunk_users`` (tested).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.data.ingest.build import events_table
from genrec.data.ingest.feedviews import DEFAULT_SLATE_SIZE, build_feedviews, feedview_rule_text
from genrec.data.schema import IMPRESSION, ITEMS_SCHEMA, DatasetInfo
from genrec.data.store import TableStore, catalog_config
from genrec.errors import ConfigError
from genrec.workdir import WorkDir

__all__ = ["SynthConfig", "synthesize"]

DEFAULT_ACTIONS = {"view": 0.55, "click": 0.25, "save": 0.08, "like": 0.07, "hide": 0.05}
DEFAULT_POSITIVE = ("view", "click", "save", "like")
DEFAULT_SURFACES = {"home": 0.6, "search": 0.25, "related": 0.15}
CHUNK_EVENTS = 1 << 21
"""Events per chunk when ``chunk_users`` is not given (about 0.5 GB of working memory)."""
ITEM_CHUNK = 1 << 18


@dataclass(frozen=True)
class SynthConfig:
    """What :func:`synthesize` generates; see the module docstring for the model."""

    users: int
    items: int
    events: int
    seed: int = 0
    zipf: float = 1.0
    topics: int | None = None
    """Latent topics; None: ``round(sqrt(items) / 2)`` clipped to [2, items]."""
    topics_per_user: int = 3
    series_size: int = 8
    min_events: int = 5
    length_sigma: float = 1.0
    session_len: float = 8.0
    topic_switch: float = 0.1
    explore: float = 0.1
    series_follow: float = 0.5
    topic_share: float = 0.1
    """The largest share of an average topic's mass one slot may hold: a more popular item is spread over
    several topics (keeps sessions in a topic from replaying its one blockbuster)."""
    actions: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    positive_actions: tuple[str, ...] = DEFAULT_POSITIVE
    surfaces: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SURFACES))
    surface_switch: float = 0.1
    action_item_corr: float = 0.3
    slate_size: int = DEFAULT_SLATE_SIZE
    start: int = 1_600_000_000
    span_days: float = 365.0
    gap_seconds: float = 45.0
    session_gap_hours: float = 36.0

    def __post_init__(self) -> None:
        for key in ("users", "items", "events", "topics_per_user", "series_size", "min_events", "slate_size"):
            v = getattr(self, key)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"--{key.replace('_', '-')}: must be a positive integer, got {v!r}")
        if self.events < self.users * self.min_events:
            raise ConfigError(f"--events: {self.events} is fewer than users x min_events = {self.users} x "
                              f"{self.min_events}; ask for more events or fewer users")
        if self.topics is not None and not 1 <= self.topics <= self.items:
            raise ConfigError(f"topics: must be in [1, items={self.items}], got {self.topics}")
        for key in ("zipf", "session_len", "gap_seconds", "session_gap_hours", "span_days"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                raise ConfigError(f"{key}: must be a positive number, got {getattr(self, key)!r}")
        if self.session_len < 1:
            raise ConfigError(f"session_len: mean events per session must be >= 1, got {self.session_len}")
        if not 0.0 < self.topic_share <= 1.0:
            raise ConfigError(f"topic_share: must be in (0, 1], got {self.topic_share!r}")
        for key in ("topic_switch", "explore", "series_follow", "surface_switch", "action_item_corr"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"{key}: must be a probability in [0, 1], got {getattr(self, key)!r}")
        if not self.length_sigma >= 0:
            raise ConfigError(f"length_sigma: must be >= 0, got {self.length_sigma!r}")
        for key in ("actions", "surfaces"):
            shares = getattr(self, key)
            if not shares or any(not (math.isfinite(v) and v >= 0) for v in shares.values()) or \
                    sum(shares.values()) <= 0:
                raise ConfigError(f"{key}: give names with non-negative shares, not all zero; got {shares!r}")
        if IMPRESSION in self.actions:
            raise ConfigError(f"actions: {IMPRESSION!r} is reserved (label 0 in feedviews)")
        unknown = [a for a in self.positive_actions if a not in self.actions]
        if unknown or not self.positive_actions:
            raise ConfigError(f"positive_actions: must be a non-empty subset of {list(self.actions)}, got "
                              f"{list(self.positive_actions)}")

    @property
    def n_topics(self) -> int:
        if self.topics is not None:
            return int(self.topics)
        return int(min(self.items, max(2, round(math.sqrt(self.items) / 2))))


# ----------------------------------------------------------------------------- counter-based randomness

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, uint64 -> uint64 (wrapping arithmetic). [N] -> [N]."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _keys(seed: int, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """A 64-bit key per (seed, a[, b]): the root every stream of that row is hashed from. [N] -> [N] uint64."""
    s = np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
    h = _mix(np.asarray(a).astype(np.uint64) * _GOLD ^ _mix(np.full(1, s, dtype=np.uint64)))
    if b is not None:
        h = _mix(h ^ (np.asarray(b).astype(np.uint64) + np.uint64(1)) * _M2)
    return h


def _uniform(keys: np.ndarray, stream: int) -> np.ndarray:
    """[N] float64 in [0, 1): stream ``stream`` of each key, independent across streams."""
    h = _mix(keys ^ np.uint64(((stream + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


# streams of per-event randomness (keys = (seed, user, position))
(_SESSION, _T_SWITCH, _EXPLORE, _T_PICK, _T_DRAW, _FOLLOW, _ITEM, _ITEM_AGAIN, _S_SWITCH, _SURFACE, _A_MIX, _ACTION,
 _GAP) = range(13)
# streams of per-user randomness (keys = (seed, user))
_LEN_A, _LEN_B, _N_PREF, _START = range(4)
_PREF = 16  # + k for the k-th preferred topic


# ----------------------------------------------------------------------------- the catalogue


@dataclass
class _World:
    """The catalogue laid out in *slots*, sorted by (topic, popularity rank), so a topic and a series are slot
    ranges. An item has one slot, in its own topic, unless it is too popular for one topic: then its mass is
    spread over several slots in other topics too (a blockbuster shows up in many topics' sessions)."""

    slot_item: np.ndarray  # [S] item index (id - 1) of each slot
    cum: np.ndarray  # [S+1] cumulative popularity over slots, cum[-1] = 1
    slot_series: np.ndarray  # [S] series of each slot
    topic_lo: np.ndarray  # [T] first slot of each topic
    topic_hi: np.ndarray  # [T]
    series_lo: np.ndarray  # [Q] first slot of each series
    series_hi: np.ndarray  # [Q]
    topic_cdf: np.ndarray  # [T] cumulative topic mass
    topic_of: np.ndarray  # [I] each item's own topic (its text's)
    series_of: np.ndarray  # [I] each item's own series (in its own topic)
    typical_action: np.ndarray  # [I] each item's own action index
    lengths: np.ndarray  # [U] events of each user index (id - 1)
    action_cdf: np.ndarray  # [A]
    surface_cdf: np.ndarray  # [S']

    def draw(self, lo: np.ndarray, hi: np.ndarray, u: np.ndarray) -> np.ndarray:
        """A slot per row, drawn by popularity among slots [lo, hi). [N] -> [N]."""
        target = self.cum[lo] + u * (self.cum[hi] - self.cum[lo])
        return np.clip(np.searchsorted(self.cum, target, side="right") - 1, lo, hi - 1)


def _cdf(shares: dict[str, float]) -> np.ndarray:
    p = np.asarray(list(shares.values()), dtype=np.float64)
    c = np.cumsum(p / p.sum())
    c[-1] = 1.0
    return c


def _pick(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Index drawn from a cumulative distribution for each uniform. [N] -> [N] int64."""
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1).astype(np.int64)


def _lengths(cfg: SynthConfig) -> np.ndarray:
    """History lengths of all users, ``min_events`` + a lognormal share of the rest, summing to ``events``."""
    k = _keys(cfg.seed, np.arange(1, cfg.users + 1, dtype=np.int64))
    u1, u2 = 1.0 - _uniform(k, _LEN_A), _uniform(k, _LEN_B)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)  # Box-Muller: standard normal [U]
    raw = np.exp(cfg.length_sigma * z)
    rest = cfg.events - cfg.users * cfg.min_events
    q = raw / raw.sum() * rest
    n = np.floor(q).astype(np.int64)
    short = rest - int(n.sum())  # the largest remainders get one more
    if short > 0:
        n[np.argsort(-(q - n), kind="stable")[:short]] += 1
    return n + cfg.min_events


def _world(cfg: SynthConfig) -> _World:
    n_items, n_topics = cfg.items, cfg.n_topics
    rng = np.random.default_rng([cfg.seed, 40])
    rank = rng.permutation(n_items) + 1  # [I]
    topic_of = rng.permutation(np.arange(n_items) % n_topics)  # [I] equal-sized topics
    p = rank.astype(np.float64) ** -cfg.zipf
    p /= p.sum()
    # an item may hold at most `topic_share` of an average topic's mass in one slot: the head is spread out
    copies = np.maximum(1, np.ceil(p / (cfg.topic_share / n_topics))).astype(np.int64)  # [I]
    item_of = np.repeat(np.arange(n_items), copies)  # [S] before sorting
    own = np.r_[0, np.cumsum(copies)[:-1]]  # [I] each item's first slot: its own topic
    topic = rng.integers(0, n_topics, item_of.size)
    topic[own] = topic_of
    order = np.lexsort((rank[item_of], topic))  # by topic, then popularity
    slot_item, slot_topic = item_of[order], topic[order]
    cum = np.zeros(slot_item.size + 1)
    cum[1:] = np.cumsum(p[slot_item] / copies[slot_item])
    cum /= cum[-1]
    topic_lo = np.searchsorted(slot_topic, np.arange(n_topics), side="left")
    topic_hi = np.searchsorted(slot_topic, np.arange(n_topics), side="right")
    within = np.arange(slot_item.size) - topic_lo[slot_topic]  # slot's place in its topic
    per_topic = -(-(topic_hi - topic_lo) // cfg.series_size)  # series per topic
    slot_series = np.r_[0, np.cumsum(per_topic)[:-1]][slot_topic] + within // cfg.series_size  # [S]
    n_series = int(per_topic.sum())
    series_lo = np.searchsorted(slot_series, np.arange(n_series), side="left")
    series_hi = np.searchsorted(slot_series, np.arange(n_series), side="right")
    inverse = np.empty(slot_item.size, dtype=np.int64)
    inverse[order] = np.arange(slot_item.size)  # unsorted slot -> sorted slot
    series_of = slot_series[inverse[own]]  # [I]
    topic_cdf = np.cumsum(cum[topic_hi] - cum[topic_lo])
    topic_cdf[-1] = 1.0
    action_cdf = _cdf(cfg.actions)
    typical = _pick(action_cdf, rng.random(n_items))
    return _World(slot_item, cum, slot_series, topic_lo, topic_hi, series_lo, series_hi, topic_cdf, topic_of,
                  series_of, typical, _lengths(cfg), action_cdf, _cdf(cfg.surfaces))


# ----------------------------------------------------------------------------- items


def _syllable_words(rng: np.random.Generator, n: int, syllables: int) -> list[str]:
    cons, vows = list("bdfgklmnprstvz"), list("aeiou")
    c = rng.integers(0, len(cons), (n, syllables))
    v = rng.integers(0, len(vows), (n, syllables))
    return ["".join(cons[c[i, j]] + vows[v[i, j]] for j in range(syllables)) for i in range(n)]


def _item_tables(cfg: SynthConfig, world: _World) -> Iterator[pa.Table]:
    """The items table in chunks of ``ITEM_CHUNK`` rows (ids ascending)."""
    rng = np.random.default_rng([cfg.seed, 41])
    n_topics = cfg.n_topics
    words = _syllable_words(rng, 2 * n_topics, 3)
    topic_name = [f"{words[2 * t]} {words[2 * t + 1]}" for t in range(n_topics)]
    series_word = _syllable_words(rng, len(world.series_lo), 2)
    tags = _syllable_words(rng, 64, 2)  # shared filler words: noise for the content encoder
    tag = rng.integers(0, len(tags), (cfg.items, 2))
    price = np.round(np.exp(rng.normal(3.0, 1.0, cfg.items)), 2)
    year = rng.integers(1990, 2025, cfg.items)
    for lo in range(0, cfg.items, ITEM_CHUNK):
        hi = min(cfg.items, lo + ITEM_CHUNK)
        ids = np.arange(lo, hi)
        titles, texts, attrs = [], [], []
        for i in ids.tolist():
            t, s = int(world.topic_of[i]), int(world.series_of[i])
            title = f"{series_word[s].capitalize()} {topic_name[t].split()[0]} {i + 1}"
            titles.append(title)
            texts.append(f"{title}. {topic_name[t]}, {series_word[s]} series. {tags[tag[i, 0]]} {tags[tag[i, 1]]}")
            attrs.append(json.dumps({"topic": topic_name[t], "topic_id": t, "series": s, "price": float(price[i]),
                                     "year": int(year[i])}, sort_keys=True))
        yield pa.Table.from_arrays([pa.array(ids + 1, pa.int64()), pa.array(titles, pa.string()),
                                    pa.array(texts, pa.string()), pa.array(attrs, pa.string())], schema=ITEMS_SCHEMA)


# ----------------------------------------------------------------------------- events


def _forward_fill(mark: np.ndarray) -> np.ndarray:
    """Index of the last marked row at or before each row (row 0 must be marked). [N] bool -> [N] int64."""
    return np.maximum.accumulate(np.where(mark, np.arange(mark.size), 0))


def _user_chunk(cfg: SynthConfig, world: _World, info: DatasetInfo, lo: int, hi: int) -> tuple[pa.Table, pa.Table]:
    """Events and feedviews of user indices [lo, hi) (ids lo+1..hi), sorted by (user, seq)."""
    uid = np.arange(lo + 1, hi + 1, dtype=np.int64)  # [Uc]
    lens = world.lengths[lo:hi]
    n = int(lens.sum())
    first = np.concatenate([[0], np.cumsum(lens)[:-1]])  # [Uc] first row of each user
    row_user = np.repeat(np.arange(hi - lo), lens)  # [N] local user index
    pos = np.arange(n, dtype=np.int64) - first[row_user]  # [N] seq
    user = uid[row_user]
    k = _keys(cfg.seed, user, pos)  # [N]
    ku = _keys(cfg.seed, uid)  # [Uc]

    # sessions, topics and surfaces: piecewise constant, redrawn at change points
    new_session = (pos == 0) | (_uniform(k, _SESSION) < 1.0 / cfg.session_len)
    t_change = new_session | (_uniform(k, _T_SWITCH) < cfg.topic_switch)
    ci = np.flatnonzero(t_change)
    n_pref = 1 + np.floor(_uniform(ku, _N_PREF) * cfg.topics_per_user).astype(np.int64)  # [Uc]
    prefs = np.stack([_pick(world.topic_cdf, _uniform(ku, _PREF + j)) for j in range(cfg.topics_per_user)], 1)
    cu = row_user[ci]
    pref_pick = np.floor(_uniform(k[ci], _T_PICK) * n_pref[cu]).astype(np.int64)
    topic_c = np.where(_uniform(k[ci], _EXPLORE) < cfg.explore, _pick(world.topic_cdf, _uniform(k[ci], _T_DRAW)),
                       prefs[cu, pref_pick])
    topic = np.empty(n, dtype=np.int64)
    topic[ci] = topic_c
    topic = topic[_forward_fill(t_change)]
    s_change = new_session | (_uniform(k, _S_SWITCH) < cfg.surface_switch)
    surface = np.where(s_change, _pick(world.surface_cdf, _uniform(k, _SURFACE)), 0)[_forward_fill(s_change)]

    # items: by popularity within the topic, or within the previous item's series; an immediate repeat of the
    # previous item is drawn again once (fresh draws first, then the series follow-ups of the final anchors)
    fresh = t_change | (_uniform(k, _FOLLOW) >= cfg.series_follow)
    fi, si = np.flatnonzero(fresh), np.flatnonzero(~fresh)
    anchor = _forward_fill(fresh)[si]  # the last fresh draw before each follow-up: the previous item's series
    slot = np.zeros(n, dtype=np.int64)
    slot[fi] = world.draw(world.topic_lo[topic[fi]], world.topic_hi[topic[fi]], _uniform(k[fi], _ITEM))
    item = world.slot_item[slot]  # (rows si: filled below)
    for redraw in (False, True):
        if redraw:
            again = fi[(pos[fi] > 0) & (item[fi] == item[fi - 1])]
            slot[again] = world.draw(world.topic_lo[topic[again]], world.topic_hi[topic[again]],
                                     _uniform(k[again], _ITEM_AGAIN))
        series = world.slot_series[slot[anchor]]
        slot[si] = world.draw(world.series_lo[series], world.series_hi[series], _uniform(k[si], _ITEM))
        item = world.slot_item[slot]
    again = si[item[si] == item[si - 1]]  # (a follow-up is never a user's first event)
    series = world.slot_series[slot[again]]
    slot[again] = world.draw(world.series_lo[series], world.series_hi[series], _uniform(k[again], _ITEM_AGAIN))
    item = world.slot_item[slot]

    action = np.where(_uniform(k, _A_MIX) < cfg.action_item_corr, world.typical_action[item],
                      _pick(world.action_cdf, _uniform(k, _ACTION)))

    # time: a start per user, short gaps within sessions, long ones between
    u_gap = 1.0 - _uniform(k, _GAP)
    gap = np.where(new_session, 60.0 + cfg.session_gap_hours * 3600.0 * -np.log(u_gap),
                   1.0 + cfg.gap_seconds * -np.log(u_gap)).astype(np.int64)
    gap[pos == 0] = 0
    start = cfg.start + np.floor(_uniform(ku, _START) * cfg.span_days * 86400.0).astype(np.int64)  # [Uc]
    csum = np.cumsum(gap)
    ts = start[row_user] + csum - csum[first][row_user]

    seq = pos.astype(np.int32)
    events = events_table(user, item + 1, surface, action, ts, seq, info)
    feedviews = build_feedviews(user=user, seq=seq, timestamp=ts, item=item + 1, action_idx=action,
                                surface_idx=surface, surfaces=info.surfaces, slate_size=cfg.slate_size)
    return events, feedviews


# ----------------------------------------------------------------------------- the write


def _info(cfg: SynthConfig) -> DatasetInfo:
    actions = list(cfg.actions)
    return DatasetInfo(
        name="synthetic",
        actions=actions,
        positive_actions=list(cfg.positive_actions),
        surfaces=list(cfg.surfaces),
        feedview_rule=feedview_rule_text(cfg.slate_size, actions),
        action_rule=(f"Generated (genrec.data.synth, seed {cfg.seed}): with probability {cfg.action_item_corr} "
                     f"an event's action is its item's typical action (drawn once per item), else drawn with the "
                     f"shares {cfg.actions}; positive: {list(cfg.positive_actions)}."),
        has_timestamps=True,
        time_rule="Generated epoch seconds (UTC), strictly increasing per user: sessions of short gaps "
                  "separated by long ones.",
    )


def synthesize(workdir: str | Path, *, users: int, items: int, events: int, seed: int = 0, n_buckets: int = 16,
               chunk_users: int | None = None, overwrite: bool = True, **options: Any) -> dict[str, Any]:
    """Generate a synthetic log and write it as ``WORKDIR/tables`` (a new table version; the previous one stays
    current until the whole write has succeeded). ``options``: the other :class:`SynthConfig` fields
    (``zipf``, ``topics``, ``actions``, ``surfaces``, ``slate_size``, ...). ``chunk_users``: users generated
    and appended at a time (default: about ``CHUNK_EVENTS`` events' worth); it bounds memory and does not
    change the tables. Returns a summary: the tables' counts, the configuration, chunks and seconds."""
    t0 = time.perf_counter()
    try:
        cfg = SynthConfig(users=users, items=items, events=events, seed=seed, **options)
    except TypeError as e:
        names = [f.name for f in dataclasses.fields(SynthConfig)]
        raise ConfigError(f"synthesize: {e}; the options are {names}") from None
    if chunk_users is None:
        chunk_users = max(1, CHUNK_EVENTS * cfg.users // cfg.events)
    if not isinstance(chunk_users, (int, np.integer)) or isinstance(chunk_users, bool) or chunk_users < 1:
        raise ConfigError(f"chunk_users: must be a positive integer, got {chunk_users!r}")
    wd = WorkDir(workdir)
    store = TableStore(wd.tables, catalog_config())
    store.check_writable(n_buckets, overwrite)  # refuse before generating anything
    wd.ensure()
    world = _world(cfg)
    info = _info(cfg)
    config = dataclasses.asdict(cfg)
    actions = np.zeros(len(cfg.actions), dtype=np.int64)
    seen = np.zeros(cfg.items, dtype=bool)
    requests = chunks = 0
    with store.open_writer(info, n_buckets, source={"generator": "genrec.data.synth", "config": config},
                           overwrite=overwrite) as w:
        for table in _item_tables(cfg, world):
            w.append("items", table)
        for lo in range(0, cfg.users, chunk_users):
            ev, fv = _user_chunk(cfg, world, info, lo, min(cfg.users, lo + chunk_users))
            w.append("events", ev)
            w.append("feedviews", fv)
            seen[ev.column("item_id").to_numpy() - 1] = True
            actions += np.bincount(pc.index_in(ev.column("action"), pa.array(info.actions)).to_numpy(),
                                   minlength=len(actions))
            requests += fv.num_rows
            chunks += 1
            del ev, fv
        info.extra.update({
            "slate_size": cfg.slate_size,
            "counts": {
                "events": w.rows["events"],
                "users": w.users,
                "items": w.rows["items"],
                "interacted_items": int(seen.sum()),
                "requests": requests,
                "synthesised_items": 0,
                "actions": {a: int(c) for a, c in zip(info.actions, actions)},
            },
        })
    m = w.manifest
    assert m is not None
    return {"tables": str(wd.tables), "counts": m["counts"], "namespace": m["namespace"],
            "feedview_rule": info.feedview_rule, "config": config, "chunks": chunks, "chunk_users": chunk_users,
            "seconds": round(time.perf_counter() - t0, 3)}
