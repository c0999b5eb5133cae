"""Tile ``gemm`` ops in the CUDA lowering: plans, their layouts and swizzles, and the call.

Each gemm is planned once, by the ``gemm_plan`` pass (:func:`plan_gemms`, which asks
:func:`.gemm_plan.plan_gemm`): the instruction, warp partition and policy become the op's
notes, the shared tiles' swizzles buffer attributes; layout inference and the lowering
rebuild the plan from those (:func:`recorded`) and decide nothing. The plan fixes, strictly:
the accumulator fragment's layout and, for a register A operand (``gemm_rs``), A's; and the
physical order of its shared operand tiles, which every access to those buffers then
follows. The op itself becomes one call of
``jaxtile/tile_gemm.h``.

A gemm the planner cannot take (tiles that do not split into 16 x 8 atoms, operands in
fragments or local buffers other than gemm_rs's A) falls back to scalar multiply-adds: each
thread computes the accumulator elements its layout gives it, reading the operands from
shared memory (fragment operands staged there first), in the accumulator's dtype, rounded
once at the end for 16-bit floats.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from ... import ir, semantics
from ...errors import KernelError
from ...target import Target
from ..gemm_plan import GemmInstr, GemmPlan, SharedTile, assemble_plan, cpp_type, plan_gemm
from ..layout import Layout
from . import scalar_math as M
from . import types as T
from .context import Context, source_line
from .values import stage_fragment


def policy(kernel: ir.Kernel) -> str:
    """The warp partition of a kernel's gemms: whole rows per warp when one of them takes A
    from registers (attention's ``P @ V``), so that the accumulator of ``S = Q @ K^T``, the
    row softmax on it and ``P`` share one layout; the planner's default otherwise."""
    bufs = {b.name: b for b in kernel.buffers}
    regs = any(bufs[op.attrs["a"].buffer].scope == "fragment" for op in _gemms(kernel))
    return "rows" if regs else "auto"


def plan(op: ir.Op, bufs: Mapping[str, ir.Buffer], threads: int, target: Target,
         policy: str = "auto") -> GemmPlan:
    """The plan of one gemm op (regions must be whole 2-D buffers: an accumulator fragment,
    shared operands or a register A)."""
    a, b, c = (op.attrs[r] for r in ("a", "b", "c"))
    where = source_line(op.line)
    for role, r in (("a", a), ("b", b), ("c", c)):
        buf = bufs[r.buffer]
        if not r.is_whole(buf.shape) or len(buf.shape) != 2:
            raise KernelError(f"gemm operand {role} must be a whole 2-D on-chip buffer for "
                              f"CUDA (at {where})")
    if bufs[c.buffer].scope != "fragment":
        raise KernelError(f"gemm accumulator '{c.buffer}' must be a fragment for CUDA "
                          f"(at {where})")
    if bufs[b.buffer].scope != "shared":
        raise KernelError(f"gemm operand b '{b.buffer}' must be in shared memory for CUDA "
                          f"(at {where})")
    ta, tb = op.attrs["transpose_a"], op.attrs["transpose_b"]
    m, k = a.shape[::-1] if ta else a.shape
    n = b.shape[0] if tb else b.shape[1]
    regs = bufs[a.buffer].scope == "fragment"
    return plan_gemm(m, n, k, bufs[a.buffer].dtype, bufs[b.buffer].dtype, bufs[c.buffer].dtype,
                     threads, trans_a=ta, trans_b=tb, policy=policy, target=target,
                     a_in_registers=regs)


def _planned(op: ir.Op, kernel: ir.Kernel, target: Target, policy: str) -> GemmPlan | None:
    """The plan, or None where the gemm falls back to scalar multiply-adds."""
    bufs = {b.name: b for b in kernel.buffers}
    try:
        return plan(op, bufs, kernel.threads, target, policy)
    except KernelError:
        return None


def _gemms(kernel: ir.Kernel) -> list[ir.Op]:
    return [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.kind == "gemm"]


SCALAR = "scalar"
"""The ``instr`` note of a gemm that falls back to scalar multiply-adds."""


def plan_gemms(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    """The gemm planning pass: each gemm gets the notes ``instr`` (the instruction's label,
    or ``'scalar'`` for the fallback), ``warps`` (the warp grid) and ``policy``, and each
    shared operand the ``swizzle`` buffer attribute of its plan's tile (0 row-major, else
    the XOR step).

    Assumes: regions are whole buffers where a plan is possible. Guarantees: the plan is
    made once; layout inference and code generation rebuild it from the notes
    (:func:`recorded`). KernelError where two gemms need different swizzles of one buffer."""
    pol = policy(kernel)
    tiles: dict[str, tuple[SharedTile, ir.Op]] = {}

    def note(op: ir.Op) -> ir.Op:
        if op.kind != "gemm":
            return op
        p = _planned(op, kernel, target, pol)
        if p is None:
            return op.with_notes(instr=SCALAR)
        for attr, tile in (("a", p.a_tile), ("b", p.b_tile)):
            if tile is None:
                continue
            name = op.attrs[attr].buffer
            if tiles.setdefault(name, (tile, op))[0] != tile:
                raise KernelError(f"shared buffer '{name}' is read by gemms that need different "
                                  f"swizzles; not lowered for CUDA yet "
                                  f"(at {source_line(op.line)})")
        return op.with_notes(instr=p.instr.label, warps=p.warps, policy=p.policy)

    body = ir.map_ops(kernel.body, note)
    buffers = tuple(b.with_attrs(swizzle=tiles[b.name][0].step if tiles[b.name][0].swizzled
                                 else 0) if b.name in tiles else b for b in kernel.buffers)
    return dataclasses.replace(kernel, buffers=buffers, body=body)


_INSTRS = {i.label: i for i in GemmInstr}


def recorded(op: ir.Op, kernel: ir.Kernel) -> GemmPlan | None:
    """The plan :func:`plan_gemms` recorded in ``op``'s notes (None: scalar fallback); an
    internal KernelError if the pass did not run."""
    instr = op.notes.get("instr")
    if instr is None:
        raise KernelError(f"internal error: gemm at {source_line(op.line)} has no plan (the "
                          "gemm_plan pass did not run)")
    if instr == SCALAR:
        return None
    bufs = {b.name: b for b in kernel.buffers}
    a, b, c = (op.attrs[r] for r in ("a", "b", "c"))
    ta, tb = op.attrs["transpose_a"], op.attrs["transpose_b"]
    m, k = a.shape[::-1] if ta else a.shape
    n = b.shape[0] if tb else b.shape[1]
    return assemble_plan(m, n, k, bufs[a.buffer].dtype, bufs[b.buffer].dtype,
                         bufs[c.buffer].dtype, kernel.threads, trans_a=ta, trans_b=tb,
                         policy=op.notes["policy"], instr=_INSTRS[instr],
                         warps=op.notes["warps"], a_in_registers=bufs[a.buffer].scope == "fragment")


def anchors(kernel: ir.Kernel) -> dict[str, Layout]:
    """Layout inference's strict layouts: every planned gemm's accumulator (and register
    A), from the plans :func:`plan_gemms` recorded."""
    out: dict[str, Layout] = {}
    for op in _gemms(kernel):
        p = recorded(op, kernel)
        if p is None:
            continue
        wants = [(op.attrs["c"].buffer, p.acc_layout)]
        if p.a_layout is not None:
            wants.append((op.attrs["a"].buffer, p.a_layout))
        for name, lay in wants:
            if out.setdefault(name, lay) != lay:
                raise KernelError(f"fragment '{name}' is used by gemms that need different "
                                  f"layouts ({out[name].text()} and {lay.text()}); not "
                                  f"lowered for CUDA yet (at {source_line(op.line)})")
    return out


def swizzles(kernel: ir.Kernel) -> dict[str, SharedTile]:
    """The shared buffers gemms read, with the physical layout the IR records for them."""
    out: dict[str, SharedTile] = {}
    for b in kernel.buffers:
        if "swizzle" in b.attrs:
            step = b.attrs["swizzle"]
            out[b.name] = SharedTile(np.dtype(b.dtype), *b.shape, swizzled=step > 0,
                                     step=max(step, 1))
    return out


def lower_gemm(cx: Context, op: ir.Op) -> None:
    p = recorded(op, cx.kernel)
    if p is None:
        _fallback(cx, op)
        return
    a, b, c = (cx.bufs[op.attrs[r].buffer] for r in ("a", "b", "c"))
    cx.w(f"// {p.instr.label} over {p.warps[0]}x{p.warps[1]} warps ({p.policy})")
    if p.a_layout is None:
        cx.w(p.call(cx.base(a.name), cx.base(b.name), c.name))
        return
    # Register A: the fragment holds compute values (floats); the call takes the 16-bit type.
    regs = cx.tmp("a_regs")
    cx.w(f"{cpp_type(a.dtype)} {regs}[{a.layout.num_local}];")
    cx.w("#pragma unroll")
    cx.w(f"for (int k = 0; k < {a.layout.num_local}; ++k) "
         f"{regs}[k] = {T.to_memory(f'{a.name}[k]', a.dtype)};")
    cx.w(p.call(regs, cx.base(b.name), c.name))


def _operand(cx: Context, op: ir.Op, attr: str):
    """A function from (row, col) C text of the stored operand to its compute value."""
    region = op.attrs[attr]
    buf = cx.bufs[region.buffer]
    staged = stage_fragment(cx, buf) if buf.scope == "fragment" else None

    def read(row: str, col: str) -> str:
        index, _ = cx.address(region, [row, col], clamp=False, checked=())
        if staged is not None:
            return f"{staged}[{index}]"
        if buf.scope == "local":
            return f"{buf.name}[{index}]"
        return T.from_memory(f"{buf.name}[{index}]", buf.dtype)

    return read


def _fallback(cx: Context, op: ir.Op) -> None:
    c_region = op.attrs["c"]
    c = cx.bufs[c_region.buffer]
    if c.scope != "fragment" or not c_region.is_whole(c.shape):
        raise KernelError(f"gemm accumulator '{c.buffer}' must be a whole fragment for CUDA "
                          f"(at {source_line(op.line)})")
    ta, tb = op.attrs["transpose_a"], op.attrs["transpose_b"]
    k_dim = op.attrs["a"].shape[0 if ta else 1]
    a, b = _operand(cx, op, "a"), _operand(cx, op, "b")
    acc_t = T.reg(semantics.compute_dtype(c.dtype))
    a_t, b_t = (cx.bufs[op.attrs[r].buffer].dtype for r in ("a", "b"))
    cx.w("// scalar multiply-adds (no tensor-core plan for this gemm)")
    with cx.slots(c.layout, guard=True) as (i, j):
        acc = cx.tmp("acc")
        cx.w(f"{acc_t} {acc} = {c.name}[k];")
        with cx.w.block(f"for (int kk = 0; kk < {k_dim}; ++kk)"):
            x = M.convert(a("kk", i) if ta else a(i, "kk"), a_t, c.dtype)
            y = M.convert(b(j, "kk") if tb else b("kk", j), b_t, c.dtype)
            cx.w(f"{acc} += {x} * {y};")
        cx.w(f"{c.name}[k] = {T.rounded(acc, c.dtype)};")
