"""From a traced kernel body to a compiled, cached artifact: the compiler's entry points.

``to_tile_ir`` converts a traced body and runs the target-neutral pipeline once per
specialisation. ``build`` compiles that IR for one target: its content key (the neutral IR's
text, the target's description and the compiler's version) is looked up in the cache; on a
miss the target's own passes run and its backend (imported only then) compiles.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import time
from collections.abc import Sequence
from pathlib import Path

from . import cache, compile_log, from_jaxpr, ir, pipelines, printer, sizes
from . import jax_internals as ji
from .cuda.compile import CompiledCuda
from .errors import KernelError
from .hip.artifact import CompiledHip
from .target import Target

_FORMAT = "jaxtile-compiler-1"
_BACKENDS = {"cpu": ".cpu.lower", "cuda": ".cuda.compile", "hip": ".hip.lower"}
"""Target kind -> the module that lowers and compiles for it, imported on first use: it
provides ``source(kernel, target)`` and ``compile_to_library(kernel, target)``, returning
``(library bytes, symbol)`` or a GPU artifact with its launch configuration that stores
itself (``store(key) -> cache.Entry``: ``cuda.compile.CompiledCuda``, a cubin;
``hip.lower.CompiledHip``, a code object)."""
_EMULATOR = ".cuda.emulated"
"""The runner of CUDA code on JAX's CPU platform (the ``cuda-emulator`` backend): the same
source, compiled for the SIMT emulator."""


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
    """Convert a traced body and run the neutral pipeline; the result is what every target
    builds from."""
    kernel = from_jaxpr.convert(name, jaxpr, buffers, grid, threads, index_axes)
    return pipelines.run(kernel, pipelines.NEUTRAL_DYNAMIC if kernel.dynamic
                         else pipelines.NEUTRAL)


def ir_key(kernel: ir.Kernel) -> str:
    """A target-neutral identity of a kernel: its IR text and the compiler version."""
    return cache.content_key(printer.key_text(kernel), "", compiler_version())


def kernel_key(kernel: ir.Kernel, target: Target, *, emulated: bool = False) -> str:
    """The content key of a kernel on a target: IR text, target (and whether it runs in
    the emulator), compiler version."""
    where = target.describe() + ("|emulator" if emulated else "")
    return cache.content_key(printer.key_text(kernel), where, compiler_version())


def has_backend(target: Target) -> bool:
    """Whether some backend compiles for ``target``."""
    return target.kind in _BACKENDS


def check_backend(target: Target) -> None:
    """Raise a clear error if no backend compiles for ``target`` yet."""
    if not has_backend(target):
        raise KernelError(
            f"jaxtile cannot compile for {target.name} yet; lowerings: "
            f"{', '.join(sorted(_BACKENDS))}")


def backend(target: Target):
    """The module that compiles for ``target`` (imported now); see :func:`check_backend`."""
    check_backend(target)
    return importlib.import_module(_BACKENDS[target.kind], __package__)


def lowered_ir(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    """The IR after ``target``'s own passes, as its backend receives it."""
    return pipelines.run(kernel, pipelines.for_target(target))


def source(kernel: ir.Kernel, target: Target) -> str:
    """The source the backend generates for ``kernel`` on ``target``, for inspection."""
    be = backend(target)
    return be.source(lowered_ir(kernel, target), target)


def build(kernel: ir.Kernel, target: Target, *, emulated: bool = False) -> cache.Entry:
    """Compile ``kernel`` for ``target``, or fetch it from the cache. ``emulated``: a CUDA
    target's code compiled for the SIMT emulator, to run on the CPU."""
    key = kernel_key(kernel, target, emulated=emulated)
    if emulated:
        emu = importlib.import_module(_EMULATOR, __package__)
        emu.load_runtime()
    entry, where = cache.find(key)
    if entry is not None:
        compile_log.record(kernel.name, where)
        compile_log.logger.debug("cache hit (%s) for %s on %s", where, kernel.name, target.name)
        return entry
    on = target.name + (" (emulated)" if emulated else "")
    compile_log.logger.info("compiling %s for %s", kernel.name, on)
    start = time.perf_counter()
    with compile_log.progress(f"compiling {kernel.name} for {on}"):
        entry = _compile(kernel, target, key, emulated)
    seconds = time.perf_counter() - start
    compile_log.record(kernel.name, "compile", seconds)
    compile_log.logger.info("compiled %s for %s in %.2f s", kernel.name, on, seconds)
    return entry


def _compile(kernel: ir.Kernel, target: Target, key: str, emulated: bool) -> cache.Entry:
    """A cache miss of :func:`build`: run the target's passes, compile and store."""
    if emulated:
        emu = importlib.import_module(_EMULATOR, __package__)
        library, symbol = emu.compile_to_library(lowered_ir(kernel, target), target)
        blocks = kernel.num_blocks if sizes.is_static(kernel.grid) else 1
        return cache.store(key, library, symbol, blocks,
                           alignment=emu.ALIGNMENT, kind=cache.EMULATOR_LIBRARY)
    be = backend(target)
    compiled = be.compile_to_library(lowered_ir(kernel, target), target)
    if isinstance(compiled, CompiledCuda | CompiledHip):
        return compiled.store(key)
    library, symbol = compiled
    # A dynamic grid's size is set when the artifact is loaded (Entry.launched_with).
    blocks = kernel.num_blocks if sizes.is_static(kernel.grid) else 1
    return cache.store(key, library, symbol, blocks)
