"""Is the item text worth building content vectors (and content SIDs) from?

An ingestor always gives every item a ``text``: when the data has no title it writes a
placeholder -- ``"Amazon item <asin>"`` (an Amazon category without titles), ``"item <id>"``
(a generic items file with empty text columns, or no items file), ``"Taobao item <id>.
Category <c>"``. TF-IDF over such text is noise (or a category one-hot), and SIDs quantised
from it are noise too. :func:`measure_text` says so before anyone trains on it:

* the item's *real text* is its ``text`` lower-cased and cut into word tokens, less the
  tokens of the item's own identifiers (``item_id``, and ``asin`` / ``original_id`` in its
  attributes) and less *boilerplate* tokens -- those in more than half of the items' texts
  (labels such as "Amazon item", "Brand:", "Categories:", "Genres:", a category every item
  shares), counted only in catalogues of at least :data:`BOILERPLATE_MIN_ITEMS` items. A row
  the ingestor synthesised (``attributes.synthesised``) has none;
* **coverage** = share of catalogue items with non-empty real text;
* **distinct ratio** = number of distinct real texts / number of items (placeholder items
  count as none);
* **duplicate share** = share of items whose real text is exactly another item's.

The text is **degenerate** when coverage < :data:`MIN_COVERAGE`, the distinct ratio <
:data:`MIN_DISTINCT_RATIO` or the duplicate share > :data:`MAX_DUPLICATE_SHARE`. Measured on
the shipped data: text with real titles sits near the good end of all three (MovieLens 100K:
coverage 1.0, distinct 0.989, duplicates 0.021; Amazon Beauty: 1.0 / 0.998 / 0.003);
placeholder text sits at the bad end of at least one (an id placeholder: coverage 0; the
Taobao sample, "Taobao item <id>. Category <c>": distinct 0.173, duplicates 0.918; Beauty
with its titles removed, brand + categories left: distinct 0.43 but duplicates 0.71 --
most items cannot be told apart by their text, so content codes would separate them only
by the disambiguation level). The thresholds sit well away from the titled data; a
catalogue whose titles repeat a few times each (colour or size variants) stays usable
unless most of its items share their text.

``genrec features build`` records the result in the features manifest (``text_quality``)
and warns; ``genrec sid build`` then quantises the engagement vectors by default
(:func:`genrec.sid.source.choose_sid_source`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from typing import Any

import pyarrow as pa

MIN_COVERAGE = 0.5
"""Below this share of items with real text, the text is degenerate."""
MIN_DISTINCT_RATIO = 0.2
"""Below this many distinct real texts per item, the text is degenerate."""
MAX_DUPLICATE_SHARE = 0.5
"""Above this share of items whose real text is exactly another item's, the text is degenerate."""
BOILERPLATE_SHARE = 0.5
"""A token in more than this share of the items' texts is a label, not content."""
BOILERPLATE_MIN_ITEMS = 20
"""Boilerplate is only counted in catalogues at least this large (in a handful of items every word is common)."""



class DegenerateTextWarning(UserWarning):
    """Content vectors were built from degenerate item text (see :func:`measure_text`)."""


_TOKEN = re.compile(r"\w+")
_ID_KEYS = ("asin", "original_id")


def _tokens(s: str) -> list[str]:
    return _TOKEN.findall(unicodedata.normalize("NFKC", s).lower())


def _own_ids(item_id: int, attributes: str | None) -> tuple[set[str], bool]:
    """The tokens of an item's own identifiers, and whether the ingestor synthesised its row."""
    ids = {str(item_id)}
    synthesised = False
    if attributes and any(f'"{k}"' in attributes for k in (*_ID_KEYS, "synthesised")):
        try:
            attrs = json.loads(attributes)
        except ValueError:
            attrs = None
        if isinstance(attrs, dict):
            synthesised = attrs.get("synthesised") is True
            for k in _ID_KEYS:
                if attrs.get(k) is not None:
                    ids.update(_tokens(str(attrs[k])))
    return ids, synthesised


def measure_text(items: pa.Table) -> dict[str, Any]:
    """Coverage, distinct ratio and verdict of ``items["text"]`` (see the module docstring).

    Returns a JSON-ready dict: ``items``, ``with_text``, ``coverage``, ``distinct_texts``,
    ``distinct_ratio``, ``duplicate_share``, ``largest_duplicate_group``, ``placeholder_examples``
    (up to 3 texts with no real text), ``boilerplate_tokens``, ``thresholds``, ``degenerate``,
    ``reasons`` (one sentence per threshold missed).
    """
    n = items.num_rows
    ids = items.column("item_id").to_pylist() if "item_id" in items.column_names else list(range(n))
    texts = items.column("text").to_pylist() if "text" in items.column_names else [None] * n
    attrs = items.column("attributes").to_pylist() if "attributes" in items.column_names else [None] * n
    own = [_own_ids(i, a) for i, a in zip(ids, attrs)]
    df: Counter[str] = Counter()
    if n >= BOILERPLATE_MIN_ITEMS:
        for (mine, synth), t in zip(own, texts):
            if not synth and t:
                df.update(set(_tokens(t)) - mine)
    boiler = {w for w, c in df.items() if c > BOILERPLATE_SHARE * n}
    keys: list[str] = []
    placeholders: list[str] = []
    for (mine, synth), t in zip(own, texts):
        key = "" if synth or not t else " ".join(w for w in _tokens(t) if w not in mine and w not in boiler)
        keys.append(key)
        if not key and len(placeholders) < 3:
            placeholders.append(t or "")
    real = [k for k in keys if k]
    counts = Counter(real)
    with_text, distinct = len(real), len(counts)
    dup = sum(c for c in counts.values() if c > 1)
    coverage = with_text / n if n else 0.0
    ratio = distinct / n if n else 0.0
    reasons = []
    if coverage < MIN_COVERAGE:
        reasons.append(f"only {coverage:.1%} of the {n} items have text beyond an id or placeholder "
                       f"(threshold {MIN_COVERAGE:.0%})")
    if ratio < MIN_DISTINCT_RATIO:
        reasons.append(f"only {distinct} distinct texts for {n} items, {ratio:.1%} (threshold "
                       f"{MIN_DISTINCT_RATIO:.0%})")
    dup_share = dup / n if n else 0.0
    if dup_share > MAX_DUPLICATE_SHARE:
        reasons.append(f"{dup_share:.1%} of the items have exactly the text of another item (threshold "
                       f"{MAX_DUPLICATE_SHARE:.0%})")
    return {
        "items": n, "with_text": with_text, "coverage": round(coverage, 4),
        "distinct_texts": distinct, "distinct_ratio": round(ratio, 4),
        "duplicate_share": round(dup_share, 4),
        "largest_duplicate_group": max(counts.values()) if counts else 0,
        "placeholder_examples": placeholders,
        "boilerplate_tokens": sorted(boiler, key=lambda w: (-df[w], w))[:10],
        "thresholds": {"min_coverage": MIN_COVERAGE, "min_distinct_ratio": MIN_DISTINCT_RATIO,
                       "max_duplicate_share": MAX_DUPLICATE_SHARE},
        "degenerate": bool(reasons), "reasons": reasons,
    }


def is_degenerate(quality: dict[str, Any] | None) -> bool:
    """Whether a features manifest's ``text_quality`` says the content vectors come from degenerate text.
    ``None`` (features built before this check, or content read from a file) is not degenerate."""
    return bool(quality and quality.get("degenerate") and quality.get("content_from_text", True))


def describe(quality: dict[str, Any]) -> str:
    """The numbers in words: 'coverage 0.0% (0 of 1682 items have real text), 0 distinct texts (0.0% of items),
    duplicate share 0.0%'."""
    return (f"coverage {quality['coverage']:.1%} ({quality['with_text']} of {quality['items']} items have real "
            f"text), {quality['distinct_texts']} distinct texts ({quality['distinct_ratio']:.1%} of items), "
            f"duplicate share {quality['duplicate_share']:.1%}")


def features_warning(quality: dict[str, Any]) -> str | None:
    """What ``genrec features build`` warns when the text is degenerate (None when it is usable)."""
    if not is_degenerate(quality):
        return None
    return ("the item text is degenerate -- " + "; ".join(quality["reasons"]) + ". The content vectors "
            "are built from it anyway, but they carry little or no meaning (" + describe(quality) + "). "
            "`genrec sid build` will quantise the engagement vectors instead (its default `--source` on such text); "
            "`--source content` still builds content SIDs, with a warning.")
