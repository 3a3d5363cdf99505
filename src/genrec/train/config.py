"""Training configuration: a dataclass with named presets and typed ``key=value`` overrides.

Non-standard: :func:`apply_overrides` works on *any* (nested) dataclass, so the lead can
compose ``RunConfig(model=ModelConfig, train=TrainConfig)`` and override
``model.d_model=64`` and ``train.lr=1e-3`` alike; each value is parsed against the field's
annotated type (int, float, bool, str, Literal, Optional, tuple, list) and a bad key or
value raises :class:`genrec.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from genrec.errors import ConfigError
from genrec.workdir import atomic_write_json, read_json

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

T = TypeVar("T")


@dataclass
class EarlyStoppingConfig:
    """Stop when ``metric`` (from ``eval_fn``) has not improved for ``patience`` evaluations."""

    metric: str = ""  # "" disables early stopping (the best checkpoint is still tracked if set)
    mode: Literal["max", "min"] = "max"
    patience: int = 0  # 0 = never stop early
    min_delta: float = 0.0

    def improves(self, value: float, best: float | None) -> bool:
        """Whether ``value`` beats ``best`` (None: nothing yet) by more than ``min_delta`` in ``mode``'s direction."""
        return best is None or (value > best + self.min_delta if self.mode == "max" else value < best - self.min_delta)


@dataclass
class TrainConfig:
    """Optimiser, schedule, and loop settings. ``batch_size`` is GLOBAL (all ranks together)."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    warmup_steps: int = 100
    total_steps: int = 1000
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1
    # "deadline": the decay's progress is max(step progress, elapsed / max_minutes), so the LR reaches
    # min_lr_ratio when the time budget ends (for time-capped runs that would otherwise stop mid-schedule)
    decay_by: Literal["steps", "deadline"] = "steps"
    grad_clip: float = 1.0  # 0 disables clipping
    # >0: keep an exponential moving average of the weights with this decay (warmed up; see
    # genrec.train.ema); evaluation, early stopping and the checkpoint's model.safetensors use the
    # average, training goes on from the live weights (saved beside it). 0 = off
    ema_decay: float = 0.0
    batch_size: int = 256
    seed: int = 0
    bf16: bool = True  # autocast to bfloat16; only ever applied on CUDA
    device: Literal["auto", "cpu", "cuda"] = "auto"
    log_every: int = 50
    eval_every: int = 0  # 0 = evaluate only at the end (if an eval_fn is given)
    ckpt_every: int = 500  # 0 = checkpoint only at the end
    keep_last: int = 3
    num_workers: int = 0
    tensorboard: bool = True
    # "auto": a tqdm bar when stderr is a terminal, else plain progress lines on stderr (a log file gets them);
    # "on": the bar always; "off": neither
    progress: Literal["auto", "on", "off"] = "auto"
    # plain progress lines (progress="auto", stderr not a terminal): at a log step (log_every) once this many
    # seconds have passed since the last line, whichever is rarer, and at the last step; 0 = every log step
    progress_every_s: float = 30.0
    find_unused_parameters: bool = False
    # torch.compile the model's training forward (fuses the elementwise work between the matmuls and
    # attention kernels; an eager step is host-bound at small widths). Compiles once per batch shape.
    compile: bool = False
    # torch.compile's mode when compile=true: "reduce-overhead" also records the compiled forward and
    # backward as CUDA graphs (one per batch shape) and replays them, which removes the host's launch
    # work from the step; "max-autotune" does that and tunes matmul tiles (minutes of compile);
    # "max-autotune-no-cudagraphs" tunes without graphs. On a CPU there are no graphs to record. The graphed
    # modes were checked on one GPU (same losses as "default", 1.19-1.31x its items/s on MovieLens 100K,
    # 1.44x on Amazon Beauty's variable-length batches, same validation recall), not under torchrun:
    # there the graphed modes give way to their graph-free siblings (compile_mode_for_world).
    # Unused (and said so) when compile=false: gpu-base sets reduce-overhead, and train.compile=false
    # alone turns compiling off.
    compile_mode: CompileMode = "default"
    max_minutes: float = 0.0  # >0: stop after this much wall time, over the whole run (resumes count on from the checkpoint); evaluated + checkpointed like the last step
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)

    def __post_init__(self) -> None:
        validate(self)

    @classmethod
    def from_name(cls, name: str, overrides: list[str] | None = None) -> "TrainConfig":
        """A named preset (see :data:`PRESETS`), optionally with ``key=value`` overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown train preset {name!r}; choose one of {sorted(PRESETS)}")
        preset: dict[str, Any] = {k: (dataclasses.replace(v) if isinstance(v, EarlyStoppingConfig) else v)
                                  for k, v in PRESETS[name].items()}
        cfg = cls(**preset)
        return apply_overrides(cfg, overrides or [])

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        return from_dict(cls, d)

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(read_json(path))


COMPILE_MODES: tuple[str, ...] = typing.get_args(typing.get_type_hints(TrainConfig)["compile_mode"])
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes that record CUDA graphs


def compile_mode_for_world(mode: CompileMode, world_size: int) -> CompileMode:
    """The compile mode a run of ``world_size`` processes uses: under torchrun (world > 1) a CUDA-graph
    mode gives way to its graph-free sibling, because graphed training has been checked on one GPU only
    (the DDP gradient hooks around recorded graphs have not been); one process keeps ``mode``."""
    if world_size <= 1 or mode not in CUDA_GRAPH_MODES:
        return mode
    no_graphs: dict[str, CompileMode] = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
    return no_graphs[mode]


def compile_kwargs(mode: str, torch_version: str | None = None) -> dict[str, Any]:
    """``torch.compile``'s keyword arguments for ``train.compile_mode``: the mode's inductor options.

    Before torch 2.13, inductor's mixed-order reduction (a LayerNorm backward's row and column sums
    in one kernel) emitted its workspace slice without parentheses, so with a dynamic row count such as
    ``128 + 32*s0`` the compiled backward failed ("shape '[1728, 256]' is invalid for input of size
    128"; pytorch/pytorch#178080). Variable-length batches (Amazon Beauty) hit it on the second batch
    shape. On those versions the options turn that fusion off; 2.13 parenthesises the slice.
    """
    # torch._inductor takes ~1 s to load: only a run that compiles asks for these options
    import torch
    from torch._inductor import list_mode_options
    from torch.torch_version import TorchVersion

    options = dict(list_mode_options(mode))
    if TorchVersion(torch_version or torch.__version__) < "2.13":
        options["triton.mix_order_reduction"] = False
    return {"options": options} if options else {}


PRESETS: dict[str, dict[str, Any]] = {
    # CI / unit tests: a few dozen steps on 2 CPU cores
    "cpu-tiny": dict(lr=3e-3, warmup_steps=2, total_steps=20, batch_size=16, bf16=False, device="cpu",
                     log_every=5, ckpt_every=10, keep_last=2, tensorboard=False, progress="off"),
    # laptop-sized run on MovieLens-100k
    "cpu-small": dict(lr=1e-3, warmup_steps=50, total_steps=2000, batch_size=128, bf16=False, device="cpu",
                      log_every=50, eval_every=500, ckpt_every=500),
    # one H200
    "gpu-base": dict(lr=1e-3, warmup_steps=500, total_steps=20000, batch_size=1024, bf16=True, device="cuda",
                     log_every=100, eval_every=2000, ckpt_every=2000, num_workers=4,
                     early_stopping=EarlyStoppingConfig(metric="recall@10", mode="max", patience=5)),
    # several GPUs under torchrun (batch_size is global)
    "gpu-large": dict(lr=7e-4, warmup_steps=2000, total_steps=100000, batch_size=8192, bf16=True, device="cuda",
                      log_every=100, eval_every=5000, ckpt_every=5000, num_workers=8,
                      early_stopping=EarlyStoppingConfig(metric="recall@10", mode="max", patience=5)),
}


def validate(cfg: TrainConfig) -> None:
    """Range checks that types alone cannot express. Raises ConfigError naming the key."""
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"train config {key!r}: {what}, got {getattr(cfg, key)!r}")

    need(cfg.lr > 0, "lr", "must be > 0")
    need(cfg.weight_decay >= 0, "weight_decay", "must be >= 0")
    need(len(cfg.betas) == 2 and all(0 <= b < 1 for b in cfg.betas), "betas", "must be two numbers in [0, 1)")
    need(cfg.warmup_steps >= 0, "warmup_steps", "must be >= 0")
    need(cfg.total_steps >= 1, "total_steps", "must be >= 1")
    need(cfg.decay in ("cosine", "linear", "constant"), "decay", "must be cosine|linear|constant")
    need(0 <= cfg.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
    need(cfg.grad_clip >= 0, "grad_clip", "must be >= 0")
    need(0 <= cfg.ema_decay < 1, "ema_decay", "must be in [0, 1) (0 = no weight average)")
    need(cfg.batch_size >= 1, "batch_size", "must be >= 1")
    for key in ("log_every", "eval_every", "ckpt_every", "num_workers"):
        need(getattr(cfg, key) >= 0, key, "must be >= 0")
    need(cfg.keep_last >= 1, "keep_last", "must be >= 1")
    need(cfg.max_minutes >= 0, "max_minutes", "must be >= 0 (0 = no time limit)")
    need(cfg.progress_every_s >= 0, "progress_every_s", "must be >= 0 (0 = a line at every log step)")
    need(cfg.compile_mode in COMPILE_MODES, "compile_mode", f"must be one of {'|'.join(COMPILE_MODES)}")
    need(cfg.decay_by in ("steps", "deadline"), "decay_by", "must be steps|deadline")
    need(cfg.decay_by != "deadline" or cfg.max_minutes > 0, "max_minutes",
         "must be > 0 when decay_by='deadline' (the LR decays to its floor by that wall time)")
    es = cfg.early_stopping
    if es.mode not in ("max", "min"):
        raise ConfigError(f"train config 'early_stopping.mode': must be max|min, got {es.mode!r}")
    if es.patience < 0:
        raise ConfigError(f"train config 'early_stopping.patience': must be >= 0, got {es.patience!r}")


# ---------------------------------------------------------------------------- generic dataclass I/O

def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as e:  # pragma: no cover - a broken annotation is a programming error
        raise ConfigError(f"cannot resolve type hints of {cls.__name__}: {e}") from e


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Coerce ``value`` (a string from the CLI or a JSON value) to type ``tp``; ConfigError if not."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    def bad(why: str = "") -> ConfigError:
        return ConfigError(f"config key {key!r}: cannot use {value!r} as {_type_name(tp)}{': ' + why if why else ''}")

    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise bad()
    if origin is Literal:
        for a in args:
            if value == a or (isinstance(value, str) and str(a) == value):
                return a
        raise bad(f"allowed values are {list(args)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise bad()
    if tp is int:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                raise bad() from None
        raise bad()
    if tp is float:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad() from None
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    if origin in (tuple, list):
        if isinstance(value, str):
            s = value.strip()
            if s.startswith(("[", "(")):
                s = "[" + s[1:-1] + "]"
                try:
                    items = json.loads(s)
                except json.JSONDecodeError:
                    items = [x.strip() for x in s[1:-1].split(",") if x.strip()]
            else:
                items = [x.strip() for x in s.split(",") if x.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise bad()
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_convert(x, args[0], key) for x in items)
            if len(items) != len(args):
                raise bad(f"expected {len(args)} values")
            return tuple(_convert(x, a, key) for x, a in zip(items, args))
        inner = args[0] if args else Any
        return [_convert(x, inner, key) for x in items]
    if origin is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise bad("expected a JSON object") from None
        if not isinstance(value, dict):
            raise bad()
        return dict(value)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, dict):
            return from_dict(tp, value, _prefix=key + ".")
        if isinstance(value, tp):
            return value
        raise bad()
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise bad("unsupported field type")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def apply_overrides(cfg: T, overrides: list[str] | tuple[str, ...]) -> T:
    """Return a copy of dataclass ``cfg`` with each ``"a.b=value"`` applied (typed, validated)."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError("apply_overrides needs a dataclass instance")
    out = from_dict(type(cfg), to_dict(cfg))  # deep copy through the typed path
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} is not of the form key=value")
        key, _, raw = ov.partition("=")
        key = key.strip()
        parts = key.split(".")
        obj: Any = out
        for i, part in enumerate(parts):
            if not dataclasses.is_dataclass(obj):
                raise ConfigError(f"config key {key!r}: {'.'.join(parts[:i])!r} is not a section")
            names = {f.name for f in dataclasses.fields(obj)}
            if part not in names:
                where = ".".join(parts[:i]) or type(obj).__name__
                raise ConfigError(f"unknown config key {key!r} (no field {part!r} in {where}; "
                                  f"known: {sorted(names)})")
            if i < len(parts) - 1:
                obj = getattr(obj, part)
        tp = _hints(type(obj))[parts[-1]]
        if dataclasses.is_dataclass(tp):
            raise ConfigError(f"config key {key!r} is a section; set one of its fields, e.g. {key}.<name>=...")
        setattr(obj, parts[-1], _convert(raw.strip(), tp, key))
    _revalidate(out)
    return out


def _revalidate(obj: Any) -> None:
    post = getattr(obj, "__post_init__", None)
    if post is not None:
        post()
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            _revalidate(v)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (tuples become lists) — JSON-safe."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        return v
    return conv(cfg)


def from_dict(cls: type[T], d: dict[str, Any], *, _prefix: str = "") -> T:
    """Build dataclass ``cls`` from a (possibly partial) dict; unknown keys raise ConfigError."""
    if not isinstance(d, dict):
        raise ConfigError(f"config section {_prefix.rstrip('.') or cls.__name__!r} must be an object, got {d!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = set(d) - names
    if unknown:
        raise ConfigError(f"unknown config key(s) {sorted(_prefix + k for k in unknown)} for {cls.__name__}")
    kwargs = {k: _convert(v, hints[k], _prefix + k) for k, v in d.items()}
    return cls(**kwargs)
