"""Value checks that cost a device->host sync, and the one switch that skips them.

Non-standard here: checking that an index tensor lies in range (``int(x.max())``) forces the
host to wait for the device, and a CUDA graph cannot capture it. Inputs that are valid by
construction (beam codes, catalogue candidates, a shared-prefix plan computed from the cache)
or already checked once per request run inside :func:`trusted_inputs`, where such checks are
skipped; shape and dtype checks (host-only) always run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = ["checks_on", "trusted_inputs"]

_TRUSTED: ContextVar[bool] = ContextVar("genrec_trusted_inputs", default=False)


@contextmanager
def trusted_inputs() -> Iterator[None]:
    """Skip the value-range checks (device->host syncs) inside this block (this thread/context only)."""
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def checks_on() -> bool:
    """False inside :func:`trusted_inputs`, and while ``torch.compile`` traces (a compiled training
    forward runs on batches range-checked once per step by the objective; a sync would split its graph)."""
    if torch.compiler.is_compiling():
        return False
    return not _TRUSTED.get()
