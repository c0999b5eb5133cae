"""TMA copies: which staged copies of a pipelined loop the tensor memory accelerator makes,
the box each moves, and the tensor maps a kernel takes.

On a target with TMA (``GpuCaps.tma``: sm_90 on), the pipelining pass
(:func:`.copy_schedule.schedule_async_copies`) makes a loop's staged copies TMA loads when
every one of them can be (:func:`tma_box`); one that cannot keeps the whole loop on
``cp.async``. A copy can be a TMA load when

- its source is a 2-D to 5-D global buffer (TMA's ranks; attention's K and V are 4-D,
  ``(B, Hkv, S, D)``) of static shape whose rows are a multiple of 16 bytes (TMA takes
  16-byte-aligned strides; an f16 row of 999 elements is not), and the tile's last
  dimension is a contiguous run of it;
- it converts nothing, and pads with zeros (TMA reads elements past the tensor's edges as
  zeros, so a zero-padded edge needs no mask);
- its destination is plain row-major, or in wgmma's canonical layout (``wgmma_swizzle``:
  column blocks of ``span`` bytes, each ``rows x span`` swizzled, which is what a TMA box
  ``span`` bytes wide writes with the same swizzle), not mma.sync's XOR layout (``swizzle``);
- its box fits TMA: each extent at most 256, the innermost a multiple of 16 bytes;
- its tile is a multiple of 128 bytes, so that every stage of the buffer (placed at a
  multiple of 128 bytes, :data:`.smem_plan.ALIGN`) starts where TMA may write (128-byte
  aligned shared addresses).

The decision is two notes on the copy: ``tma_box``, the box, innermost dimension first (as
``cuTensorMapEncodeTiled`` takes it), and ``tma_swizzle`` (bytes, 0 for none). A copy whose
tile is wider than its box (a wgmma tile of several column blocks) is one load per block.
The kernel takes one tensor map per distinct (buffer, box, swizzle) (:func:`tensor_maps`;
TMA stores, :mod:`.tma_store`, take theirs from the same list),
built at launch from the buffer's address and shape: by the emulator's launch shim, or by
the CUDA handler with ``cuTensorMapEncodeTiled``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from .. import ir
from ..sizes import is_static

BOX = "tma_box"
SWIZZLE = "tma_swizzle"
MAX_BOX = 256
"""TMA moves boxes of at most 256 elements in each dimension."""
MIN_RANK, MAX_RANK = 2, 5
"""The source ranks a TMA load takes here: ``cp.async.bulk.tensor`` has 1-D to 5-D forms
(a 1-D tile is left to ``cp.async``); the device headers' ``tma_load_{2..5}d``."""
SMEM_ALIGN = 128
"""A TMA load's shared-memory destination is 128-byte aligned."""


def tma_box(op: ir.Op, bufs: Mapping[str, ir.Buffer]) -> tuple[tuple[int, ...], int] | None:
    """The box (innermost dimension first) and swizzle (bytes) of ``op`` as a TMA load, or
    None when it cannot be one (see the module docstring)."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = bufs[src.buffer], bufs[dst.buffer]
    size = np.dtype(sb.dtype).itemsize
    if (sb.dtype != db.dtype or op.attrs["pad"] not in (None, 0, 0.0, False)
            or size not in (1, 2, 4, 8) or not MIN_RANK <= len(sb.shape) <= MAX_RANK
            or not is_static(sb.shape) or src.index[-1].size is None
            or sb.shape[-1] * size % 16 or db.attrs.get("swizzle")
            or any(isinstance(i.start, ir.Value) and i.start.shape != () for i in src.index)):
        return None
    span = db.attrs.get("wgmma_swizzle", 0)
    inner = src.index[-1].size
    box0 = span // size if span else inner
    if span and (len(dst.shape) != 2 or inner % box0):
        return None
    box = (box0, *(i.size or 1 for i in reversed(src.index[:-1])))
    if any(b > MAX_BOX for b in box) or box0 * size % 16 or \
            math.prod(dst.shape) * size % SMEM_ALIGN:
        return None
    return box, span


def loads(op: ir.Op) -> int:
    """How many TMA loads a noted copy takes: its tile's column blocks."""
    return op.attrs["src"].shape[-1] // op.notes[BOX][0]


def tile_bytes(op: ir.Op, bufs: Mapping[str, ir.Buffer]) -> int:
    """The bytes a TMA copy's loads complete on its barrier: its whole tile (TMA counts the
    zeros it writes past the tensor's edges too)."""
    src = op.attrs["src"]
    return math.prod(src.shape) * np.dtype(bufs[src.buffer].dtype).itemsize


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """A tensor map the kernel takes: parameter ``name``, describing kernel parameter
    ``buffer`` (its index among the kernel's buffers) copied in boxes of ``box`` elements
    (innermost first) with ``swizzle`` bytes."""

    name: str
    buffer: int
    box: tuple[int, ...]
    swizzle: int


def global_side(op: ir.Op) -> ir.Region:
    """The global region of a TMA copy: a load's source, a store's (:mod:`.tma_store`)
    destination."""
    return op.attrs["dst" if op.kind == "tma_store" else "src"]


def tensor_maps(kernel: ir.Kernel) -> tuple[TensorMap, ...]:
    """The tensor maps the TMA copies of ``kernel`` need, in the order of first use."""
    params = [b.name for b in kernel.params]
    seen: dict[tuple[str, tuple[int, ...], int], TensorMap] = {}
    per_buffer: dict[str, int] = {}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Op) and s.kind in ("copy", "tma_store") and BOX in s.notes:
            buf = global_side(s).buffer
            key = (buf, tuple(s.notes[BOX]), s.notes[SWIZZLE])
            if key not in seen:
                n = per_buffer.get(buf, 0)
                per_buffer[buf] = n + 1
                name = f"tmap_{buf}" + (f"_{n}" if n else "")
                seen[key] = TensorMap(name, params.index(buf), key[1], key[2])
    return tuple(seen.values())


def map_of(kernel_maps: tuple[TensorMap, ...], op: ir.Op, params: list[str]) -> TensorMap:
    """The tensor map a noted copy loads or stores through."""
    index = params.index(global_side(op).buffer)
    return next(m for m in kernel_maps if m.buffer == index and m.box == tuple(op.notes[BOX])
                and m.swizzle == op.notes[SWIZZLE])
