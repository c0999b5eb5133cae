"""jaxtile: tile-level kernels for JAX, compiled for the CPU and NVIDIA GPUs (HIP to come).

A kernel is a Python body written with the tile language below and decorated with
:func:`kernel`; it is called like any JAX function, inside or outside ``jax.jit``.

Tile language (inside a kernel body): :func:`empty`, :func:`grid`, :func:`shared`,
:func:`fragment`, :func:`local`, :func:`copy`, :func:`gather`, :func:`scatter`,
:func:`gemm`, :func:`atomic_add` (``_max``, ``_min``), :func:`load_acquire`,
:func:`store_release`, :func:`fence`, :func:`print`, :func:`loop`, :func:`pipelined`,
:func:`when`, :func:`while_`, :func:`ds`, :func:`cdiv`. :class:`Ref` is the type of the
buffers a body works on (arguments, outputs, tiles and their views).

The public API is typed (``py.typed``); ``tests/jaxtile/test_typing.py`` checks it with mypy.
"""

from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.errors import own_code_paths as _own_code_paths
from jaxtile.compiler.jax_internals import exclude_from_source_lines as _exclude
from jaxtile.primitives.sharding import ShardRule

from ._stats import KernelStats, stats
from ._typing import Ref
from .autotune import autotune
from .export import export_checks
from .kernel import (
    Kernel,
    Lowered,
    backend,
    interpret_by_default,
    kernel,
    set_backend,
    set_interpret,
)
from .language import (
    annotate_layout,
    atomic_add,
    atomic_max,
    atomic_min,
    cdiv,
    copy,
    ds,
    empty,
    fence,
    fragment,
    gather,
    gemm,
    grid,
    load_acquire,
    local,
    loop,
    pipelined,
    print,
    scatter,
    shared,
    store_release,
    when,
    while_,
)

__version__ = "0.1.0"

__all__ = [
    "Kernel", "KernelError", "Lowered", "Ref", "ShardRule", "annotate_layout", "atomic_add",
    "atomic_max", "atomic_min", "backend", "cdiv", "copy", "ds", "empty", "export_checks",
    "fence", "fragment", "gather", "gemm", "grid", "interpret_by_default", "kernel",
    "load_acquire", "local", "loop", "ops", "pipelined", "print", "scatter", "set_backend",
    "set_interpret", "shared", "store_release", "when", "while_",
    "KernelStats", "stats",
    "autotune",
]


def _exclude_own_frames() -> None:
    # JAX reports an eqn's source line as its innermost frame outside JAX; our frames must
    # be skipped too so that the line is the user's: the same frames as jaxtile's errors skip.
    for path in _own_code_paths():
        _exclude(path)


_exclude_own_frames()

from . import _config  # noqa: E402

_config.configure_runtime()

from . import ops  # noqa: E402  (the kernel library needs the names above)
