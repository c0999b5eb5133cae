"""GPU lowering of ``copy`` (global <-> shared <-> fragment <-> local) and ``atomic``.

A copy with a fragment side visits the fragment's slots (each thread moves what it holds);
other copies spread the tile over the block by the thread mapping the ``copy_mapping`` pass
recorded on them (a coalesced blocked layout whose vectors are 16 bytes where the tile
allows, ``gpu/copy_mapping.py``). Reads past a global edge give ``pad`` and writes past it
are dropped, checked only in the dimensions the bounds pass could not prove. Where a
thread's ``vec`` contiguous elements are all in bounds or all out (the checked dimensions
exclude the last one, or the last dimension's extent is a multiple of the vector), and the
addresses are aligned, the elements move as one 8- or 16-byte access. A copy the
``buffer_loads`` pass noted ``buffer_load`` reads its vectors through its source's buffer
resource (made once at the kernel's top, :func:`buffer_resources`) without the mask: past
the buffer's end the load reads zero.
"""

from __future__ import annotations

import math

import numpy as np

from ... import ir
from ...errors import KernelError
from ..copy_mapping import BUFFER_LOAD, aligned, copy_layout, zero_pad
from ..layout import Layout, blocked
from . import scalar_math as M
from . import types as T
from .context import Context, source_line
from .scratch import copy_through_shared
from .values import stage_fragment, store_part, unflatten, write

_VECTOR = {(4, 4): "f32x4", (4, 2): "f32x2", (2, 8): "u32x4", (2, 4): "u32x2"}
"""(element bytes, elements) -> the device header's vector type moving them at once."""


def _pad(op: ir.Op, dtype: np.dtype) -> str:
    pad = op.attrs["pad"]
    return T.literal(0 if pad is None else pad, dtype)


def resource_name(buffer: str) -> str:
    """The C name of a global buffer's buffer resource."""
    return f"jt_rsrc_{buffer}"


def buffer_resources(kernel: ir.Kernel) -> list[str]:
    """The declarations, at the kernel's top, of the buffer resources the copies noted
    ``buffer_load`` read through: one per source buffer, its size the buffer's bytes."""
    bufs = {b.name: b for b in kernel.buffers}
    names = dict.fromkeys(s.attrs["src"].buffer for s in ir.walk(kernel.body)
                          if isinstance(s, ir.Op) and s.notes.get(BUFFER_LOAD))
    return [f"  const buffer_rsrc {resource_name(n)} = buffer_resource({n}, "
            f"{math.prod(bufs[n].shape) * np.dtype(bufs[n].dtype).itemsize});" for n in names]


def _source_checks(cx: Context, op: ir.Op) -> tuple[int, ...]:
    """The source's checked dimensions; none for a copy read by buffer loads, whose mask
    the resource replaces (so the kept-mask report leaves it out)."""
    return () if op.notes.get(BUFFER_LOAD) else cx.region_checks(op, "src")


def _buffer_load(cx: Context, op: ir.Op, coords: list[str], vtype: str) -> str:
    """The vector at ``coords`` of a copy noted ``buffer_load``, read through its source's
    resource. Only the first dimension may be out of range, so a vector is wholly inside the
    buffer or wholly past its end; the flat index is clamped to the element count, which
    puts every vector past the end (or before the start) at the resource's size: zeros."""
    region = op.attrs["src"]
    buf = cx.bufs[region.buffer]
    index, _ = cx.address(region, coords, clamp=False, checked=())
    count = math.prod(buf.shape)
    at = cx.tmp("at")
    cx.w(f"const unsigned {at} = unsigned({index});")
    return (f"buffer_load<{vtype}>({resource_name(buf.name)}, "
            f"int({at} < {count}u ? {at} : {count}u) * {np.dtype(buf.dtype).itemsize})")


def _read(cx: Context, op: ir.Op, coords: list[str], dtype: np.dtype,
          checked: tuple[int, ...]) -> str:
    """The source element at ``coords`` as a compute value of ``dtype`` (the destination's),
    ``pad`` where it lies past a checked edge."""
    region = op.attrs["src"]
    buf = cx.bufs[region.buffer]
    index, conds = cx.address(region, coords, clamp=False, checked=checked)
    raw = f"{buf.name}[{index}]" if buf.scope == "local" else \
        T.from_memory(f"{buf.name}[{index}]", buf.dtype)
    value = M.convert(raw, buf.dtype, dtype)
    if conds:
        # The address is only formed when in bounds: a masked element reads nothing.
        return f"({' && '.join(conds)} ? {value} : {_pad(op, dtype)})"
    return value


def _write(cx: Context, op: ir.Op, coords: list[str], value: str, dtype: np.dtype,
           checked: tuple[int, ...], guard: str | None = None) -> None:
    region = op.attrs["dst"]
    buf = cx.bufs[region.buffer]
    index, conds = cx.address(region, coords, clamp=False, checked=checked)
    conds = ([guard] if guard else []) + conds
    stmt = write(buf, index, value, dtype)
    cx.w(f"if ({' && '.join(conds)}) {stmt}" if conds else stmt)


def lower_copy(cx: Context, op: ir.Op) -> None:
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = cx.bufs[src.buffer], cx.bufs[dst.buffer]
    shape = src.shape
    if math.prod(shape) == 0:
        return
    if sb.scope == "fragment" and db.scope == "fragment" and sb.layout == db.layout and \
            src.is_whole(sb.shape) and dst.is_whole(db.shape):
        with cx.slots(db.layout, need_coords=False):
            cx.w(f"{db.name}[k] = {M.convert(f'{sb.name}[k]', sb.dtype, db.dtype)};")
        return
    if copy_through_shared(cx, op):
        _from_staged_fragment(cx, op)
        return
    lay = None
    if db.scope not in ("fragment", "local") and sb.scope != "fragment":
        lay = copy_layout(op, cx.threads)
        if _vector_copy(cx, op, lay):
            return
    s_checked, d_checked = _source_checks(cx, op), cx.region_checks(op, "dst")
    if _fragment_vectors(cx, op, s_checked, d_checked):
        return
    if op.notes.get(BUFFER_LOAD):
        raise KernelError(f"internal error: the copy at {source_line(op.line)} is noted "
                          f"'{BUFFER_LOAD}' but is not read as vectors")
    if db.scope == "fragment":
        # Each thread fills the slots it holds that the region covers.
        with cx.slots(db.layout, guard=True) as coords:
            conds, tile = cx.in_region(dst, coords)
            stmt = f"{db.name}[k] = {_read(cx, op, tile, db.dtype, s_checked)};"
            cx.w(f"if ({' && '.join(conds)}) {stmt}" if conds else stmt)
    elif sb.scope == "fragment":
        primary = cx.primary(sb.layout)
        with cx.slots(sb.layout, guard=True) as coords:
            conds, tile = cx.in_region(src, coords)
            guard = " && ".join(([primary] if primary else []) + conds)
            _write(cx, op, tile, f"{sb.name}[k]", sb.dtype, d_checked, guard or None)
    elif db.scope == "local":
        # Every thread reads the whole tile into its own copy.
        with cx.w.block(f"for (int i = 0; i < {math.prod(shape)}; ++i)"):
            coords = unflatten("i", shape)
            _write(cx, op, coords, _read(cx, op, coords, db.dtype, s_checked), db.dtype,
                   d_checked)
    else:
        primary = cx.primary(lay)
        with cx.slots(lay, guard=True) as coords:
            _write(cx, op, coords, _read(cx, op, coords, db.dtype, s_checked), db.dtype,
                   d_checked, primary)


_LANES = ("x", "y", "z", "w")


def _fragment_vectors(cx: Context, op: ir.Op, s_checked: tuple[int, ...],
                      d_checked: tuple[int, ...]) -> bool:
    """A float32 copy between a whole fragment and memory, moving each thread's contiguous
    slots as 8- or 16-byte vectors (the blocked layouts' ``vec``), where the memory side is
    aligned and each vector lies wholly inside or outside the edges; False otherwise."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = cx.bufs[src.buffer], cx.bufs[dst.buffer]
    into = db.scope == "fragment"
    if not into and sb.scope != "fragment":
        return False
    frag, fr, mem, mr = (db, dst, sb, src) if into else (sb, src, db, dst)
    width = frag.layout.vector_width()
    vec = 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1
    if (vec == 1 or sb.dtype != np.float32 or db.dtype != np.float32
            or not fr.is_whole(frag.shape) or mr.index[-1].size is None
            or not _aligned(cx, mr, vec)):
        return False
    vtype = _VECTOR[(4, vec)]
    lanes = _LANES[:vec]
    with cx.slots(frag.layout, guard=True) as coords:
        cx.w(f"if (k % {vec} != 0) continue;")
        checked = s_checked if into else d_checked
        index, conds = cx.address(mr, coords, clamp=False, checked=checked)
        if into:
            pad = _pad(op, np.dtype(np.float32))
            v = cx.tmp("vec")
            cx.w(f"{vtype} {v};")
            load = f"{v} = ptr_cast<{vtype}>({mem.name} + {index})[0];"
            if op.notes.get(BUFFER_LOAD):
                cx.w(f"{v} = {_buffer_load(cx, op, coords, vtype)};")
            elif conds:
                fill = " ".join(f"{v}.{ln} = {pad};" for ln in lanes)
                cx.w(f"if ({' && '.join(conds)}) {load} else {{ {fill} }}")
            else:
                cx.w(load)
            for i, ln in enumerate(lanes):
                cx.w(f"{frag.name}[k + {i}] = {v}.{ln};" if i else f"{frag.name}[k] = {v}.{ln};")
        else:
            primary = cx.primary(frag.layout)
            conds = ([primary] if primary else []) + conds
            parts = ", ".join(f"{frag.name}[k + {i}]" if i else f"{frag.name}[k]"
                              for i in range(vec))
            store = f"ptr_cast<{vtype}>({mem.name} + {index})[0] = {vtype}{{{parts}}};"
            cx.w(f"if ({' && '.join(conds)}) {store}" if conds else store)
    return True


def _from_staged_fragment(cx: Context, op: ir.Op) -> None:
    """A fragment into another fragment's layout or into every thread's local copy: through
    shared memory, since the elements a thread needs sit in other threads."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = cx.bufs[src.buffer], cx.bufs[dst.buffer]
    arr = stage_fragment(cx, op, sb)

    def value(tile: list[str]) -> str:
        index, _ = cx.address(src, tile, clamp=False, checked=())
        return M.convert(f"{arr}[{index}]", sb.dtype, db.dtype)

    if db.scope == "local":
        with cx.w.block(f"for (int i = 0; i < {math.prod(src.shape)}; ++i)"):
            tile = unflatten("i", src.shape)
            index, _ = cx.address(dst, tile, clamp=False, checked=())
            cx.w(f"{db.name}[{index}] = {value(tile)};")
        return
    with cx.slots(db.layout, guard=True) as coords:
        conds, tile = cx.in_region(dst, coords)
        stmt = f"{db.name}[k] = {value(tile)};"
        cx.w(f"if ({' && '.join(conds)}) {stmt}" if conds else stmt)


def _aligned(cx: Context, region: ir.Region, vec: int) -> bool:
    return aligned(region, cx.bufs[region.buffer], cx.factors, vec)


def _vector_copy(cx: Context, op: ir.Op, lay: Layout) -> bool:
    """Emit the copy as vector accesses when the dtypes match, alignment allows and each
    vector is in or out of bounds as a whole; False when that does not hold."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = cx.bufs[src.buffer], cx.bufs[dst.buffer]
    vec = lay.vector_width()
    vtype = _VECTOR.get((np.dtype(sb.dtype).itemsize, vec))
    if (vtype is None or sb.dtype != db.dtype or np.dtype(sb.dtype) == np.bool_
            or not (_aligned(cx, src, vec) and _aligned(cx, dst, vec))):
        return False
    s_checked, d_checked = _source_checks(cx, op), cx.region_checks(op, "dst")
    if s_checked and not zero_pad(op.attrs["pad"]):
        return False  # a masked vector reads zeros, not the pad value
    primary = cx.primary(lay)
    how = "cp.async" if cx.async_copies and sb.scope == "global" and db.scope == "shared" \
        else f"{vtype}, buffer loads" if op.notes.get(BUFFER_LOAD) else vtype
    cx.w(f"// {vec}-element vectors ({how}): each lies wholly inside or outside the edges")
    with cx.slots(lay, guard=True) as coords:
        cx.w(f"if (k % {vec} != 0) continue;")
        s_index, s_conds = cx.address(src, coords, clamp=False, checked=s_checked)
        d_index, d_conds = cx.address(dst, coords, clamp=False, checked=d_checked)
        d_conds = ([primary] if primary else []) + d_conds
        if cx.async_copies and sb.scope == "global" and db.scope == "shared":
            # Past an edge: zero bytes from a valid address (cp.async zero-fills the rest).
            size = vec * np.dtype(sb.dtype).itemsize
            src_at = f"{sb.name} + {s_index}"
            if s_conds:
                ok = " && ".join(s_conds)
                src_at, size = f"{ok} ? {src_at} : {sb.name}", f"{ok} ? {size} : 0"
            call = f"cp_async<{vec * np.dtype(sb.dtype).itemsize}>({db.name} + {d_index}, " \
                   f"{src_at}, {size});"
            cx.w(f"if ({' && '.join(d_conds)}) {call}" if d_conds else call)
        elif op.notes.get(BUFFER_LOAD):
            v = cx.tmp("vec")
            cx.w(f"const {vtype} {v} = {_buffer_load(cx, op, coords, vtype)};")
            store = f"ptr_cast<{vtype}>({db.name} + {d_index})[0] = {v};"
            cx.w(f"if ({' && '.join(d_conds)}) {store}" if d_conds else store)
        else:
            v = cx.tmp("vec")
            cx.w(f"{vtype} {v} = {{}};")
            read = f"{v} = ptr_cast<{vtype}>({sb.name} + {s_index})[0];"
            cx.w(f"if ({' && '.join(s_conds)}) {read}" if s_conds else read)
            store = f"ptr_cast<{vtype}>({db.name} + {d_index})[0] = {v};"
            cx.w(f"if ({' && '.join(d_conds)}) {store}" if d_conds else store)
    return True


_ATOMICS = frozenset((fn, t) for fn in ("add", "max", "min")
                     for t in ("float", "double", "int", "int64_t"))
"""(fn, C type) of the device header's atomic updates (``atomic_<fn>``; the float and 64-bit
ones are compare-and-swap loops in ``jaxtile/atomics.h``)."""


def lower_atomic(cx: Context, op: ir.Op) -> None:
    region, v = op.attrs["dst"], op.operands[0]
    buf = cx.bufs[region.buffer]
    fn = op.attrs["fn"]
    ctype = T.mem(buf.dtype)
    if buf.scope == "fragment":
        # A fragment is private to its threads: the update is a plain read-modify-write.
        store_part(cx, op, buf, combine=fn)
        return
    if buf.scope == "local":
        raise KernelError(f"an atomic update of local buffer '{buf.name}' is not lowered for "
                          f"{cx.dialect} yet (at {source_line(op.line)})")
    if (fn, ctype) not in _ATOMICS:
        raise KernelError(f"atomic {fn} on {np.dtype(buf.dtype)} is not lowered for "
                          f"{cx.dialect} yet (at {source_line(op.line)})")
    lay = cx.layout(v) if v.shape != () else None
    if v.shape == ():
        index, conds = cx.address(region, [], clamp=False, checked=cx.region_checks(op, "dst"))
        conds = ["tid == 0"] + conds
        cx.w(f"if ({' && '.join(conds)}) atomic_{fn}({buf.name} + {index}, "
             f"{M.convert(cx.name(v), v.dtype, buf.dtype)});")
        return
    lay = lay or blocked(v.shape, cx.threads)
    primary = cx.primary(lay)
    with cx.slots(lay, guard=True) as coords:
        index, conds = cx.address(region, coords, clamp=False,
                                  checked=cx.region_checks(op, "dst"))
        conds = ([primary] if primary else []) + conds
        call = (f"atomic_{fn}({buf.name} + {index}, "
                f"{M.convert(cx.elem(v, lay), v.dtype, buf.dtype)});")
        cx.w(f"if ({' && '.join(conds)}) {call}" if conds else call)
