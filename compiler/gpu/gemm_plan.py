"""Planning a block-level GEMM on a GPU: instruction, warp partition, layouts, shared swizzles.

:func:`plan_gemm` turns a tile GEMM ``C[m, n] += op(A) @ op(B)`` into a :class:`GemmPlan` whose
:meth:`GemmPlan.call` is the C++ call of ``ffi/device/jaxtile/tile_gemm.h``. The plan mirrors
the device templates exactly in two places, and tests check both against the device code:

- the accumulator's element -> (thread, slot) map (:attr:`GemmPlan.acc_layout`, cudagen's
  ``mma_accumulator`` layout): the code generator gives the accumulator this layout;
- the shared tiles' physical offsets (:class:`SharedTile`): the copies that fill A and B must
  write them in the same swizzled order (:meth:`SharedTile.cpp_offset` is the C++ text).

Instructions come from the target's capabilities (``GpuCaps.mma_shapes``): ``mma.sync``
m16n8k16 for f16 x f16 and bf16 x bf16 into f32, m16n8k8 tf32 for f32 x f32 into f32, and a
scalar multiply-add fallback for everything else (and for shapes the atoms do not divide).
Where the caps have ``wgmma`` (sm_90a), f16/bf16 gemms into f32 with shared A and warpgroup-
sized tiles (a whole number of 128-thread warpgroups, each owning whole ``m64nNk16`` steps with
N 64, 128 or 256) use ``wgmma.mma_async`` instead, as do f32 gemms with both operands K-major
(A ``[m, k]``, B stored ``[n, k]``: ``m64nNk8`` tf32), and so do FP8 gemms (``m64nNk32``, e4m3
or e5m2, K-major only): operands in wgmma's canonical swizzled layout (:class:`SharedTile`
with ``span``), the accumulator in ``wgmma_accumulator``'s layout. A register A (f16/bf16,
attention's ``P``) takes wgmma's register form over one column of warpgroups, its layout the
accumulator layout of an ``[m, k]`` wgmma (:attr:`GemmPlan.a_layout`).
Where the target lists AMD's MFMA shapes (``HipCaps``), f16 and bf16 into f32 use
``32x32x8`` or ``16x16x16`` over 64-lane waves (accumulator :func:`.layout.mfma_accumulator`),
and f32 into f32 with shared operands ``32x32x4`` / ``16x16x8`` xf32 where listed (gfx942);
what no MFMA takes goes to the code generator's scalar gemm (tile_gemm.h's fallback assumes
32-lane warps).

The ``gemm_plan`` pass (:func:`plan_gemms`) plans each gemm of a kernel once and records the
decisions in the IR (the op's ``instr``, ``warps`` and ``policy`` notes, its shared operands'
``swizzle`` attribute); layout inference and code generation rebuild the plan from them
(:func:`recorded`, :func:`assemble_plan`), deciding nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import ir
from ..errors import KernelError
from ..target import GpuCaps, Target
from .layout import (
    LOCAL,
    THREAD,
    Factor,
    Layout,
    mfma_accumulator,
    mma_accumulator,
    wgmma_accumulator,
)


class GemmInstr(enum.IntEnum):
    """The instruction a gemm uses; the values are tile_gemm.h's ``kGemm*`` constants."""

    FMA = 0
    MMA16 = 1
    MMA_TF32 = 2
    MFMA32 = 3
    """AMD's ``v_mfma_f32_32x32x8`` f16 / bf16 (one 64-lane wave)."""
    MFMA16 = 4
    """AMD's ``v_mfma_f32_16x16x16`` f16 / bf16."""
    WGMMA = 5
    """wgmma.mma_async (sm_90a) into f32: m64nNk16 f16/bf16 (A in shared memory or
    registers), m64nNk8 tf32, m64nNk32 e4m3/e5m2: tile_gemm.h's gemm_wgmma, gemm_wgmma_rs."""
    MFMA32_XF32 = 6
    """AMD's ``v_mfma_f32_32x32x4_xf32`` (gfx942): float32 operands at reduced precision."""
    MFMA16_XF32 = 7
    """AMD's ``v_mfma_f32_16x16x8_xf32``."""

    @property
    def cpp(self) -> str:
        """tile_gemm.h's constant for the instruction ("" where none: wgmma is printed by its
        own template)."""
        return _FACTS[self].cpp

    @property
    def k_step(self) -> int:
        """The K a gemm_ss step consumes (the gemm's K must be a multiple): one instruction's
        for mma.sync and wgmma, two MFMAs' for AMD, whose lanes read both instructions'
        operands with one 16-byte LDS access (tile_gemm.h's gemm_mfma)."""
        return _FACTS[self].k_step

    @property
    def label(self) -> str:
        """How the accumulator layout names the instruction (for MFMA, the shape as
        ``HipCaps.mma_shapes`` lists it)."""
        return _FACTS[self].label

    @property
    def mfma_size(self) -> int:
        """S of an MFMA ``SxSxK`` instruction; 0 for the others."""
        return _FACTS[self].mfma_size

    @property
    def lanes(self) -> int:
        """Lanes of the warp (wave) the device templates split the tile over."""
        return 64 if self.mfma_size else 32


@dataclasses.dataclass(frozen=True)
class _InstrFacts:
    """What the generator and the planner need of one instruction, in one record so that a
    new instruction cannot be half-added."""
    cpp: str
    k_step: int
    label: str
    mfma_size: int = 0


_FACTS = {
    GemmInstr.FMA: _InstrFacts("jaxtile::kGemmFma", 1, "fma"),
    GemmInstr.MMA16: _InstrFacts("jaxtile::kGemmMma16", 16, "m16n8k16"),
    GemmInstr.MMA_TF32: _InstrFacts("jaxtile::kGemmMmaTf32", 8, "m16n8k8"),
    GemmInstr.MFMA32: _InstrFacts("jaxtile::kGemmMfma32", 16, "32x32x8", 32),
    GemmInstr.MFMA16: _InstrFacts("jaxtile::kGemmMfma16", 32, "16x16x16", 16),
    GemmInstr.WGMMA: _InstrFacts("", 16, "wgmma"),
    GemmInstr.MFMA32_XF32: _InstrFacts("jaxtile::kGemmMfma32Xf32", 8, "32x32x4", 32),
    GemmInstr.MFMA16_XF32: _InstrFacts("jaxtile::kGemmMfma16Xf32", 16, "16x16x8", 16),
}
assert set(_FACTS) == set(GemmInstr)


POLICIES = ("auto", "square", "rows", "cols")

_CPP_TYPES = {"float16": "jaxtile::half", "bfloat16": "jaxtile::bf16", "float32": "float",
              "float64": "double", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
              "int32": "int", "uint32": "unsigned", "int64": "int64_t",
              "float8_e4m3fn": "jaxtile::fp8e4m3", "float8_e5m2": "jaxtile::fp8e5m2"}


def cpp_type(dtype: Any) -> str:
    """The device-code type of a numpy dtype (``jaxtile::half`` for float16)."""
    name = np.dtype(dtype).name
    if name not in _CPP_TYPES:
        raise KernelError(f"gemm: no GPU device type for dtype {name}")
    return _CPP_TYPES[name]


@dataclasses.dataclass(frozen=True)
class SharedTile:
    """A shared-memory operand tile as tile_gemm.h lays it out: ``rows x cols`` row-major,
    16-byte chunks XOR-swizzled (``SwizzledTile``: ``chunk ^ ((row / (8 / P) * step) % P)``,
    ``P = gcd(chunks per row, 8)``) or not (``PlainTile``); or, with ``span``, wgmma's
    canonical layout (``WgmmaTile``): columns cut into blocks of ``span`` bytes stored one
    after another, each ``rows`` rows of ``span`` bytes, byte address bits 4-6 XOR bits 7-9
    (masked to ``span / 16 - 1``)."""

    dtype: np.dtype
    rows: int
    cols: int
    swizzled: bool
    step: int = 1
    """The swizzle key's multiplier (2 spreads rows 0-3 for scalar 32-bit loads)."""
    span: int = 0
    """wgmma's swizzle in bytes (32, 64 or 128); 0 for the mma.sync layouts."""

    @property
    def elems(self) -> int:
        return self.rows * self.cols

    @property
    def _vec(self) -> int:
        return 16 // self.dtype.itemsize

    def offset(self, row: int, col: int) -> int:
        """The element offset of ``(row, col)``: the C++ ``offset`` exactly."""
        size = self.dtype.itemsize
        if self.span:
            per_row = self.span // size
            at = (col // per_row) * self.rows * self.span + row * self.span + col % per_row * size
            return (at ^ (((at >> 7) & (self.span // 16 - 1)) << 4)) // size
        if not self.swizzled:
            return row * self.cols + col
        vec = self._vec
        phase = math.gcd(self.cols // vec, 8)
        rows_per_line = 8 // phase
        chunk = (col // vec) ^ ((row // rows_per_line * self.step) % phase)
        return row * self.cols + chunk * vec + col % vec

    def offsets(self) -> np.ndarray:
        """``[rows, cols]`` element offsets (a permutation of ``range(rows * cols)``)."""
        return np.array([[self.offset(r, c) for c in range(self.cols)]
                         for r in range(self.rows)], np.int64)

    @property
    def cpp(self) -> str:
        """The C++ layout type."""
        t = cpp_type(self.dtype)
        if self.span:
            return f"jaxtile::WgmmaTile<{t}, {self.rows}, {self.cols}, {self.span}>"
        if self.swizzled:
            return f"jaxtile::SwizzledTile<{t}, {self.rows}, {self.cols}, {self.step}>"
        return f"jaxtile::PlainTile<{t}, {self.rows}, {self.cols}>"

    def cpp_offset(self, row: str, col: str) -> str:
        """C++ text of the offset of element ``(row, col)`` (expressions)."""
        return f"{self.cpp}::offset({row}, {col})"


def wgmma_tile(dtype: Any, rows: int, cols: int) -> SharedTile:
    """A wgmma operand's ``rows x cols`` tile: the widest swizzle (at most 128 bytes) that
    divides a row, so one wgmma's 16 k (K-major) or 64 M/N indices (MN-major) fall in one
    column block. Rows are a multiple of 8 and a column block at least 32 bytes (the planner
    only makes such tiles), so every block, hence the tile, is whole 1024-byte periods."""
    dtype = np.dtype(dtype)
    row_bytes = cols * dtype.itemsize
    span = next(s for s in (128, 64, 32) if row_bytes % s == 0)
    return SharedTile(dtype, rows, cols, True, 1, span)


WGMMA_ALIGN = 1024
"""Byte alignment of a wgmma operand tile in shared memory: its swizzle is a function of the
absolute address, whose pattern repeats every 1024 bytes (8 rows of 128 bytes)."""


def shared_tile(dtype: Any, rows: int, cols: int, step: int = 1) -> SharedTile:
    """The layout of a ``rows x cols`` shared tile of ``dtype``: swizzled when its rows are
    whole 16-byte chunks, plain otherwise."""
    dtype = np.dtype(dtype)
    ok = cols * dtype.itemsize % 16 == 0
    return SharedTile(dtype, rows, cols, ok, step if ok else 1)


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    """How one tile GEMM runs; see the module docstring."""

    m: int
    n: int
    k: int
    a_dtype: np.dtype
    b_dtype: np.dtype
    acc_dtype: np.dtype
    threads: int
    trans_a: bool
    trans_b: bool
    policy: str
    instr: GemmInstr
    warps: tuple[int, int]
    """The ``(WARPS_M, WARPS_N)`` grid, warps numbered row-major; for wgmma the grid of
    warpgroups (128 threads each)."""
    acc_layout: Layout
    a_tile: SharedTile | None
    """A's shared layout (stored ``[m, k]``, or ``[k, m]`` when ``trans_a``); None for gemm_rs."""
    b_tile: SharedTile
    """B's shared layout (stored ``[k, n]``, or ``[n, k]`` when ``trans_b``)."""
    a_layout: Layout | None
    """For gemm_rs, the register layout A must have; None for gemm_ss."""

    @property
    def smem_bytes(self) -> int:
        """Shared memory of one stage of the operand tiles (A's and B's)."""
        tiles = [t for t in (self.a_tile, self.b_tile) if t is not None]
        return sum(t.elems * t.dtype.itemsize for t in tiles)

    @property
    def replicas(self) -> int:
        """How many times each warp's work is repeated (warps beyond the grid)."""
        group = 128 if self.instr == GemmInstr.WGMMA else self.instr.lanes
        return self.threads // (group * self.warps[0] * self.warps[1])

    @property
    def wgmma_n(self) -> int:
        """N of one wgmma instruction (a warpgroup's columns)."""
        return self.n // self.warps[1]

    @property
    def note(self) -> str:
        """The op's ``instr`` note: the instruction's label, ``wgmma.m64nNk16`` for wgmma."""
        if self.instr == GemmInstr.WGMMA:
            return f"wgmma.m64n{self.wgmma_n}k{_WGMMA_K[self.a_dtype.name]}"
        return self.instr.label

    def wgmma_calls(self, a: str, b: str, acc: str, regs: str) -> list[str]:
        """C++ statements of a wgmma gemm: the accumulator copied into the ``regs`` array of
        ``wgmma_acc``, ``wgmma.fence`` (the proxy fence and barrier that make the copies'
        generic writes of ``a`` and ``b`` visible to wgmma are the barrier pass's), the
        asynchronous wgmmas over K, ``commit_group``, ``wait_group 0`` and the result copied
        back to ``acc``. With A in registers (:attr:`a_layout`), ``a`` is the array of A's
        16-bit values in that layout (``gemm_wgmma_rs``)."""
        gm, gn = self.warps
        ta = "true" if self.trans_a else "false"
        tb = "true" if self.trans_b else "false"
        mi = self.m // (64 * gm)
        if self.a_tile is None:
            call = (f"jaxtile::gemm_wgmma_rs<{self.m}, {self.n}, {self.k}, {gm}, {tb}, "
                    f"{self.b_tile.cpp}>({regs}, {a}, {b});")
        else:
            call = (f"jaxtile::gemm_wgmma<{self.m}, {self.n}, {self.k}, {gm}, {gn}, {ta}, {tb}, "
                    f"{self.a_tile.cpp}, {self.b_tile.cpp}>({regs}, {a}, {b});")
        return [f"jaxtile::wgmma_acc<{self.wgmma_n}> {regs}[{mi}];",
                f"jaxtile::wgmma_acc_load({regs}, {acc});",
                "jaxtile::wgmma_fence();",
                call,
                "jaxtile::wgmma_commit_group();",
                "jaxtile::wgmma_wait_group<0>();",
                f"jaxtile::wgmma_acc_store({acc}, {regs});"]

    def call(self, a: str, b: str, acc: str) -> str:
        """C++ text of the call (a statement): ``a`` and ``b`` are the shared tiles' ``ptr``
        expressions (for gemm_rs, ``a`` is A's register array), ``acc`` the accumulator's."""
        if self.instr == GemmInstr.WGMMA:
            raise KernelError("internal error: a wgmma plan is printed by wgmma_calls, "
                              "not as a gemm_ss call")
        wm, wn = self.warps
        tb = "true" if self.trans_b else "false"
        if self.a_layout is not None and self.instr.mfma_size:
            return (f"jaxtile::gemm_rs_mfma<{self.instr.cpp}, {self.m}, {self.n}, {self.k}, "
                    f"{wm}, {wn}, {tb}, {self.b_tile.cpp}>({a}, {b}, {acc});")
        if self.a_layout is not None:
            return (f"jaxtile::gemm_rs<{self.m}, {self.n}, {self.k}, {wm}, {wn}, {tb}, "
                    f"{self.b_tile.cpp}>({a}, {b}, {acc});")
        ta = "true" if self.trans_a else "false"
        return (f"jaxtile::gemm_ss<{self.instr.cpp}, {self.m}, {self.n}, {self.k}, {wm}, {wn}, "
                f"{ta}, {tb}, {self.a_tile.cpp}, {self.b_tile.cpp}>({a}, {b}, {acc});")


def _instr(a: np.dtype, b: np.dtype, acc: np.dtype, caps: GpuCaps) -> GemmInstr:
    """The fastest instruction the target has for these types."""
    shapes = set(caps.mma_shapes)
    if a == b and acc == np.float32:
        if a.name == "float16" and ("m16n8k16", "f16") in shapes:
            return GemmInstr.MMA16
        if a.name == "bfloat16" and ("m16n8k16", "bf16") in shapes:
            return GemmInstr.MMA16
        if a.name == "float32" and ("m16n8k8", "tf32") in shapes:
            return GemmInstr.MMA_TF32
    return GemmInstr.FMA


def _dtype(dtype: Any, what: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise KernelError(f"gemm: {what} has an unknown dtype {dtype!r}") from None
    cpp_type(dt)
    return dt


_WGMMA_K = {"float16": 16, "bfloat16": 16, "float32": 8, "float8_e4m3fn": 32, "float8_e5m2": 32}
"""K of one wgmma (32 bytes of it) by operand type: m64nNk16, m64nNk8 tf32 for float32,
m64nNk32 for the 8-bit floats."""

_K_MAJOR_ONLY = ("float32", "float8_e4m3fn", "float8_e5m2")
"""Operand types wgmma reads K-major only (no imm-trans bits) and never from registers here."""


def _wgmma_grid(m: int, n: int, k: int, a: np.dtype, b: np.dtype, acc: np.dtype,
                threads: int, caps: GpuCaps, policy: str) -> tuple[int, int] | None:
    """The warpgroup grid of a wgmma plan, or None where wgmma does not apply: the target
    has no wgmma, the types are not f16 x f16 / bf16 x bf16 / f32 (tf32) x f32 / e4m3 x e4m3 /
    e5m2 x e5m2 into f32, K is not a multiple of the instruction's (16, 8 for tf32, 32 for
    FP8), or no grid of at most
    ``threads / 128`` warpgroups gives each warpgroup whole m64nN steps (N 64, 128 or 256).
    ``rows`` keeps whole rows per warpgroup (one warpgroup column), ``cols`` whole columns.
    Most warpgroups first, then per-warpgroup tiles closest to square (the fewest
    shared-memory bytes read per flop)."""
    if (not getattr(caps, "wgmma", False) or a != b or a.name not in _WGMMA_K
            or acc != np.float32 or k % _WGMMA_K[a.name] or threads % 128):
        return None
    groups = threads // 128
    for count in range(groups, 0, -1):
        if groups % count:
            continue
        grids = [(gm, count // gm) for gm in range(1, count + 1) if count % gm == 0]
        grids = [(gm, gn) for gm, gn in grids
                 if m % (64 * gm) == 0 and n % gn == 0 and n // gn in (64, 128, 256)
                 and not (policy == "rows" and gn > 1) and not (policy == "cols" and gm > 1)]
        if grids:
            return min(grids, key=lambda g: (m // g[0] + n // g[1], -g[0]))
    return None


def _mfma_instrs(a: np.dtype, b: np.dtype, acc: np.dtype, caps: GpuCaps,
                 a_in_registers: bool) -> list[GemmInstr]:
    """The MFMA instructions the target lists for these types, the larger tile first (half
    the operand reads per multiply-add). float32 operands take xf32 where the target has it
    (gfx942; gfx90a lists none, so float32 stays on the scalar path there), from shared
    memory only (gemm_rs_mfma takes 16-bit register operands)."""
    operand = {"float16": "f16", "bfloat16": "bf16", "float32": "xf32"}.get(a.name)
    if a != b or acc != np.float32 or operand is None or \
            (operand == "xf32" and a_in_registers):
        return []
    shapes = set(caps.mma_shapes)
    instrs = (GemmInstr.MFMA32_XF32, GemmInstr.MFMA16_XF32) if operand == "xf32" else \
        (GemmInstr.MFMA32, GemmInstr.MFMA16)
    return [i for i in instrs if (i.label, operand) in shapes]


def _mfma_plan(m: int, n: int, k: int, a: np.dtype, b: np.dtype, acc: np.dtype, threads: int,
               policy: str, caps: GpuCaps,
               a_in_registers: bool) -> tuple[GemmInstr, tuple[int, int]] | None:
    """The MFMA instruction and wave grid that keep the most waves busy (then the larger
    instruction) among those whose ``S x S`` tiles divide the waves' parts and whose K step
    divides K; None where no MFMA applies. A register A operand (the accumulator layout of an
    ``[m, k]`` tile) needs whole rows per wave and ``S | K``."""
    found = []
    for instr in _mfma_instrs(a, b, acc, caps, a_in_registers):
        size = instr.mfma_size
        if k % (size if a_in_registers else instr.k_step):
            continue
        try:
            warps = _partition(m, n, threads // caps.warp_size, policy, (size, size))
        except KernelError:
            continue
        if a_in_registers and warps[1] != 1:
            continue
        found.append((warps[0] * warps[1], size, instr, warps))
    if not found:
        return None
    best = max(found, key=lambda c: c[:2])
    return best[2], best[3]


def _usable(m: int, n: int, wm: int, wn: int, atom: tuple[int, int]) -> bool:
    return m % (atom[0] * wm) == 0 and n % (atom[1] * wn) == 0


def _partition(m: int, n: int, warps: int, policy: str,
               atom: tuple[int, int] = (16, 8)) -> tuple[int, int]:
    """The warp grid: as many warps as the atoms allow (at most ``warps``), shaped by policy.

    square: per-warp tiles as close to square as possible, which minimises the fragment loads
    per k step (MI + NI / 2 ldmatrix.x4); rows: every warp owns whole rows (WARPS_N = 1);
    cols: every warp owns whole columns (WARPS_M = 1)."""
    for count in range(warps, 0, -1):
        if warps % count:
            continue
        grids = [(wm, count // wm) for wm in range(1, count + 1) if count % wm == 0]
        if policy == "rows":
            grids = [g for g in grids if g[1] == 1]
        elif policy == "cols":
            grids = [g for g in grids if g[0] == 1]
        grids = [g for g in grids if _usable(m, n, *g, atom)]
        if grids:
            return min(grids, key=lambda g: (m // g[0] + n // g[1], -g[0]))
    raise KernelError(f"gemm: a {m}x{n} tile does not split into {atom[0]}x{atom[1]} atoms for "
                      f"any warp grid of policy '{policy}'")


def _register_a_layout(m: int, k: int, warps: tuple[int, int], threads: int) -> Layout:
    """gemm_rs's A: the accumulator layout of an [m, k] tile over WARPS_M x 1 warps, the warp
    columns (stride 32) holding copies; with WARPS_N == 1 it is ``mma_accumulator``'s."""
    wm, wn = warps
    if wn == 1:
        return mma_accumulator((m, k), (wm, 1), threads, "m16n8k16")
    mi, kk = m // (16 * wm), k // 8
    dims = ((Factor(wm, THREAD, 32 * wn), Factor(mi, LOCAL, 4 * kk), Factor(2, LOCAL, 2),
             Factor(8, THREAD, 4)),
            (Factor(kk, LOCAL, 4), Factor(4, THREAD, 1), Factor(2, LOCAL, 1)))
    rep = (Factor(wn, THREAD, 32), Factor(threads // (32 * wm * wn), THREAD, 32 * wm * wn))
    return Layout((m, k), dims, rep, threads, "")


def plan_gemm(m: int, n: int, k: int, a_dtype: Any, b_dtype: Any, acc_dtype: Any,
              threads: int, *, trans_a: bool = False, trans_b: bool = False,
              policy: str = "auto", target: Target, a_in_registers: bool = False,
              wgmma: bool = True) -> GemmPlan:
    """Plan ``C[m, n] (acc_dtype) += op(A) @ op(B)`` for a block of ``threads`` threads.

    ``A`` is ``[m, k]`` (``[k, m]`` stored when ``trans_a``), ``B`` is ``[k, n]`` (``[n, k]``
    when ``trans_b``). ``a_in_registers`` plans gemm_rs (A an f16/bf16 fragment in
    :attr:`GemmPlan.a_layout`), where ``auto`` means ``rows`` so that the accumulator of a
    previous gemm with the same plan shape feeds it without conversion; otherwise ``auto`` is
    ``square``. On a target with wgmma (and ``wgmma``), a warpgroup grid that follows the
    policy takes it, A in registers included (f16/bf16, one warpgroup column).
    Raises KernelError for shapes or types the templates cannot do."""
    if not isinstance(target.caps, GpuCaps):
        raise KernelError(f"gemm planning is for GPU targets, not {target.name}")
    if policy not in POLICIES:
        raise KernelError(f"gemm: unknown warp policy '{policy}' (one of {', '.join(POLICIES)})")
    caps = target.caps
    a_dt, b_dt, acc_dt = _dtype(a_dtype, "A"), _dtype(b_dtype, "B"), _dtype(acc_dtype, "C")
    if a_in_registers and trans_a:
        raise KernelError("gemm: A in registers has no stored orientation; trans_a must be False")
    if acc_dt.name in ("float16", "bfloat16"):
        raise KernelError(f"gemm: accumulate in float32, not {acc_dt.name} (16-bit floats have "
                          f"no register arithmetic here; cast the result)")
    if threads % caps.warp_size or not 0 < threads <= caps.max_threads_per_block:
        raise KernelError(f"gemm: {threads} threads is not a whole number of warps")
    if policy == "auto":
        policy = "rows" if a_in_registers else "square"
    mfma = _mfma_plan(m, n, k, a_dt, b_dt, acc_dt, threads, policy, caps, a_in_registers)
    if mfma is not None:
        return assemble_plan(m, n, k, a_dt, b_dt, acc_dt, threads, trans_a=trans_a,
                             trans_b=trans_b, policy=policy, instr=mfma[0], warps=mfma[1],
                             a_in_registers=a_in_registers)
    # tf32 and FP8 wgmma read K-major operands only: A [m, k] and B stored [n, k]; a register
    # A is 16-bit (the f16/bf16 fragment of m64nNk16).
    k_major = not trans_a and trans_b
    takes = wgmma and not (a_dt.name in _K_MAJOR_ONLY and not (k_major and not a_in_registers))
    grid = _wgmma_grid(m, n, k, a_dt, b_dt, acc_dt, threads, caps,
                       "rows" if a_in_registers else policy) if takes else None
    if grid is not None:
        return assemble_plan(m, n, k, a_dt, b_dt, acc_dt, threads, trans_a=trans_a,
                             trans_b=trans_b, policy="warpgroups", instr=GemmInstr.WGMMA,
                             warps=grid, a_in_registers=a_in_registers)
    instr = _instr(a_dt, b_dt, acc_dt, caps)
    if k % instr.k_step and not a_in_registers:
        instr = GemmInstr.FMA
    if a_in_registers and (instr != GemmInstr.MMA16 or k % 16):
        raise KernelError(f"gemm with A in registers needs f16 or bf16 operands into f32 and "
                          f"K % 16 == 0 (mma m16n8k16); got {a_dt.name} x {b_dt.name} -> "
                          f"{acc_dt.name}, K = {k}")
    if caps.warp_size != instr.lanes:
        # tile_gemm.h's multiply-add fallback splits the tile over 32-lane warps; other warp
        # sizes take the code generator's scalar gemm.
        raise KernelError(f"gemm: no matrix instruction of {caps.arch} takes {a_dt.name} x "
                          f"{b_dt.name} -> {acc_dt.name} for a {m}x{n}x{k} tile")
    warps = _partition(m, n, threads // caps.warp_size, policy)
    return assemble_plan(m, n, k, a_dt, b_dt, acc_dt, threads, trans_a=trans_a,
                         trans_b=trans_b, policy=policy, instr=instr, warps=warps,
                         a_in_registers=a_in_registers)


def assemble_plan(m: int, n: int, k: int, a_dtype: Any, b_dtype: Any, acc_dtype: Any,
                  threads: int, *, trans_a: bool, trans_b: bool, policy: str,
                  instr: GemmInstr, warps: tuple[int, int], a_in_registers: bool) -> GemmPlan:
    """The plan whose decisions (``instr``, ``warps``, ``policy``) :func:`plan_gemm` made
    (or the IR records): the layouts and shared tiles follow from them."""
    a_dt, b_dt, acc_dt = np.dtype(a_dtype), np.dtype(b_dtype), np.dtype(acc_dtype)
    warps = (int(warps[0]), int(warps[1]))
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    if instr == GemmInstr.WGMMA:
        # A register A is the accumulator layout of an [m, k] wgmma over the same warpgroup
        # rows: its k16 steps are the ISA's A fragments (tile_gemm.h's gemm_wgmma_rs).
        kk = _WGMMA_K[a_dt.name]
        return GemmPlan(m, n, k, a_dt, b_dt, acc_dt, threads, trans_a, trans_b, policy, instr,
                        warps, wgmma_accumulator((m, n), warps, threads, kk),
                        None if a_in_registers else wgmma_tile(a_dt, *a_shape),
                        wgmma_tile(b_dt, *b_shape),
                        wgmma_accumulator((m, k), (warps[0], 1), threads, kk)
                        if a_in_registers else None)
    if instr.mfma_size:
        acc_layout = mfma_accumulator((m, n), warps, threads, instr.label)
    else:
        acc_layout = mma_accumulator((m, n), warps, threads, instr.label)
    # tf32 operands that ldmatrix cannot deliver are read with scalar loads of 4 rows x 8
    # consecutive columns; swizzle step 2 puts those 4 rows in distinct banks.
    tf32 = instr == GemmInstr.MMA_TF32
    a_tile = None if a_in_registers else shared_tile(a_dt, *a_shape,
                                                     2 if tf32 and trans_a else 1)
    b_tile = shared_tile(b_dt, *b_shape, 2 if tf32 and not trans_b else 1)
    if not a_in_registers:
        a_layout = None
    elif instr.mfma_size:
        # gemm_rs_mfma reads A as the accumulator of an [m, k] gemm over the same waves.
        a_layout = mfma_accumulator((m, k), warps, threads, instr.label)
    else:
        a_layout = _register_a_layout(m, k, warps, threads)
    return GemmPlan(m, n, k, a_dt, b_dt, acc_dt, threads, trans_a, trans_b, policy, instr,
                    warps, acc_layout, a_tile, b_tile, a_layout)


def _where(op: ir.Op) -> str:
    return os.path.basename(op.line) if op.line else "?"


def policy(kernel: ir.Kernel) -> str:
    """The warp partition of a kernel's gemms: whole rows per warp when one of them takes A
    from registers (attention's ``P @ V``), so that the accumulator of ``S = Q @ K^T``, the
    row softmax on it and ``P`` share one layout; the planner's default otherwise."""
    bufs = {b.name: b for b in kernel.buffers}
    regs = any(bufs[op.attrs["a"].buffer].scope == "fragment" for op in _gemms(kernel))
    return "rows" if regs else "auto"


def plan(op: ir.Op, bufs: Mapping[str, ir.Buffer], threads: int, target: Target,
         policy: str = "auto", wgmma: bool = True) -> GemmPlan:
    """The plan of one gemm op (regions must be whole 2-D buffers: an accumulator fragment,
    shared operands or a register A)."""
    a, b, c = (op.attrs[r] for r in ("a", "b", "c"))
    where = _where(op)
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
                     a_in_registers=regs, wgmma=wgmma)


def _planned(op: ir.Op, kernel: ir.Kernel, target: Target, policy: str,
             wgmma: bool = True) -> GemmPlan | None:
    """The plan, or None where the gemm falls back to scalar multiply-adds."""
    bufs = {b.name: b for b in kernel.buffers}
    try:
        return plan(op, bufs, kernel.threads, target, policy, wgmma)
    except KernelError:
        return None


def _gemms(kernel: ir.Kernel) -> list[ir.Op]:
    return [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.kind == "gemm"]


SCALAR = "scalar"
"""The ``instr`` note of a gemm that falls back to scalar multiply-adds."""


def plan_gemms(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    """The gemm planning pass: each gemm gets the notes ``instr`` (the instruction's label,
    ``'wgmma.m64nNk16'``, or ``'scalar'`` for the fallback), ``warps`` (the warp grid; for
    wgmma ``warpgroups``, the warpgroup grid) and ``policy``, and each shared operand the
    ``swizzle`` buffer attribute of its plan's tile (0 row-major, else the XOR step), or for
    wgmma ``wgmma_swizzle`` (the swizzle in bytes of wgmma's canonical layout, which
    ``smem_plan`` places at a multiple of :data:`WGMMA_ALIGN`).

    Assumes: regions are whole buffers where a plan is possible. Guarantees: the plan is
    made once; layout inference and code generation rebuild it from the notes
    (:func:`recorded`). KernelError where two gemms need different swizzles of one buffer.

    A kernel whose register-A gemm cannot take wgmma (its A fragment then has mma.sync's
    layout) plans none of its gemms with wgmma: the accumulator the fragment comes from
    (attention's ``S``, cast to ``P``) must have that layout too."""
    pol = policy(kernel)
    plans = [_planned(op, kernel, target, pol) for op in _gemms(kernel)]
    use_wgmma = not any(p is not None and p.a_layout is not None and p.instr != GemmInstr.WGMMA
                        for p in plans)
    tiles: dict[str, tuple[SharedTile, ir.Op]] = {}

    def note(op: ir.Op) -> list[ir.Op]:
        if op.kind != "gemm":
            return [op]
        p = _planned(op, kernel, target, pol, use_wgmma)
        if p is None:
            return [op.with_notes(instr=SCALAR)]
        for attr, tile in (("a", p.a_tile), ("b", p.b_tile)):
            if tile is None:
                continue
            name = op.attrs[attr].buffer
            if tiles.setdefault(name, (tile, op))[0] != tile:
                raise KernelError(f"shared buffer '{name}' is read by gemms that need different "
                                  f"swizzles; not lowered for CUDA yet "
                                  f"(at {_where(op)})")
        if p.instr == GemmInstr.WGMMA:
            return [op.with_notes(instr=p.note, warpgroups=p.warps, policy=p.policy)]
        return [op.with_notes(instr=p.instr.label, warps=p.warps, policy=p.policy)]

    body = ir.map_ops(kernel.body, note)
    buffers = tuple(b.with_attrs(**_tile_attrs(tiles[b.name][0])) if b.name in tiles else b
                    for b in kernel.buffers)
    return dataclasses.replace(kernel, buffers=buffers, body=body)


def _tile_attrs(tile: SharedTile) -> dict[str, int]:
    if tile.span:
        return {"wgmma_swizzle": tile.span}
    return {"swizzle": tile.step if tile.swizzled else 0}


_BY_LABEL = {i.label: i for i in GemmInstr}


def recorded(op: ir.Op, kernel: ir.Kernel) -> GemmPlan | None:
    """The plan :func:`plan_gemms` recorded in ``op``'s notes (None: scalar fallback); an
    internal KernelError if the pass did not run."""
    instr = op.notes.get("instr")
    if instr is None:
        raise KernelError(f"internal error: gemm at {_where(op)} has no plan (the "
                          "gemm_plan pass did not run)")
    if instr == SCALAR:
        return None
    bufs = {b.name: b for b in kernel.buffers}
    a, b, c = (op.attrs[r] for r in ("a", "b", "c"))
    ta, tb = op.attrs["transpose_a"], op.attrs["transpose_b"]
    m, k = a.shape[::-1] if ta else a.shape
    n = b.shape[0] if tb else b.shape[1]
    wgmma = instr.startswith("wgmma.")
    p = assemble_plan(m, n, k, bufs[a.buffer].dtype, bufs[b.buffer].dtype,
                      bufs[c.buffer].dtype, kernel.threads, trans_a=ta, trans_b=tb,
                      policy=op.notes["policy"],
                      instr=GemmInstr.WGMMA if wgmma else _BY_LABEL[instr],
                      warps=op.notes["warpgroups" if wgmma else "warps"],
                      a_in_registers=bufs[a.buffer].scope == "fragment")
    if p.note != instr:
        raise KernelError(f"internal error: gemm at {_where(op)} records instruction "
                          f"{instr!r}, but its warpgroups give {p.note!r}")
    return p


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
                                  f"lowered for CUDA yet (at {_where(op)})")
    return out


def swizzles(kernel: ir.Kernel) -> dict[str, SharedTile]:
    """The shared buffers gemms read, with the physical layout the IR records for them."""
    out: dict[str, SharedTile] = {}
    for b in kernel.buffers:
        if "wgmma_swizzle" in b.attrs:
            out[b.name] = SharedTile(np.dtype(b.dtype), *b.shape, swizzled=True, step=1,
                                     span=b.attrs["wgmma_swizzle"])
        elif "swizzle" in b.attrs:
            step = b.attrs["swizzle"]
            out[b.name] = SharedTile(np.dtype(b.dtype), *b.shape, swizzled=step > 0,
                                     step=max(step, 1))
    return out
