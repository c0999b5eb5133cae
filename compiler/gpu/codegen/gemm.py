"""Tile ``gemm`` ops in the GPU lowering: the call of the recorded plan, or the fallback.

Each gemm is planned once, by the ``gemm_plan`` pass (:func:`..gemm_plan.plan_gemms`): the
instruction, warp partition and policy become the op's notes, the shared tiles' swizzles
buffer attributes; layout inference and this lowering rebuild the plan from those
(:func:`..gemm_plan.recorded`) and decide nothing. The plan fixes, strictly:
the accumulator fragment's layout and, for a register A operand (``gemm_rs``), A's; and the
physical order of its shared operand tiles, which every access to those buffers then
follows. The op itself becomes one call of
``jaxtile/tile_gemm.h``.

A wgmma plan (sm_90a) prints its statements (:meth:`..gemm_plan.GemmPlan.wgmma_calls`): the
accumulator into ``wgmma_acc`` registers (a register A into its 16-bit array),
``wgmma.fence``, the asynchronous wgmmas over K (``gemm_wgmma``, or ``gemm_wgmma_rs`` with A
in registers), ``commit_group`` and ``wait_group`` before the accumulator is read back. The
proxy fence and barrier that make the copies' generic writes visible to wgmma are a
``barrier`` op the barrier pass placed (``proxy_fence``), not part of the gemm.

A gemm the planner cannot take (tiles that do not split into the instruction's atoms, 16 x 8
for mma.sync and S x S for AMD's MFMA; types no instruction of a 64-lane target takes;
operands in fragments or local buffers other than gemm_rs's A) falls back to scalar
multiply-adds: each
thread computes the accumulator elements its layout gives it, reading the operands from
shared memory (fragment operands staged there first), in the accumulator's dtype, rounded
once at the end for 16-bit floats.
"""

from __future__ import annotations

from ... import ir, semantics
from ...errors import KernelError
from ..gemm_plan import GemmInstr, cpp_type, recorded
from . import scalar_math as M
from . import types as T
from .context import Context, source_line
from .values import stage_fragment


def lower_gemm(cx: Context, op: ir.Op) -> None:
    p = recorded(op, cx.kernel)
    if p is None:
        _fallback(cx, op)
        return
    a, b, c = (cx.bufs[op.attrs[r].buffer] for r in ("a", "b", "c"))
    if p.instr == GemmInstr.WGMMA:
        if p.a_tile is None:
            a_text = "registers"
        else:
            a_text = f"{_major(p.trans_a)} ({p.a_tile.span}-byte swizzle)"
        cx.w(f"// {p.note} over {p.warps[0]}x{p.warps[1]} warpgroups: A {a_text}, "
             f"B {_major(not p.trans_b)} ({p.b_tile.span}-byte swizzle)")
        with cx.w.block(""):
            a_arg = cx.base(a.name) if p.a_layout is None else _register_a(cx, a)
            for line in p.wgmma_calls(a_arg, cx.base(b.name), c.name, cx.tmp("wg_acc")):
                cx.w(line)
        return
    cx.w(f"// {p.instr.label} over {p.warps[0]}x{p.warps[1]} warps ({p.policy})")
    if p.a_layout is None:
        cx.w(p.call(cx.base(a.name), cx.base(b.name), c.name))
        return
    cx.w(p.call(_register_a(cx, a), cx.base(b.name), c.name))


def _register_a(cx: Context, a: ir.Buffer) -> str:
    """The name of an array holding register A's values in its 16-bit type: the fragment
    holds compute values (floats), gemm_rs and gemm_wgmma_rs take the 16-bit type."""
    regs = cx.tmp("a_regs")
    cx.w(f"{cpp_type(a.dtype)} {regs}[{a.layout.num_local}];")
    cx.w("#pragma unroll")
    cx.w(f"for (int k = 0; k < {a.layout.num_local}; ++k) "
         f"{regs}[k] = {T.to_memory(f'{a.name}[k]', a.dtype)};")
    return regs


def _major(mn: bool) -> str:
    return "MN-major" if mn else "K-major"


def _operand(cx: Context, op: ir.Op, attr: str):
    """A function from (row, col) C text of the stored operand to its compute value."""
    region = op.attrs[attr]
    buf = cx.bufs[region.buffer]
    staged = stage_fragment(cx, op, buf) if buf.scope == "fragment" else None

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
        raise KernelError(f"gemm accumulator '{c.buffer}' must be a whole fragment for "
                          f"{cx.dialect} (at {source_line(op.line)})")
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
