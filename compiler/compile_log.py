"""What the compiler tells its user about its work: log records, per-kernel counts and a
progress line for long steps.

Records go to the ``jaxtile`` logger: a compile's start and end (kernel, target, seconds)
at INFO, a cache hit at DEBUG. Counts (:func:`record`, :func:`snapshot`) are per kernel
name for this process and back ``jt.stats()``. :func:`progress` writes one line on stderr
for a step that runs longer than expected, only when stderr is a terminal: a user waiting
at a prompt sees why, while logs and pipes stay clean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger("jaxtile")

PROGRESS_AFTER = 2.0
"""Seconds a compile runs before its progress line appears."""


@dataclasses.dataclass
class KernelCounts:
    """One kernel's compiles and cache hits in this process (all targets together)."""

    compiles: int = 0
    compile_seconds: float = 0.0
    memory_hits: int = 0
    disk_hits: int = 0


_counts: dict[str, KernelCounts] = {}
_lock = threading.Lock()


def record(kernel: str, outcome: str, seconds: float = 0.0) -> None:
    """Count ``outcome`` for ``kernel``: ``"compile"`` (taking ``seconds``), or a cache hit
    ``"memory"`` / ``"disk"`` (a prebuilt entry, ``"prebuilt"``, is read from disk too)."""
    with _lock:
        counts = _counts.setdefault(kernel, KernelCounts())
        if outcome == "compile":
            counts.compiles += 1
            counts.compile_seconds += seconds
        elif outcome == "memory":
            counts.memory_hits += 1
        elif outcome in ("disk", "prebuilt"):
            counts.disk_hits += 1
        else:
            raise ValueError(f"unknown outcome {outcome!r}")


def snapshot(reset: bool = False) -> dict[str, KernelCounts]:
    """A copy of the counts per kernel name; ``reset`` starts counting afresh."""
    with _lock:
        copy = {name: dataclasses.replace(c) for name, c in _counts.items()}
        if reset:
            _counts.clear()
    return copy


@contextlib.contextmanager
def progress(message: str, after: float | None = None) -> Iterator[None]:
    """Around a step that may be long: if it is still running after ``after`` seconds
    (default :data:`PROGRESS_AFTER`; 0 for a step known to be long) and stderr is a
    terminal, write ``jaxtile: <message>...`` and, when it ends, `` done (N.N s)`` (or
    `` failed``, if it raised) on the same line. Nothing is written otherwise."""
    stream = sys.stderr
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        yield
        return
    delay = PROGRESS_AFTER if after is None else after
    start = time.perf_counter()
    shown = False
    guard = threading.Lock()

    def show() -> None:
        nonlocal shown
        with guard:
            stream.write(f"jaxtile: {message}...")
            stream.flush()
            shown = True

    timer = threading.Timer(delay, show)
    timer.daemon = True
    if delay <= 0:
        show()
    else:
        timer.start()
    finished = False
    try:
        yield
        finished = True
    finally:
        timer.cancel()
        with guard:
            if shown:
                outcome = "done" if finished else "failed"
                stream.write(f" {outcome} ({time.perf_counter() - start:.1f} s)\n")
                stream.flush()
