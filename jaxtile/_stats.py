"""``jt.stats()``: what jaxtile compiled in this process, and what the cache answered."""

from __future__ import annotations

import dataclasses

from jaxtile.compiler import compile_log


@dataclasses.dataclass(frozen=True)
class KernelStats:
    """One kernel's compiles and cache hits in this process, over all its specialisations
    and targets."""

    compiles: int
    """Artifacts compiled (cache misses)."""
    compile_seconds: float
    """Wall time of those compiles, in seconds."""
    memory_hits: int
    """Builds answered by this process's in-memory cache."""
    disk_hits: int
    """Builds answered by the on-disk cache (``$JAXTILE_CACHE_DIR``)."""


def stats(reset: bool = False) -> dict[str, KernelStats]:
    """Per kernel name: compiles, their total time, and memory and disk cache hits in this
    process. ``reset=True`` returns the counts and starts from zero (e.g. around one step
    of a program). A call that reuses a specialisation already loaded in the kernel
    reaches no cache and counts nothing."""
    return {name: KernelStats(c.compiles, c.compile_seconds, c.memory_hits, c.disk_hits)
            for name, c in sorted(compile_log.snapshot(reset).items())}
