"""Versioned hot swap of the served bundle (PinGER §4: the SID->item index is rebuilt and swapped daily).

The server holds ONE reference to an immutable :class:`Bundle` (engine = model + catalogue + SID
build + ANN index, and its version string). A request reads the reference once at its start and
uses that bundle to the end, so in-flight requests finish on the version they started with.
``reload()`` builds a new bundle from the checkpoint and ``sid/CURRENT`` *off the request path*
(the caller runs it in a thread), then replaces the reference in one assignment (atomic in
CPython). A failed build (half-written SID version, codebook mismatch, torn checkpoint) leaves
the served bundle untouched and is reported. Reloads are serialised by a lock; a reload that
finds the same version (checkpoint, tables and SID versions: :attr:`Engine.version`) keeps the current bundle.

Non-standard: ``genrec sid build`` publishes a version by renaming a complete folder and then
rewriting ``CURRENT`` atomically, so a build killed at any point cannot make ``reload`` see a
partial index: it either sees the previous ``CURRENT`` or the new, complete one.

Concurrent reloads are coalesced (single flight): a reload asked for while a build runs waits for
it, then shares ONE further build with every other caller that arrived meanwhile (that build starts
after all of them asked, so it sees whatever they meant to publish). N simultaneous
``/admin/reload`` calls therefore cost at most two builds, not N.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrec.serve.engine import Engine

log = logging.getLogger("genrec.serve")


@dataclass(frozen=True)
class Bundle:
    version: str
    engine: Engine
    loaded_at: float


class BundleHolder:
    """The served bundle and the reload machinery."""

    def __init__(self, workdir: str | Path, checkpoint: str | Path | None = None, device: str = "cpu",
                 loader: Callable[..., Engine] | None = None) -> None:
        self.workdir = Path(workdir)
        self.checkpoint = checkpoint
        self.device = device
        self._loader = loader or Engine.load
        self._lock = threading.Lock()  # held by the one build in progress
        # single flight: callers take tickets; a build started after ticket t was taken answers t
        self._flight = threading.Condition(threading.Lock())
        self._tickets = 0  # reload requests so far
        self._answered = 0  # every ticket <= this has its answer in self._answer
        self._building = False
        self._answer: dict[str, Any] = {}
        self.builds = 0  # bundles built by reload() (coalesced callers share one)
        self._bundle: Bundle | None = None
        self.last_error: str | None = None
        self.reloads = 0
        # called with a freshly built engine before it is swapped in (two-process mode: the ranking
        # process loads the new model first); its failure is logged, never blocks the swap
        self.before_swap: Callable[[Engine], None] | None = None

    @property
    def current(self) -> Bundle:
        b = self._bundle
        if b is None:
            raise RuntimeError("no bundle loaded yet")
        return b

    @property
    def ready(self) -> bool:
        return self._bundle is not None

    def _build(self) -> Bundle:
        eng = self._loader(self.workdir, self.checkpoint, self.device)
        return Bundle(eng.version, eng, time.time())

    def load_initial(self) -> Bundle:
        with self._lock:
            self._bundle = self._build()
            return self._bundle

    def reload(self) -> dict[str, Any]:
        """Build a new bundle and swap it in; on failure keep serving the old one. Blocking. Calls that
        overlap a build in progress share the next one (see the module docstring)."""
        with self._flight:
            self._tickets += 1
            mine = self._tickets
            while self._building:
                self._flight.wait()
            if self._answered >= mine:  # a build that started after we asked has answered
                return dict(self._answer, coalesced=True)
            self._building = True
            covers = self._tickets  # this build starts after every ticket taken so far
        res: dict[str, Any] = {"ok": False, "error": "reload did not finish"}
        try:
            res = self._reload_once()
        finally:
            with self._flight:
                self._building = False
                self._answered = covers
                self._answer = res
                self._flight.notify_all()
        return res

    def _reload_once(self) -> dict[str, Any]:
        with self._lock:
            self.builds += 1
            old = self._bundle
            t0 = time.perf_counter()
            try:
                new = self._build()
            except Exception as e:  # noqa: BLE001 - any failure keeps the old bundle
                self.last_error = f"{type(e).__name__}: {e}"
                return {"ok": False, "version": old.version if old else None, "error": self.last_error,
                        "seconds": time.perf_counter() - t0}
            self.last_error = None
            swapped = old is None or new.version != old.version
            if swapped and self.before_swap is not None:
                try:
                    self.before_swap(new.engine)
                except Exception as e:  # noqa: BLE001 - the new bundle still serves
                    log.warning("preparing bundle %s before the swap failed: %s", new.version, e)
            if swapped:
                self._bundle = new  # the one atomic reference swap
                self.reloads += 1
            return {"ok": True, "swapped": swapped, "version": self.current.version,
                    "previous": old.version if old else None, "seconds": time.perf_counter() - t0}

    def reload_in_background(self) -> threading.Thread:
        """For SIGHUP: reload on a daemon thread (the signal handler must not block)."""
        t = threading.Thread(target=self.reload, name="genrec-reload", daemon=True)
        t.start()
        return t
