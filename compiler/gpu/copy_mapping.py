"""Copy thread mapping (GPU): how each copy between two memory buffers spreads its tile over
the block's threads, decided once and recorded on the op.

A copy whose destination is shared or global memory and whose source is not a fragment runs
with every thread of the block moving a few elements: coalesced, in runs of up to 16 bytes
of the wider of the two element types when the tile's last dimension is contiguous in both
buffers and a multiple of the run (:func:`vector_width`). The mapping is
``blocked(tile shape, threads, vec)``, so the run length ``vec`` is the whole decision; the
``copy_mapping`` pass (:func:`map_copies`) writes it as the op's note ``vec``, which prints
(``!{vec=8}``) and parses back. Barrier insertion (which threads touch which element) and
code generation (which thread moves which element, and whether as vectors) both read it
with :func:`copy_layout`, so they cannot disagree.

Copies to or from a fragment follow the fragment's layout, copies into a thread-local buffer
are made by every thread whole; neither gets a note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from .. import ir
from ..errors import KernelError
from .layout import Layout, blocked

NOTE = "vec"
"""The note holding a copy's run length, in elements."""


def is_mapped(op: ir.Op, bufs: Mapping[str, ir.Buffer]) -> bool:
    """Whether ``op`` is a copy the block's threads share by a coalesced mapping."""
    if op.kind != "copy":
        return False
    src, dst = bufs[op.attrs["src"].buffer], bufs[op.attrs["dst"].buffer]
    return src.scope != "fragment" and dst.scope not in ("fragment", "local")


def vector_width(op: ir.Op, bufs: Mapping[str, ir.Buffer]) -> int:
    """The run length of a mapped copy: 16 bytes of the wider element type, halved until it
    divides the tile's last dimension; 1 when either region picks a single element of its
    last dimension (that dimension is then not contiguous in the tile)."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    shape = src.shape
    if not shape or src.index[-1].size is None or dst.index[-1].size is None:
        return 1
    size = max(np.dtype(bufs[r.buffer].dtype).itemsize for r in (src, dst))
    vec = max(16 // size, 1)
    while vec > 1 and shape[-1] % vec:
        vec //= 2
    return vec


def map_copies(kernel: ir.Kernel) -> ir.Kernel:
    """The copy-mapping pass: every mapped copy (:func:`is_mapped`) gets the note ``vec``.

    Assumes: a verified kernel. Guarantees: :func:`copy_layout` answers for every mapped
    copy, and ``vec`` divides the tile's last dimension."""
    bufs = {b.name: b for b in kernel.buffers}

    def note(op: ir.Op) -> list[ir.Stmt]:
        if not is_mapped(op, bufs):
            return [op]
        return [op.with_notes(**{NOTE: vector_width(op, bufs)})]

    return dataclasses.replace(kernel, body=ir.map_ops(kernel.body, note))


def copy_layout(op: ir.Op, threads: int) -> Layout:
    """The thread mapping the ``copy_mapping`` pass recorded on a mapped copy; an internal
    KernelError when the op has none (the pass did not run, or the op was made after it)."""
    if NOTE not in op.notes:
        where = f" ({op.line})" if op.line else ""
        raise KernelError(f"internal error: the copy{where} has no recorded thread mapping "
                          "(note 'vec'): the copy_mapping pass did not run on it")
    return blocked(op.attrs["src"].shape, threads, op.notes[NOTE])
