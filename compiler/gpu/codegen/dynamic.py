"""Dynamic sizes in the GPU lowering (``@jt.kernel(dynamic=...)``).

Each size a kernel uses is an ``int sz_<name>`` parameter after the pointers, bound at
launch to a dimension of an input (:func:`size_bindings`); dimensions, strides and masks use
the size expressions as C (``context.size_c``). The grid is 1-D; its block count is a size
expression (``GpuKernel.grid_size``), which the launch text states over the buffers'
dimensions for the handler and the emulator's launch shim to evaluate with the shapes of
each call, and the block indices are decoded from it (:func:`dynamic_block_indices`).
"""

from __future__ import annotations

from ... import ir, sizes
from ...errors import KernelError
from .context import Context, size_c


def dynamic_block_indices(cx: Context) -> None:
    """Define the block indices of a grid with size expressions from ``block``: axis 0
    varies fastest, each axis divided by the extents below it, the outermost without a
    modulo."""
    k = cx.kernel
    below: list[str] = []
    for axis, (v, n) in enumerate(zip(k.block_indices, k.grid)):
        e = f"block / ({' * '.join(below)})" if below else "block"
        e = e if axis == len(k.grid) - 1 else f"({e}) % {size_c(n)}"
        cx.w(f"const int {cx.define(v)} = {e};")
        below.append(size_c(n))


def size_bindings(kernel: ir.Kernel) -> tuple[tuple[str, int, int], ...]:
    """Each dynamic size the kernel uses, with the (parameter index, dimension) of an input
    buffer whose dimension it is, in name order."""
    used: set[str] = set()
    for g in kernel.grid:
        used |= sizes.symbols(g)
    for b in kernel.buffers:
        for n in b.shape:
            used |= sizes.symbols(n)
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Op) and s.kind == "size":
            used |= sizes.symbols(s.attrs["expr"])
    where: dict[str, tuple[int, int]] = {}
    for i, b in enumerate(kernel.params):
        for d, n in enumerate(b.shape):
            if isinstance(n, str) and n in used and b.role == "input":
                where.setdefault(n, (i, d))
    missing = sorted(used - set(where))
    if missing:
        raise KernelError(f"kernel '{kernel.name}': the dynamic size {missing[0]} is no "
                          "dimension of an input, so a launch cannot know it")
    return tuple((name, *where[name]) for name in sorted(where))
