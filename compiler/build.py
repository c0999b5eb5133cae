"""From a traced kernel body to a compiled, cached library: the compiler's entry points."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path

from . import cache, from_jaxpr, ir, printer, verify
from . import jax_internals as ji
from .passes.clamp_check import warn_clamped_accesses
from .passes.coverage import check_output_coverage
from .passes.dce import eliminate_dead_code
from .passes.scratch_init import zero_uninitialised_scratch
from .target import Target

_FORMAT = "jaxtile-compiler-1"


@functools.cache
def compiler_version() -> str:
    """Identifies the code generator: a digest of the compiler's own sources, so that a
    cached kernel is never reused after the lowering changed (in development as much as
    across releases)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256(_FORMAT.encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def to_tile_ir(name: str, jaxpr: ji.ClosedJaxpr, buffers: Sequence[ir.Buffer],
               grid: tuple[int, ...], threads: int,
               index_axes: Sequence[int | None]) -> ir.Kernel:
    """Convert, verify and clean up a traced body; the result is ready for lowering."""
    kernel = from_jaxpr.convert(name, jaxpr, buffers, grid, threads, index_axes)
    kernel = check_output_coverage(verify.verify(kernel))
    warn_clamped_accesses(kernel)
    return zero_uninitialised_scratch(eliminate_dead_code(kernel))


def kernel_key(kernel: ir.Kernel, target: Target) -> str:
    """The content key of a kernel on a target: IR text, target, compiler version."""
    return cache.content_key(printer.format_kernel(kernel, with_lines=False),
                             target.describe(), compiler_version())


def build(kernel: ir.Kernel, target: Target) -> cache.Entry:
    """Compile ``kernel`` for ``target``, or fetch it from the cache."""
    key = kernel_key(kernel, target)
    entry = cache.lookup(key)
    if entry is not None:
        return entry
    from .cpu import lower  # imports TVM: only on a cache miss

    library, symbol = lower.compile_to_library(kernel, target)
    return cache.store(key, library, symbol, kernel.num_blocks)
