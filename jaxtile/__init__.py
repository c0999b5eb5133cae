"""jaxtile: tile-level kernels for JAX, compiled for the CPU (CUDA and HIP to come).

A kernel is a Python body written with the tile language below and decorated with
:func:`kernel`; it is called like any JAX function, inside or outside ``jax.jit``.

Tile language (inside a kernel body): :func:`empty`, :func:`grid`, :func:`shared`,
:func:`fragment`, :func:`local`, :func:`copy`, :func:`gemm`, :func:`loop`,
:func:`pipelined`, :func:`when`, :func:`ds`, :func:`cdiv`.
"""

from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.jax_internals import exclude_from_source_lines as _exclude
from jaxtile.primitives.sharding import ShardRule

from .export import export_checks
from .kernel import Kernel, Lowered, interpret_by_default, kernel, set_interpret
from .language import (
    cdiv,
    copy,
    ds,
    empty,
    fragment,
    gemm,
    grid,
    local,
    loop,
    pipelined,
    shared,
    when,
)

__version__ = "0.1.0"

__all__ = [
    "Kernel", "KernelError", "Lowered", "ShardRule", "cdiv", "copy", "ds", "empty",
    "export_checks", "fragment", "gemm", "grid", "interpret_by_default", "kernel", "local",
    "loop", "ops", "pipelined", "set_interpret", "shared", "when",
]


def _exclude_own_frames() -> None:
    # JAX reports an eqn's source line as its innermost frame outside JAX; our frames must
    # be skipped too so that the line is the user's. jaxtile.ops is kernel-body code, so its
    # lines are the ones to report and it stays included.
    import os

    import jaxtile.compiler
    import jaxtile.primitives

    for mod in (jaxtile.compiler, jaxtile.primitives):
        _exclude(os.path.dirname(mod.__file__))
    here = os.path.dirname(__file__)
    for name in ("__init__.py", "_trace.py", "kernel.py", "language.py"):
        _exclude(os.path.join(here, name))


_exclude_own_frames()

from . import _config  # noqa: E402

_config.configure_runtime()

from . import ops  # noqa: E402  (the kernel library needs the names above)
