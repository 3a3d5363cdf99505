"""L1 score-fusion weights, chosen on validation and kept beside the checkpoint they were chosen for.

The L1 score of a candidate (``Recommender.run_batch``) is ``a * Σ_c u_c p_c + w * (user ·
candidate vector) + v * log P(candidate's SID) + t * log P(candidate | last history item) + h * [candidate in the
history]``: the action heads' utility (UniPinRec's L1 alone:
a = 1, w = v = 0), the dense retrieval logit and the SID beam log-probability -- a product of
experts over the one encoding. Which weighting is best depends on the data (on Amazon Beauty, one
action type and no impressions, the heads alone rank badly and a = 0, w = 1, v = 0.05 wins), so
``genrec fusion tune`` chooses it on validation and stores it here, with the action utility it
was chosen under; the Recommender, ``genrec recommend``, ``genrec eval`` and the server then use
both (the utility replaces the +1 / -1 default) unless told otherwise: the scoring that was
validated is the scoring that is served.

Non-standard: the file is keyed by the checkpoint's weights (sha256 of ``model.safetensors``) and
the SID version, under ``WORKDIR/fusion/``; weights chosen for another checkpoint or other SIDs are
never picked up, nor weights chosen under another SID stage (``chosen_on.sid_mode``: the SID term's
log-probabilities differ in scale between the full-code beams and the dense leaf).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from genrec.errors import ConfigError, DataError
from genrec.workdir import atomic_write_json, file_digest, read_json

log = logging.getLogger(__name__)

__all__ = ["FusionWeights", "FUSION_GRID", "HISTORY_GRID", "TRANSITION_GRID", "fusion_file", "save_fusion", "load_fusion",
           "load_fusion_record", "parse_utility", "transition_file"]

FORMAT = "genrec.fusion/1"


@dataclass(frozen=True)
class FusionWeights:
    """``a`` (action heads' utility), ``w`` (dense retrieval logit), ``v`` (SID log-probability), ``t``
    (``log P(candidate | last history item)``, :mod:`genrec.infer.transitions`), all >= 0, and ``h`` (1 for a
    candidate the request's history holds: negative demotes what the user already had, positive promotes a
    repeat), any finite number."""

    action_weight: float = 1.0
    retrieval_weight: float = 0.0
    sid_weight: float = 0.0
    transition_weight: float = 0.0
    history_weight: float = 0.0

    def __post_init__(self) -> None:
        for name, x in asdict(self).items():
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or (
                    x < 0 and name != "history_weight"):
                raise ConfigError(f"{name} must be a finite number{'' if name == 'history_weight' else ' >= 0'}, "
                                  f"got {x!r}")

    def resolve(self, action_weight: float | None, retrieval_weight: float | None,
                sid_weight: float | None, transition_weight: float | None = None,
                history_weight: float | None = None) -> FusionWeights:
        """These weights with any explicitly given one replacing its default."""
        return FusionWeights(self.action_weight if action_weight is None else action_weight,
                             self.retrieval_weight if retrieval_weight is None else retrieval_weight,
                             self.sid_weight if sid_weight is None else sid_weight,
                             self.transition_weight if transition_weight is None else transition_weight,
                             self.history_weight if history_weight is None else history_weight)


# (a, w, v): the dense logit with SID priors of growing weight, the SID log-probability alone, and
# the heads with every (w, v) pair beside them
FUSION_GRID: tuple[tuple[float, float, float], ...] = tuple(
    [(0.0, 1.0, v) for v in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)]
    + [(0.0, 0.0, 1.0)]
    + [(1.0, w, v) for w in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0) for v in (0.0, 0.2, 0.5, 1.0, 2.0, 4.0)])

TRANSITION_GRID: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0)
"""The transition term's weights ``genrec fusion tune`` tries beside each (a, w, v) when the run has transitions
(docs/log/2026-12-06-l1-transitions.md: Beauty chose 3, ml-latest-small 20 -- past this grid, not decided --,
MovieLens 100K 0)."""


HISTORY_GRID: tuple[float, ...] = (0.0, 1.0, -0.5, -1.0, -2.0, -4.0, -8.0, -16.0, -32.0)
"""The history term's weights ``genrec fusion tune`` tries once (a, w, v, t) are chosen without it; the full grid is
then chosen again beside the best (docs/log/2026-12-06-paired-plain.md: Beauty's validation R@10 .1115 -> .1217 at
-4 with the rest fixed; every validation user chose -8, the grid's end until 2026-12-06, hence -16 and -32)."""


def transition_file(fusion_path: str | Path) -> Path:
    """The transition table served with the fusion weights at ``fusion_path`` (written beside them)."""
    p = Path(fusion_path)
    return p.with_name(p.stem + ".transitions.npz")


def fusion_file(workdir: str | Path, ckpt: str | Path, sid_version: str | None) -> Path:
    """``WORKDIR/fusion/<sha of the checkpoint's weights>-<SID version or 'nosid'>.json``."""
    weights = file_digest(Path(ckpt) / "model.safetensors")[:16]
    return Path(workdir) / "fusion" / f"{weights}-{sid_version or 'nosid'}.json"


def save_fusion(path: str | Path, weights: FusionWeights, meta: dict[str, Any]) -> Path:
    """Write the chosen weights (and how they were chosen) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"format": FORMAT, "weights": asdict(weights), **meta})
    return path


def read_fusion_meta(path: str | Path) -> dict[str, Any]:
    """Everything stored beside the weights (``chosen_on``, ``metric``, ...); {} when there is no file."""
    rec = _read(Path(path))
    return {} if rec is None else dict(rec[1])


def load_fusion(path: str | Path) -> FusionWeights | None:
    """The weights stored at ``path``; None when there is no such file. A damaged or foreign file is
    an error that names it (never silently replaced by defaults)."""
    rec = _read(Path(path))
    return None if rec is None else rec[0]


def load_fusion_record(path: str | Path, actions: list[str],
                       sid_mode: str | None = None) -> tuple[FusionWeights, dict[str, float] | None] | None:
    """The stored weights and the action utility they were chosen with (``chosen_on.utility``,
    checked against the model's ``actions``; None when the file records none), from one read. None when
    there is no file, or when ``sid_mode`` (the SID stage served) is not the one the weights were chosen
    under (``chosen_on.sid_mode``; files without it date from before the dense leaf: "full" or "merged")."""
    path = Path(path)
    rec = _read(path)
    if rec is None:
        return None
    weights, d = rec
    u = d.get("chosen_on", {}).get("utility")
    if u is not None and (not isinstance(u, dict) or not all(isinstance(k, str) and k in actions for k in u) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in u.values())):
        raise DataError(f"chosen_on.utility must map this model's actions {actions} to finite numbers, got {u!r}",
                        path=path, field="chosen_on.utility")
    chosen_mode = d.get("chosen_on", {}).get("sid_mode")
    if sid_mode is not None and sid_mode != chosen_mode and not (chosen_mode is None and sid_mode != "dense"):
        log.warning("%s: fusion weights chosen under the SID stage %r, served %r: not applied (run `genrec fusion "
                    "tune` again)", path, chosen_mode or "full", sid_mode)
        return None
    return weights, None if u is None else {k: float(v) for k, v in u.items()}


def _read(path: Path) -> tuple[FusionWeights, dict[str, Any]] | None:
    if not path.exists():
        return None
    try:
        d = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"not valid JSON ({e})", path=path) from e
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        fmt = d.get("format") if isinstance(d, dict) else None
        raise DataError(f"not a genrec fusion file (format {fmt!r})", path=path, field="format")
    w = d.get("weights")
    three = {"action_weight", "retrieval_weight", "sid_weight"}  # older files: t = 0, h = 0
    if not isinstance(w, dict) or set(w) not in (three, three | {"transition_weight"},
                                                 three | {"transition_weight", "history_weight"}):
        raise DataError("expected weights {action_weight, retrieval_weight, sid_weight[, transition_weight[, "
                        "history_weight]]}", path=path, field="weights")
    try:
        return FusionWeights(**w), d
    except ConfigError as e:
        raise DataError(str(e), path=path, field="weights") from e


def parse_utility(text: str) -> dict[str, float]:
    """``"like=1,view=0.5,dislike=-1"`` -> ``{"like": 1.0, ...}`` (actions left out weigh 0). Names are checked
    against a model's actions where it is used (:meth:`genrec.infer.recommender.Recommender.utility_vector`)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        name = name.strip()
        try:
            x = float(value) if eq and name else math.nan
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            raise ConfigError(f"utility: expected ACTION=NUMBER pairs separated by commas (e.g. like=1,dislike=-1), "
                              f"got {part!r} in {text!r}")
        if name in out:
            raise ConfigError(f"utility: {name!r} is given twice in {text!r}")
        out[name] = x
    return out
