"""From a traced kernel body to a compiled, cached artifact: the compiler's entry points.

``to_tile_ir`` converts a traced body and runs the target-neutral pipeline once per
specialisation. ``build`` compiles that IR for one target: its content key (the neutral IR's
text, the target's description and the compiler's version) is looked up in the cache; on a
miss the target's own passes run and its backend (imported only then) compiles.

``submit`` starts the same build on a pool of compile threads, one per CPU: kernels needed
at once (the kernels of a traced program, a gradient's backward kernels, autotuning
candidates) compile side by side, since LLVM, which takes most of a compile, runs without
the GIL. A key is built once however many callers ask for it at the same time: a build of
a key already in flight waits for that one.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from . import cache, compile_log, from_jaxpr, ir, pipelines, printer, sizes
from . import jax_internals as ji
from .errors import KernelError
from .target import Target

_FORMAT = "jaxtile-compiler-1"
_BACKENDS = {"cpu": ".cpu.lower", "cuda": ".cuda.compile", "hip": ".hip.lower"}
"""Target kind -> the module that lowers and compiles for it, imported on first use: it
provides ``source(kernel, target)`` and ``compile_to_library(kernel, target)``, returning
an artifact that stores itself (``store(key) -> cache.Entry``: ``cpu.lower.CompiledCpu``, a
shared library and the signature its calls are checked against;
``cuda.compile.CompiledCuda``, a cubin; ``hip.lower.CompiledHip``, a code object)."""
_EMULATORS = {"cuda": ".cuda.emulated", "hip": ".hip.emulated"}
"""Target kind -> the runner of its GPU code on JAX's CPU platform (the ``cuda-emulator`` and
``hip-emulator`` backends): the same source, compiled for the SIMT emulator (wave64 for
HIP)."""


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
    or HIP target's code compiled for the SIMT emulator, to run on the CPU. If the same key
    is being built (:func:`submit`, another thread), this waits for that build."""
    key = kernel_key(kernel, target, emulated=emulated)
    future, mine = _claim(key)
    if mine:
        _run(future, key, kernel, target, emulated)
    return future.result()


def submit(kernel: ir.Kernel, target: Target, *,
           emulated: bool = False) -> concurrent.futures.Future[cache.Entry]:
    """Start :func:`build` on the compile threads and return its future (that of the build
    in flight if the key is already being built). The build's errors are the future's."""
    key = kernel_key(kernel, target, emulated=emulated)
    future, mine = _claim(key)
    if mine:
        _pool().submit(_run, future, key, kernel, target, emulated)
    return future


def wait_idle() -> None:
    """Wait until no build is in flight (their outcomes stay with their futures): e.g.
    between tests, since a kernel traced but never run (``jax.make_jaxpr``) still builds."""
    while True:
        with _inflight_lock:
            pending = list(_inflight.values())
        if not pending:
            return
        concurrent.futures.wait(pending)


_inflight: dict[str, concurrent.futures.Future[cache.Entry]] = {}
_inflight_lock = threading.Lock()


def _claim(key: str) -> tuple[concurrent.futures.Future[cache.Entry], bool]:
    """The future of ``key``'s build, and whether the caller must run it (no build of
    ``key`` was in flight)."""
    with _inflight_lock:
        future = _inflight.get(key)
        if future is not None:
            return future, False
        future = _inflight[key] = concurrent.futures.Future()
        return future, True


def _run(future: concurrent.futures.Future[cache.Entry], key: str, kernel: ir.Kernel,
         target: Target, emulated: bool) -> None:
    """Build a claimed key into its future; the key is then free again (a later build
    finds the cache, or after a failure tries again)."""
    try:
        entry = _find_or_compile(kernel, target, key, emulated)
    except BaseException as e:  # noqa: BLE001 - every outcome goes to the waiters
        future.set_exception(e)
    else:
        future.set_result(entry)
    finally:
        with _inflight_lock:
            _inflight.pop(key, None)


def _forget_threads() -> None:
    """In a child made by ``fork`` the compile threads, their builds in flight and
    whoever held the lock do not exist: start afresh, or the child's builds would wait
    forever."""
    global _inflight_lock
    _inflight_lock = threading.Lock()
    _inflight.clear()
    _pool.cache_clear()


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """The compile threads: one per CPU this process may use (a compile keeps a core
    busy, so more would only interleave them)."""
    try:
        cpus = len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return concurrent.futures.ThreadPoolExecutor(cpus, thread_name_prefix="jaxtile-compile")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_threads)


def _find_or_compile(kernel: ir.Kernel, target: Target, key: str,
                     emulated: bool) -> cache.Entry:
    if emulated:
        emu = importlib.import_module(_EMULATORS[target.kind], __package__)
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
        emu = importlib.import_module(_EMULATORS[target.kind], __package__)
        library, symbol = emu.compile_to_library(lowered_ir(kernel, target), target)
        blocks = kernel.num_blocks if sizes.is_static(kernel.grid) else 1
        return cache.store(key, library, symbol, blocks,
                           alignment=emu.ALIGNMENT, kind=cache.EMULATOR_LIBRARY)
    return backend(target).compile_to_library(lowered_ir(kernel, target), target).store(key)
