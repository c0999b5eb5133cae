"""What the per-op GPU lowerings share: the text being written, names, layouts, addresses.

Device code is one function per kernel. Every thread runs the whole body; a tile value
with a layout is a per-thread array of its slots (``float v7[12]``), a uniform value one
scalar, a fragment buffer an array of its layout's slots, a ``local`` buffer a per-thread
array of the whole tile, a ``shared`` buffer a ``JT_SHARED_AT`` view of the dynamic shared
memory at the offset the shared-memory plan gives it. Slots are visited by
``#pragma unroll`` loops over ``k``, so after unrolling every index is a constant and the
arrays live in registers.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ... import ir, sizes
from ...analysis.divisibility import known_factors
from ...errors import KernelError, kernel_error
from ..layout import Layout, replicated
from ..layout_inference import uniform_values
from . import types as T

MAX_THREAD_BYTES = 64 * 1024
"""Per-thread arrays (tile values, fragments, local buffers) a kernel may declare in all: a
GPU thread has 255 registers and spills the rest to slow local memory (and the emulator
gives each thread a 256 KiB stack)."""
_NUMPY = {"float": "float32", "double": "float64", "bool": "bool", "int8_t": "int8",
          "uint8_t": "uint8", "int16_t": "int16", "uint16_t": "uint16", "int": "int32",
          "unsigned": "uint32", "int64_t": "int64", "uint64_t": "uint64",
          "half": "float16", "bf16": "uint16"}


class Writer:
    """Indented lines of C."""

    def __init__(self, depth: int = 1):
        self.lines: list[str] = []
        self.depth = depth

    def __call__(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    @contextlib.contextmanager
    def block(self, head: str = "") -> Iterator[None]:
        self(f"{head} {{" if head else "{")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            self("}")


def source_line(line: str | None) -> str:
    """``file.py:12`` of the user's source line (without the directory)."""
    return os.path.basename(line) if line else "?"


class Context:
    """State of one kernel's lowering; see the module docstring."""

    def __init__(self, kernel: ir.Kernel, warp_size: int, dialect: str,
                 swizzles: Mapping[str, Any] | None = None):
        self.kernel = kernel
        self.dialect = dialect
        """The target's ``caps.dialect`` (``CUDA``, ``HIP``), for messages."""
        self.swizzles = dict(swizzles or {})
        """Shared buffers stored in a swizzled order (a gemm plan's ``SharedTile``)."""
        self.threads = kernel.threads
        self.warp_size = warp_size
        self.w = Writer()
        self.bufs = {b.name: b for b in kernel.buffers}
        self.uniform = uniform_values(kernel)
        self.layouts: dict[int, Layout] = {}
        for stmt in ir.walk(kernel.body):
            if isinstance(stmt, ir.Op) and stmt.result is not None and "layout" in stmt.notes:
                self.layouts[stmt.result.id] = stmt.notes["layout"]
        self.factors = known_factors(kernel)
        """Scalar values known to be multiples of a number (for aligned vector accesses)."""
        self.names: dict[int, str] = {}
        self.shared: list[tuple[str, str, int, ir.Op | None, int]] = []
        """(C type, name, count, op, byte offset) of every shared scratch array, declared at
        kernel scope."""
        self.current_op: ir.Op | None = None
        """The op being lowered (the owner of the scratch it asks for)."""
        self._tmp = 0
        self._scratch_taken: dict[tuple[int, str], int] = {}
        """(op, role) -> how many of the op's recorded arrays of that role are declared."""
        self.stages: dict[str, tuple[int, int]] = {
            b.name: (b.attrs["stages"], math.prod(b.shape)) for b in kernel.buffers
            if "stages" in b.attrs}
        """Multi-buffered shared buffers of a pipelined loop (the shared-memory plan's
        ``stages`` attribute): (stages, elements per stage)."""
        self.stage_index = "0"
        """C text of the stage the code being written accesses."""
        self.async_copies = False
        """Whether global -> shared vector copies are issued as cp.async."""
        self.thread_bytes = 0
        self.loop_depth = 0
        self.masks: list[str] = []
        """Descriptions of the accesses that kept a bounds check."""

    # -- names ------------------------------------------------------------------------------

    def define(self, v: ir.Value) -> str:
        name = f"v{len(self.names)}"
        self.names[v.id] = name
        return name

    def name(self, v: ir.Value) -> str:
        return self.names[v.id]

    def tmp(self, hint: str = "t") -> str:
        self._tmp += 1
        return f"{hint}{self._tmp}"

    def operand(self, x: int | ir.Value) -> str:
        return str(x) if isinstance(x, int) else self.name(x)

    def _shared_array(self, ctype: str, count: int, hint: str, offset: int) -> str:
        """A shared scratch array for the op being lowered, at byte ``offset`` (the
        smem_plan pass's; the barriers its reuse of bytes needs are the barrier pass's)."""
        name = self.tmp(hint)
        self.shared.append((ctype, name, max(count, 1), self.current_op, offset))
        return name

    def scratch(self, op: ir.Op, role: str) -> str:
        """The name of the next shared scratch array (in the note's order) that ``op``'s
        ``scratch`` note (the ``scratch`` pass) records for ``role``, declared; an internal
        KernelError when the note does not record it (code generation does not decide
        scratch)."""
        found = [entry[1:] for entry in op.notes.get("scratch", ()) if entry[0] == role]
        nth = self._scratch_taken.get((id(op), role), 0)
        if nth >= len(found):
            raise KernelError(f"internal error: the {op.kind} at {source_line(op.line)} has "
                              f"no recorded {role!r} scratch (the scratch pass did not run)")
        if len(found[nth]) < 3:
            raise KernelError(f"internal error: the {role!r} scratch of the {op.kind} at "
                              f"{source_line(op.line)} has no planned offset (the smem_plan "
                              "pass did not run)")
        self._scratch_taken[(id(op), role)] = nth + 1
        ctype, count, offset = found[nth]
        return self._shared_array(ctype, count, role, offset)

    # -- layouts and slots ----------------------------------------------------------------------

    def layout(self, v: ir.Value) -> Layout | None:
        """The value's layout; None for a uniform value."""
        if v.id in self.uniform:
            return None
        try:
            return self.layouts[v.id]
        except KeyError:
            raise KernelError(f"value {v} has no layout (layout inference did not run)") \
                from None

    def declare(self, v: ir.Value) -> str:
        """Define ``v``'s per-thread slot array."""
        name = self.define(v)
        self.array(T.reg(v.dtype), name, self.layout(v).num_local)
        return name

    def array(self, ctype: str, name: str, count: int, comment: str = "",
              line: str | None = None) -> None:
        """Declare a per-thread array, counting it against :data:`MAX_THREAD_BYTES`;
        ``line``: the user's line that declared it (default: that of the op being lowered),
        which the error names as where the kernel went over."""
        nbytes = count * np.dtype(_NUMPY[ctype]).itemsize
        self.thread_bytes += nbytes
        if self.thread_bytes > MAX_THREAD_BYTES:
            if line is None and self.current_op is not None:
                line = self.current_op.line
            what = comment or f"{count} {ctype} elements"
            raise kernel_error(self.kernel.name, f"needs more than {MAX_THREAD_BYTES // 1024} "
                               f"KiB of registers and local memory per thread ({what}: "
                               f"{nbytes} bytes per thread, {self.thread_bytes} in all, with "
                               f"{self.threads} threads); use smaller tiles or more threads",
                               line)
        self.w(f"{ctype} {name}[{count}];{'  // ' + comment if comment else ''}")

    def result(self, v: ir.Value, lay: Layout | None = None) -> tuple[str, Layout]:
        """Declare the slot array an op computes ``v`` into, and its layout. A uniform
        result (a full reduction's scalar) is computed by every thread into one slot of
        ``lay`` (default: replicated) and then named by :meth:`finish`."""
        if v.id not in self.uniform:
            return self.declare(v), self.layout(v)
        lay = self.result_layout(v, lay)
        name = self.tmp("r")
        self.w(f"{T.reg(v.dtype)} {name}[1];")
        return name, lay

    def result_layout(self, v: ir.Value, lay: Layout | None = None) -> Layout:
        """The layout :meth:`result` computes ``v`` in."""
        if v.id not in self.uniform:
            return self.layout(v)
        return lay if lay is not None and lay.num_local == 1 else replicated(v.shape,
                                                                              self.threads)

    def finish(self, v: ir.Value, name: str) -> None:
        """After :meth:`result`: a uniform result becomes its scalar."""
        if v.id in self.uniform:
            self.w(f"const {T.reg(v.dtype)} {self.define(v)} = {name}[0];")

    def elem(self, v: ir.Value, lay: Layout, slot: str = "k") -> str:
        """``v``'s element in slot ``slot`` of a tile of layout ``lay`` (``v`` is uniform,
        has ``lay``, or has ``lay`` with size-1 dimensions: an implicit broadcast)."""
        if v.id in self.uniform:
            return self.name(v)
        if v.shape == lay.shape:
            return f"{self.name(v)}[{slot}]"
        axes = [d for d, (n, m) in enumerate(zip(v.shape, lay.shape)) if n == 1 and m != 1]
        return f"{self.name(v)}[{lay.drop_slot_expr(slot, axes)}]"

    @contextlib.contextmanager
    def slots(self, lay: Layout, *, need_coords: bool = True,
              guard: bool = False) -> Iterator[list[str]]:
        """Emit ``for k`` over ``lay``'s slots; yields the element's coordinates as C
        expressions. ``guard``: skip padding slots (positions past the tile's edge)."""
        coords = []
        if need_coords:
            for e in lay.thread_coord_exprs("tid"):
                if e == "0":
                    coords.append(None)
                    continue
                c = self.tmp("c")
                self.w(f"const int {c} = {e};")
                coords.append(c)
        self.w("#pragma unroll")
        with self.w.block(f"for (int k = 0; k < {lay.num_local}; ++k)"):
            out = []
            for c, local in zip(coords, lay.local_coord_exprs("k")):
                parts = [p for p in (c, None if local == "0" else f"({local})") if p]
                out.append(" + ".join(parts) if parts else "0")
            if guard and lay.padded_dims():
                conds = " || ".join(f"{out[d]} >= {lay.shape[d]}" for d in lay.padded_dims())
                self.w(f"if ({conds}) continue;")
            yield out

    def primary(self, lay: Layout) -> str | None:
        """A C condition true in one replica of each element (None: no replicas)."""
        rep = lay.replica_expr("tid")
        return None if rep is None else f"({rep}) == 0"

    # -- memory addresses -------------------------------------------------------------------------

    def address(self, region: ir.Region, coords: Sequence[str], *, clamp: bool,
                checked: Sequence[int] | None = None) -> tuple[str, list[str]]:
        """The flat element index of a region element at tile ``coords``, and the bounds
        conditions of the dimensions in ``checked`` (all when None). ``clamp``: dynamic
        starts are clamped into range first (JAX's get/swap semantics)."""
        buf = self.bufs[region.buffer]
        strides = row_strides(buf.shape)
        coords = iter(coords)
        terms, conds, positions = [], [], []
        for d, (idx, n) in enumerate(zip(region.index, buf.shape)):
            c = next(coords) if idx.size is not None else None
            if isinstance(idx.start, ir.Value) and idx.start.shape != ():
                pos = f"{self.name(idx.start)}[{c}]"
            else:
                start = self.operand(idx.start)
                if clamp and isinstance(idx.start, ir.Value):
                    # JAX's get/swap: a negative start counts from the end, then the slice
                    # is clamped into range.
                    hi = size_minus(n, idx.size or 1)
                    s = self.tmp("s")
                    self.w(f"const int {s} = {start} < 0 ? {start} + {size_c(n)} : {start};")
                    start = f"({s} < 0 ? 0 : ({s} > {hi} ? {hi} : {s}))"
                pos = start if c is None else (c if start == "0" else f"{start} + {c}")
            if checked is None or d in checked:
                conds.append(below(pos, n))
            if n != 1:
                terms.append(f"({pos})" if strides[d] == 1 else f"({pos}) * {strides[d]}")
            positions.append(pos)
        if region.buffer in self.swizzles:
            index = self.swizzles[region.buffer].cpp_offset(*positions)
        else:
            index = " + ".join(terms) if terms else "0"
        if region.buffer in self.stages:
            index = f"({self.stage_index}) * {self.stages[region.buffer][1]} + {index}"
        return index, conds

    def base(self, buffer: str) -> str:
        """C text of a shared buffer's start, in the stage being accessed when it is
        multi-buffered."""
        if buffer in self.stages:
            return f"{buffer} + ({self.stage_index}) * {self.stages[buffer][1]}"
        return buffer

    def in_region(self, region: ir.Region, coords: Sequence[str],
                  starts: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
        """For buffer ``coords`` (one per buffer dimension): the C conditions that the element
        lies in ``region`` (whose starts are ``starts`` if given), and its coordinates in
        the region's tile."""
        conds, tile = [], []
        shape = self.bufs[region.buffer].shape
        starts = starts or [self.operand(i.start) for i in region.index]
        for idx, c, n, start in zip(region.index, coords, shape, starts):
            if idx.size is None:
                conds.append(f"{c} == {start}")
            elif start == "0":
                if not isinstance(n, int) or idx.size < n:
                    conds.append(f"{c} < {idx.size}")
                tile.append(c)
            else:
                conds += [f"{c} >= {start}", f"{c} < {start} + {idx.size}"]
                tile.append(f"({c} - {start})")
        return conds, tile

    def region_checks(self, op: ir.Op, attr: str) -> tuple[int, ...] | None:
        """Dimensions of a global region whose bounds must be checked (the bounds pass's
        notes; every dimension when it did not run); () for on-chip buffers."""
        region = op.attrs[attr]
        if self.bufs[region.buffer].scope != "global":
            return ()
        masks = op.notes.get("masks")
        checked = tuple(range(len(region.index))) if masks is None else dict(masks).get(attr, ())
        entry = f"{source_line(op.line)}: {op.kind} {attr}={region.buffer} dims {list(checked)}"
        if checked and entry not in self.masks:
            self.masks.append(entry)
        return checked


SIZE_PREFIX = "sz_"
"""Kernel parameters holding dynamic sizes are named ``sz_<size>`` (``sz_x_0``)."""
_C_SIZE_OPS = {
    "+": lambda a, b: f"({a} + {b})", "-": lambda a, b: f"({a} - {b})",
    "*": lambda a, b: f"({a} * {b})", "neg": lambda a: f"(-{a})",
    "floordiv": lambda a, b: f"size_floordiv({a}, {b})", "mod": lambda a, b: f"size_mod({a}, {b})",
    "max": lambda a, b: f"size_max({a}, {b})", "min": lambda a, b: f"size_min({a}, {b})",
}


def size_c(size: sizes.Size, leaf: Callable[[str], str] | None = None) -> str:
    """C text (int) of a buffer dimension or grid extent: the number, or the size
    expression over the kernel's size parameters (or what ``leaf`` names each size)."""
    return str(sizes.fold(size, leaf or (lambda name: SIZE_PREFIX + name), _C_SIZE_OPS))


def size_minus(size: sizes.Size, k: int) -> str:
    """C text of ``size - k``."""
    return str(size - k) if isinstance(size, int) else f"({size_c(size)} - {k})"


def below(pos: str, size: sizes.Size) -> str:
    """C condition ``0 <= pos < size``."""
    if isinstance(size, int):
        return f"unsigned({pos}) < {size}u"
    return f"unsigned({pos}) < unsigned({size_c(size)})"


def row_strides(shape: Sequence[sizes.Size]) -> list[int | str]:
    """Row-major element strides of ``shape``: ints, or C text where a later dimension is a
    size expression."""
    out: list[int | str] = []
    for d in range(len(shape)):
        rest = shape[d + 1:]
        if sizes.is_static(rest):
            out.append(math.prod(rest))
        else:
            out.append(" * ".join(size_c(n) for n in rest if n != 1))
    return out


def row_major(coords: Sequence[str], shape: Sequence[int]) -> str:
    """C text of the row-major flat index of ``coords`` in ``shape``."""
    terms = []
    for d, c in enumerate(coords):
        stride = math.prod(shape[d + 1:])
        if shape[d] > 1:
            terms.append(f"({c})" if stride == 1 else f"({c}) * {stride}")
    return " + ".join(terms) if terms else "0"


def np_dtype(x: ir.Value | ir.Buffer) -> np.dtype:
    return np.dtype(x.dtype)
