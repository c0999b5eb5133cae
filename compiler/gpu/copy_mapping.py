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

On a target whose buffer loads read zero past a resource's end (capability
``buffer_loads_zero_out_of_range``: AMD CDNA), the ``buffer_loads`` pass
(:func:`note_buffer_loads`, after the bounds and pipelining passes) marks the global reads
that need no mask there with the note ``buffer_load``: the copy's source is a whole global
buffer of static shape, its only kept mask is the first dimension's (so an element past an
edge is past the buffer's last byte: a row after the last one, or a 1-D tail), its pad is
+0, and code generation moves it as 8- or 16-byte vectors (:func:`read_vector`), each
wholly inside the buffer or wholly past its end. AMD's ISA guides range-check a multi-dword
buffer load per dword ("Buffer Instructions", range checking: loads of dword x2/x3/x4
range-check per component; LLVM's AMDGPUUsage "Relaxed Buffer OOB Mode": each 32-bit word
independently, the offset unsigned and saturating), so a vector straddling the end would
read a mix; code generation clamps each vector's flat index to the buffer's element count,
which puts every vector past the end exactly at the resource's size and keeps negative or
far positions from wrapping. A mask on any other dimension is an interior edge (the next
row's elements follow in memory) and stays.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from .. import ir
from ..analysis.divisibility import known_factors
from ..errors import KernelError
from .copy_schedule import ISSUED
from .layout import Layout, blocked

NOTE = "vec"
"""The note holding a copy's run length, in elements."""

BUFFER_LOAD = "buffer_load"
"""The note (True) on a copy whose global reads are buffer loads without a mask."""

_VECTOR_BYTES = ((4, 2), (4, 4), (2, 4), (2, 8))
"""(element bytes, elements) the code generator moves as one 8- or 16-byte vector."""

_MAX_RESOURCE_BYTES = 2**31 - 1
"""Byte offsets into a buffer resource are formed as int (the buffer-load offset operand)."""


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


def aligned(region: ir.Region, buf: ir.Buffer, factors: Mapping[int, int], vec: int) -> bool:
    """The region's rows start on a multiple of ``vec`` elements (static starts, rows whose
    length is a multiple of ``vec``, and a buffer the runtime aligns to 16 bytes);
    ``factors`` are :func:`..analysis.divisibility.known_factors`'s."""
    if buf.scope in ("local", "fragment") or not isinstance(buf.shape[-1], int) or \
            buf.shape[-1] % vec:
        return False
    last = region.index[-1].start
    # Starts of other dimensions move whole rows; the last one must be a known multiple.
    factor = last if isinstance(last, int) else factors.get(last.id, 1)
    return factor % vec == 0 and not any(
        isinstance(i.start, ir.Value) and i.start.shape != () for i in region.index)


def read_vector(op: ir.Op, bufs: Mapping[str, ir.Buffer], factors: Mapping[int, int]) -> int:
    """How many elements code generation reads at once from the source of the copy ``op``
    (8 or 16 bytes), or 1 when it reads them one by one: a mapped copy by its ``vec`` when
    the dtypes match and both sides are aligned; a copy into a whole float32 fragment by the
    fragment layout's contiguous slots (4 or 2) when the source is aligned."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = bufs[src.buffer], bufs[dst.buffer]
    size = np.dtype(sb.dtype).itemsize
    if NOTE in op.notes:
        vec = op.notes[NOTE]
        ok = ((size, vec) in _VECTOR_BYTES and sb.dtype == db.dtype
              and np.dtype(sb.dtype) != np.bool_
              and aligned(src, sb, factors, vec) and aligned(dst, db, factors, vec))
        return vec if ok else 1
    if db.scope != "fragment" or sb.scope == "fragment" or db.layout is None:
        return 1
    width = db.layout.vector_width()
    vec = 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1
    ok = (vec > 1 and sb.dtype == np.float32 and db.dtype == np.float32
          and dst.is_whole(db.shape) and src.index[-1].size is not None
          and aligned(src, sb, factors, vec))
    return vec if ok else 1


def zero_pad(pad: object) -> bool:
    """Whether a copy's pad reads as the zero bits a masked vector or a buffer load gives
    (None, or a zero that is not -0.0)."""
    return pad is None or (pad == 0 and not (isinstance(pad, float) and math.copysign(1, pad) < 0))


def _end_of_buffer_only(op: ir.Op, buf: ir.Buffer) -> bool:
    """The read's only kept mask is the first dimension's, so every masked element lies
    past the buffer's last element (the other dimensions are proved in bounds). Not when
    that dimension has extent 1: the flat index leaves such a dimension out, so a position
    past it would read the first row again."""
    return tuple(dict(op.notes.get("masks", ())).get("src", ())) == (0,) and buf.shape[0] != 1


def note_buffer_loads(kernel: ir.Kernel, caps: object) -> ir.Kernel:
    """The buffer-loads pass: on a target with ``buffer_loads_zero_out_of_range``, each copy
    whose global reads need a mask only at the buffer's end gets the note ``buffer_load``
    (see the module's docstring); elsewhere the kernel is returned unchanged.

    Assumes: the bounds pass's ``masks`` and the pipelining pass's ``issued`` notes (a staged
    copy is left to the pipeline's copies). Guarantees: a noted copy's source is a global
    buffer of static shape under 2^31 bytes, read as :func:`read_vector`'s vectors, with
    pad +0 and only its first dimension masked."""
    if not getattr(caps, "buffer_loads_zero_out_of_range", False):
        return kernel
    bufs = {b.name: b for b in kernel.buffers}
    factors = known_factors(kernel)

    def note(op: ir.Op) -> list[ir.Stmt]:
        if op.kind != "copy" or op.notes.get(ISSUED):
            return [op]
        sb = bufs[op.attrs["src"].buffer]
        if (sb.scope != "global" or not all(isinstance(n, int) for n in sb.shape)
                or math.prod(sb.shape) * np.dtype(sb.dtype).itemsize > _MAX_RESOURCE_BYTES
                or not zero_pad(op.attrs["pad"]) or not _end_of_buffer_only(op, sb)
                or read_vector(op, bufs, factors) == 1):
            return [op]
        return [op.with_notes(**{BUFFER_LOAD: True})]

    return dataclasses.replace(kernel, body=ir.map_ops(kernel.body, note))


def copy_layout(op: ir.Op, threads: int) -> Layout:
    """The thread mapping the ``copy_mapping`` pass recorded on a mapped copy; an internal
    KernelError when the op has none (the pass did not run, or the op was made after it)."""
    if NOTE not in op.notes:
        where = f" ({op.line})" if op.line else ""
        raise KernelError(f"internal error: the copy{where} has no recorded thread mapping "
                          "(note 'vec'): the copy_mapping pass did not run on it")
    return blocked(op.attrs["src"].shape, threads, op.notes[NOTE])
