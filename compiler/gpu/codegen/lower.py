"""Tile IR (after the GPU passes) -> GPU C++ source written against ``jaxtile/device.h``,
compiled as CUDA or HIP (the target's ``dialect``) or by the emulator.

The kernel is one ``JT_KERNEL`` function over a 1-D grid of the IR's blocks (block index 0
varies fastest, as on the CPU); its parameters are the kernel's buffers in call order
(inputs, inits, outputs). Each tile op becomes a commented block naming the user's source
line; the per-op lowerings are in :mod:`.values`, :mod:`.copies`, :mod:`.reductions` and
:mod:`.staging`, what they share in :mod:`.context`. The text never uses an architecture
feature except through the device header (``device_rule.py`` checks every file generated).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from ... import ir, op_defs, parser, printer, sizes, verify
from ...errors import KernelError
from ...target import Target
from .. import pingpong, tma
from ..barriers import PROXY_FENCE
from ..copy_schedule import ISSUE_KINDS, scheduled
from ..device_rule import device_rule_violations
from ..gemm_plan import swizzles
from ..smem_plan import RING_OFFSET, Scratch, SmemPlan, recorded_plan
from ..tma import TensorMap, tensor_maps
from ..warp_specialise import NAMED, split_of
from . import types as T
from .context import SIZE_PREFIX, Context, source_line
from .control import lower_while
from .copies import buffer_resources, lower_atomic, lower_copy
from .dynamic import dynamic_block_indices, size_bindings
from .gemm import lower_gemm
from .ordering import lower_fence, lower_load_acquire, lower_store_release
from .pipelined_loops import lower_pipelined, lower_release, lower_split
from .printing import lower_print
from .reductions import lower_reduce
from .sorts import lower_sort
from .staging import lower_argreduce, lower_scan, lower_staged
from .values import (
    lower_broadcast,
    lower_const,
    lower_iota,
    lower_load,
    lower_pointwise,
    lower_size,
    lower_store,
    lower_transpose,
)


@dataclasses.dataclass(frozen=True)
class GpuKernel:
    """Generated GPU code and what a launcher needs to run it."""

    source: str
    symbol: str
    params: tuple[tuple[str, str], ...]
    """(name, numpy dtype of the stored elements) per pointer parameter, in call order."""
    num_blocks: int
    threads: int
    shared_bytes: int
    """Dynamic shared memory to launch with (every shared array is a view into it)."""
    masks: tuple[str, ...]
    """The global accesses that kept a bounds check, and in which dimensions."""
    conversions: tuple[str, ...]
    """The layout conversions inference inserted (through shared memory)."""
    size_params: tuple[tuple[str, int, int], ...] = ()
    """Dynamic sizes, passed after the pointers as int parameters (``sz_<name>``): (name,
    parameter index of the buffer, dimension) it is read from at launch."""
    grid_size: sizes.Size = 0
    """Blocks of the (1-D) launch grid: :attr:`num_blocks`, or a size expression."""
    smem_plan: str = ""
    """Where each shared array lives (:meth:`.smem_plan.SmemPlan.report`)."""
    tensor_maps: tuple[TensorMap, ...] = ()
    """The TMA tensor maps the kernel takes after the sizes (:func:`..tma.tensor_maps`), built
    at launch from the buffers they describe."""


def symbol_name(kernel: ir.Kernel) -> str:
    """The C identifier the kernel is compiled under."""
    return "jt_" + re.sub(r"\W", "_", kernel.name)


_LOWER = {
    "const": lower_const, "elementwise": lower_pointwise, "convert": lower_pointwise,
    "select": lower_pointwise, "broadcast": lower_broadcast, "iota": lower_iota,
    "transpose": lower_transpose, "load": lower_load, "store": lower_store,
    "copy": lower_copy, "atomic": lower_atomic, "reduce": lower_reduce,
    "reshape": lower_staged, "rev": lower_staged,
    "slice": lower_staged, "concatenate": lower_staged, "scan": lower_scan,
    "argreduce": lower_argreduce, "size": lower_size, "sort": lower_sort,
    "load_acquire": lower_load_acquire, "store_release": lower_store_release,
    "fence": lower_fence, "print": lower_print,
}
"""Lowerings that only write through the context (``f(cx, op)``), each after the op's comment;
:data:`LOWERINGS` holds them and the others."""


def _describe(op: ir.Op) -> str:
    attrs = ", ".join(f"{k}={v!r}" if not isinstance(v, ir.Region) else f"{k}={v.buffer}"
                      for k, v in sorted(op.attrs.items()))
    return f"{op.kind}({attrs})" if attrs else op.kind


class _Lowering:
    def __init__(self, kernel: ir.Kernel, target: Target):
        self.kernel = kernel
        self.target = target
        self.cx = Context(kernel, target.caps.warp_size, target.caps.dialect, swizzles(kernel))
        self.conversions: list[str] = []
        self.tensor_maps = tensor_maps(kernel)
        self.ring: str | None = None
        """The mbarrier ring the last ``mbarrier_init`` declared, until its loop takes it."""
        self.split_ring: tuple[str, str] | None = None
        """A warp-specialised ring's full and empty barriers (:func:`lower_split`)."""
        self.split_stage = "0"
        """The stage of the ring loop's iteration (for its ``tma_release``)."""

    def run(self) -> GpuKernel:
        cx, k = self.cx, self.kernel
        self._indices()
        for b in k.buffers:
            if b.scope == "fragment":
                cx.array(T.reg(b.dtype), b.name, b.layout.num_local,
                         f"fragment {b.name}: {b.dtype.name}{list(b.shape)}{b.layout.text()}",
                         b.line)
            elif b.scope == "local":
                cx.array(T.reg(b.dtype), b.name, max(math.prod(b.shape), 1),
                         f"local {b.name}: {b.dtype.name}{list(b.shape)} (every thread)",
                         b.line)
        self.body(k.body)
        return self._assemble()

    def _indices(self) -> None:
        cx, k = self.cx, self.kernel
        cx.w("const int tid = int(thread_idx().x);")
        cx.w("const int block = int(block_idx().x);")
        if k.dynamic:
            dynamic_block_indices(cx)
            return
        stride = 1
        for v, n in zip(k.block_indices, k.grid):
            name = cx.define(v)
            e = "block" if stride == 1 else f"block / {stride}"
            e = e if stride * n >= k.num_blocks else f"({e}) % {n}"
            cx.w(f"const int {name} = {e};")
            stride *= n

    def body(self, body: tuple[ir.Stmt, ...]) -> None:
        cx = self.cx
        prologue: list[ir.Op] = []
        for stmt in body:
            if isinstance(stmt, ir.Op) and stmt.kind in (*ISSUE_KINDS, "async_commit"):
                prologue.append(stmt)       # printed with the loop it fills
            elif isinstance(stmt, ir.Op):
                self.op(stmt)
            elif isinstance(stmt, ir.While):
                lower_while(self, stmt)
            elif isinstance(stmt, ir.For):
                if stmt.kind == "pipelined" and scheduled(stmt):
                    lower_pipelined(self, stmt, prologue)
                    prologue = []
                    continue
                var = cx.define(stmt.var)
                start, extent = cx.operand(stmt.start), cx.operand(stmt.extent)
                kind = stmt.kind if stmt.kind != "pipelined" else f"pipelined({stmt.stages})"
                cx.w(f"// {source_line(stmt.line)}: {kind} loop")
                if stmt.kind == "unrolled":
                    cx.w("#pragma unroll")
                end = extent if start == "0" else f"{start} + {extent}"
                with cx.w.block(f"for (int {var} = {start}; {var} < {end}; ++{var})"):
                    cx.loop_depth += 1
                    self.body(stmt.body)
                    cx.loop_depth -= 1
            else:
                cx.w(f"// {source_line(stmt.line)}: when")
                with cx.w.block(f"if ({cx.name(stmt.cond)})"):
                    self.body(stmt.then)
                if stmt.otherwise:
                    with cx.w.block("else"):
                        self.body(stmt.otherwise)
        if prologue:
            raise KernelError(f"internal error: {prologue[0].kind} at "
                              f"{source_line(prologue[0].line)} is not followed by its "
                              "pipelined loop")

    def op(self, op: ir.Op) -> None:
        cx = self.cx
        cx.current_op = op
        self._op(op)
        cx.current_op = None

    def _op(self, op: ir.Op) -> None:
        lower = LOWERINGS.get(op.kind)
        if lower is None:
            raise KernelError(f"{op.kind} is not lowered for {self.target.caps.dialect} yet "
                              f"(at {source_line(op.line)})")
        lower(self, op)

    def take_ring(self) -> str:
        """The ring a TMA-ring loop runs over: the one its set-up declared just before."""
        ring, self.ring = self.ring, None
        if ring is None:
            raise KernelError(f"internal error: kernel '{self.kernel.name}' has a TMA ring "
                              "with no mbarrier_init before its prologue")
        return ring

    def comment(self, op: ir.Op) -> None:
        """A comment naming the op and its source line (not for uniform values, which are
        plain scalar declarations)."""
        if op.result is None or op.result.id not in self.cx.uniform:
            self.cx.w(f"// {source_line(op.line)}: {_describe(op)}")

    def _has_gemm(self) -> bool:
        return any(isinstance(s, ir.Op) and s.kind == "gemm" for s in ir.walk(self.kernel.body))

    def _assemble(self) -> GpuKernel:
        cx, k = self.cx, self.kernel
        symbol = symbol_name(k)
        params = [(b.name, T.memory_dtype(b.dtype)) for b in k.params]
        bound = size_bindings(k)
        sig = ", ".join([f"ptr<{T.mem(b.dtype)}> {b.name}" for b in k.params] +
                        [f"int {SIZE_PREFIX}{name}" for name, _, _ in bound] +
                        [f"JT_TENSOR_MAP({m.name})" for m in self.tensor_maps])
        shared, plan = self._shared_memory()
        split = split_of(k)
        # A split block is its consumers and the producer warpgroup; one block per SM is
        # what setmaxnreg's budget assumes (min_blocks 1 tells ptxas the starting count).
        threads = k.threads + split.attrs["producers"] if split else k.threads
        bounds = f"{threads}, 1" if split else f"{threads}"
        lines = [
            f"// {self.target.caps.dialect} code generated by jaxtile for kernel '{k.name}': "
            f"grid {list(k.grid)}, {threads} threads.",
            "#include <jaxtile/device.h>",
            *(["#include <jaxtile/tile_gemm.h>"] if cx.swizzles or self._has_gemm() else []),
            "",
            "using namespace jaxtile;",
            "",
            f"JT_KERNEL JT_LAUNCH_BOUNDS({bounds}) void {symbol}({sig}) {{",
            *shared,
            *buffer_resources(k),
            *cx.w.lines,
            "}",
            "",
        ]
        text = "\n".join(lines)
        bad = device_rule_violations(text)
        if bad:
            raise KernelError(f"generated {self.target.caps.dialect} breaks the device-header "
                              f"rule: {bad[0]}")
        blocks = k.num_blocks if not k.dynamic else 0
        grid_size = blocks or sizes.canonical("*".join(f"({g})" for g in k.grid))
        return GpuKernel(text, symbol, tuple(params), blocks, threads, plan.total,
                          tuple(cx.masks), tuple(self.conversions), size_params=bound,
                          grid_size=grid_size, smem_plan=plan.report(),
                          tensor_maps=self.tensor_maps)

    def _shared_memory(self) -> tuple[list[str], SmemPlan]:
        """The declarations of every shared array (views of the dynamic shared memory at
        the offsets the IR records) and the recorded plan."""
        cx, k = self.cx, self.kernel
        scratch = [(Scratch(n, T.sizeof(t) * c, op), at) for t, n, c, op, at in cx.shared]
        plan = recorded_plan(k, self.target.caps, scratch)
        arrays = [(T.mem(b.dtype), b.name, max(math.prod(b.shape), 1)
                   * b.attrs.get("stages", 1)) for b in k.buffers
                  if b.scope == "shared" and b.name in plan.offsets]
        arrays += [(t, n, c) for t, n, c, _, _ in cx.shared]
        decls = [f"  JT_SHARED_AT({t}, {n}, {c}, {plan.offsets[n]});" for t, n, c in arrays]
        return decls, plan


def _commented(lower: Callable[[Context, ir.Op], None]) -> Callable[[_Lowering, ir.Op], None]:
    """A lowering that writes to the context, after the op's comment."""
    def lower_commented(lw: _Lowering, op: ir.Op) -> None:
        lw.comment(op)
        lower(lw.cx, op)
    return lower_commented


LOWERINGS = lowers = op_defs.Lowerings("cuda", {k: _commented(f) for k, f in _LOWER.items()})
"""The GPU lowering of each op kind: ``f(lowering, op)`` writes the op's code (the
registry's backend name is ``cuda``, which the HIP target shares)."""


@lowers("barrier")
def _barrier(lw: _Lowering, op: ir.Op) -> None:
    if op.notes.get(PROXY_FENCE):
        # the generic writes before it become visible to the async proxy (wgmma)
        lw.cx.w("fence_proxy_async();")
    reason = op.notes.get("reason", "shared-memory hazard")
    if NAMED in op.notes:   # the consumers of a warp-specialised block
        bar, count = op.notes[NAMED]
        lw.cx.w(f"barrier_sync({bar}, {count});  // {reason}")
    else:
        lw.cx.w(f"sync_threads();  // {reason}")


@lowers("warp_specialise")
def _warp_specialise(lw: _Lowering, op: ir.Op) -> None:
    lower_split(lw, op)


@lowers("tma_release")
def _tma_release(lw: _Lowering, op: ir.Op) -> None:
    lower_release(lw, op)


@lowers("pingpong")
def _pingpong(lw: _Lowering, op: ir.Op) -> None:
    a = op.attrs
    lw.cx.w(f"// ping-pong (compiler/gpu/pingpong.py): consumer warpgroup w takes its turns "
            f"at the gemms on named barrier {a['barrier']} + w, {a['count']} threads: w "
            "waiting, w - 1 handing over")


@lowers("turn_wait", "turn_pass")
def _turn(lw: _Lowering, op: ir.Op) -> None:
    """``barrier_sync`` on the warpgroup's own turn barrier (``turn_wait``) or
    ``barrier_arrive`` on the next warpgroup's (``turn_pass``), except warpgroup 0's first
    wait and the last warpgroup's last hand-over where the op says so."""
    cx, a = lw.cx, op.attrs
    wg, n = f"(tid / {pingpong.WARPGROUP})", a["warpgroups"]
    k = cx.operand(op.operands[0])
    if op.kind == pingpong.WAIT:
        skip = f"{wg} == 0 && {k} == 0" if a["first"] else ""
        call = f"barrier_sync({a['barrier']} + {wg}, {a['count']});  // this warpgroup's turn"
    else:
        last = f"{cx.operand(op.operands[1])} - 1"
        skip = f"{wg} == {n - 1} && {k} == {last}" if a["last"] else ""
        call = (f"barrier_arrive({a['barrier']} + ({wg} + 1) % {n}, {a['count']});  "
                "// the next warpgroup's turn")
    cx.w(f"if (!({skip})) {call}" if skip else call)


@lowers("async_issue")
def _async_issue(lw: _Lowering, op: ir.Op) -> None:
    raise KernelError(f"internal error: async_issue at {source_line(op.line)} outside the "
                      "schedule of a pipelined loop")


@lowers("tma_issue", "tma_wait")
def _tma_schedule(lw: _Lowering, op: ir.Op) -> None:
    raise KernelError(f"internal error: {op.kind} at {source_line(op.line)} outside the "
                      "schedule of a TMA ring")


@lowers("mbarrier_init")
def _mbarrier_init(lw: _Lowering, op: ir.Op) -> None:
    """A ring's barriers, declared; one thread initialises them and fences the
    initialisation (the pipelining pass put the block barriers around this op)."""
    cx, stages = lw.cx, op.attrs["stages"]
    ring = cx.tmp("ring")
    # At the offset the smem_plan pass gave the ring (after every buffer and scratch).
    cx.shared.append(("uint64_t", ring, stages, op, op.notes[RING_OFFSET]))
    with cx.w.block("if (tid == 0)"):
        cx.w(f"for (int s = 0; s < {stages}; ++s) mbarrier_init({ring} + s, "
             f"{op.attrs['count']});")
        cx.w("fence_mbarrier_init();")
    lw.ring = ring


@lowers("tma_store")
def _tma_store(lw: _Lowering, op: ir.Op) -> None:
    """One thread issues the store (coordinates innermost first) and commits it as a bulk
    async-group; the TMA-store pass placed the fence before it and the wait after it."""
    lw.comment(op)
    cx = lw.cx
    src, dst = op.attrs["src"], op.attrs["dst"]
    tmap = tma.map_of(lw.tensor_maps, op, [b.name for b in lw.kernel.params])
    coords = [cx.operand(i.start) for i in reversed(dst.index)]
    with cx.w.block("if (tid == 0)"):
        cx.w(f"tma_store_{len(coords)}d(tensor_map_ref({tmap.name}), "
             f"{cx.bufs[src.buffer].name}, {', '.join(coords)});")
        cx.w("bulk_commit_group();")


@lowers("tma_store_wait")
def _tma_store_wait(lw: _Lowering, op: ir.Op) -> None:
    # The .read form: the source may be written again once read; nothing in the kernel
    # reads the output (the pass's rule), so its global writes need not have completed.
    lw.cx.w(f"if (tid == 0) bulk_wait_group_read<{op.attrs['count']}>();  "
            "// its TMA stores have read their shared source")


@lowers("async_commit")
def _async_commit(lw: _Lowering, op: ir.Op) -> None:
    lw.cx.w("cp_async_commit();")


@lowers("async_wait")
def _async_wait(lw: _Lowering, op: ir.Op) -> None:
    lw.cx.w(f"cp_async_wait<{op.attrs['count']}>();")


@lowers("gemm")
def _gemm(lw: _Lowering, op: ir.Op) -> None:
    lw.comment(op)
    lower_gemm(lw.cx, op)


@lowers("relayout")
def _relayout(lw: _Lowering, op: ir.Op) -> None:
    src = op.operands[0]
    lw.conversions.append(f"{source_line(op.line)}: {src.dtype.name}{list(src.shape)} "
                          f"{lw.cx.layout(src).text()} -> {op.notes['layout'].text()}")
    lw.comment(op)
    lower_staged(lw.cx, op)


_TEMP = re.compile(r"(v|c|s|t|r|acc|best|at|x|vec|base|partials|staged|a_regs|ring|it)\d+$")
_RESERVED = frozenset("""
    k i kk d tid block ptr half bf16 idx3 f32x2 f32x4 u32x2 u32x4 jaxtile int float double
    bool char short long unsigned signed void auto const constexpr if else for while do return
    break continue switch case default goto struct class union enum namespace using template
    typename new delete this sizeof static extern inline volatile register operator true false
    nullptr friend public private protected virtual explicit mutable typedef asm try catch throw
""".split())


def _c_name(name: str) -> str:
    """A buffer's identifier in the generated code: its own name unless that is a C++
    keyword, a name of the device header or of the generator's temporaries."""
    return f"{name}_" if name in _RESERVED or _TEMP.match(name) else name


def _renamed(kernel: ir.Kernel) -> ir.Kernel:
    names = {b.name: _c_name(b.name) for b in kernel.buffers}
    if all(k == v for k, v in names.items()):
        return kernel

    def region(r: ir.Region) -> ir.Region:
        return dataclasses.replace(r, buffer=names[r.buffer])

    def body(stmts: tuple[ir.Stmt, ...]) -> tuple[ir.Stmt, ...]:
        out = []
        for s in stmts:
            if isinstance(s, ir.For):
                out.append(dataclasses.replace(s, body=body(s.body)))
            elif isinstance(s, ir.If):
                out.append(dataclasses.replace(s, then=body(s.then), otherwise=body(s.otherwise)))
            elif isinstance(s, ir.While):
                out.append(dataclasses.replace(s, cond=body(s.cond), body=body(s.body)))
            else:
                attrs = {a: region(v) if isinstance(v, ir.Region) else v
                         for a, v in s.attrs.items()}
                out.append(dataclasses.replace(s, attrs=attrs))
        return tuple(out)

    buffers = tuple(dataclasses.replace(b, name=names[b.name],
                                        aliases=names.get(b.aliases, b.aliases))
                    for b in kernel.buffers)
    return dataclasses.replace(kernel, buffers=buffers, body=body(kernel.body))


def generate(kernel: ir.Kernel, target: Target) -> GpuKernel:
    """The GPU code of ``kernel`` (which has been through the GPU passes) for ``target``.

    Code generation only prints what the IR says: with ``JAXTILE_VERIFY_IR`` set it checks
    that the IR's text parses back to the same text and that the code generated from the
    parsed kernel is the same, byte for byte (an internal KernelError otherwise: something
    was decided outside the IR, or is missing from its text)."""
    code = _Lowering(_renamed(kernel), target).run()
    if verify.requested():
        _check_round_trip(kernel, target, code)
    return code


def _check_round_trip(kernel: ir.Kernel, target: Target, code: GpuKernel) -> None:
    text = printer.format_kernel(kernel)
    again = parser.parse_kernel(text)
    if printer.format_kernel(again) != text:
        raise KernelError(f"internal error: the lowered IR of kernel {kernel.name!r} does not "
                          "print back to the text it was parsed from")
    other = _Lowering(_renamed(again), target).run()
    if other != code:
        diff = next((f"{a!r} != {b!r}" for a, b in zip(code.source.splitlines(),
                     other.source.splitlines()) if a != b), "the launch figures differ")
        raise KernelError(f"internal error: the code of kernel {kernel.name!r} generated from "
                          f"its re-parsed lowered IR differs ({diff}): code generation used "
                          "a decision the IR text does not show")

