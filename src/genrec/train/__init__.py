"""Training: config presets + overrides, the trainer loop, crash-safe checkpoints, torchrun/DDP."""

from genrec.train.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint
from genrec.train.config import EarlyStoppingConfig, TrainConfig, apply_overrides
from genrec.train.distributed import DistInfo, init_distributed, shard_batch
from genrec.train.trainer import IterSpec, Trainer, TrainResult

__all__ = [
    "CheckpointError",
    "DistInfo",
    "EarlyStoppingConfig",
    "IterSpec",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "apply_overrides",
    "init_distributed",
    "load_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
    "shard_batch",
]
