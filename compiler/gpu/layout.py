"""Layouts: which thread of a block holds which element of a register tile, and where.

A :class:`Layout` of an n-d tile splits each tile dimension into *factors*, major first. A
factor has a size, a kind (``thread`` or ``local``) and a stride. An element's coordinate
along a dimension is read as mixed-radix digits, one per factor of that dimension (the last
factor is the least significant); a thread factor's digit times its stride is added to the
owning thread's index, a local factor's to the element's slot in the thread's local array.
So, per dimension, ``coord = thread_part(thread) + local_part(slot)``: code generation
computes the thread part once and adds a constant per unrolled slot.

Thread factors that no dimension uses (``replicate``) make copies: every value of their
digit names another thread holding the same elements (reduction results are replicated
across the threads that reduced them). The thread factors, replication included, tile the
block's thread range ``[0, threads)`` exactly, and the local factors tile ``[0, num_local)``
exactly; so every (thread, slot) pair names one element position. A dimension's factors may
cover more than its size (tiles whose size is no multiple of the thread count): positions past
the edge are padding, which code generation masks (:meth:`Layout.padded_dims`).

Printing: ``#mma(m16n8k16, warps 2x2)``, ``#mfma(32x32x8, warps 2x2)``,
``#blocked(vec 4, threads 4x32)``, ``#replicated``, ``#slice(<parent>, [128, 64], dims
(1,))``, ``#transpose(...)``; any other layout prints its factors (``#factors(...)``).
:func:`parse` reads every form back given the tile shape and the block's thread count, so
the IR text round-trips.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np

THREAD = "thread"
LOCAL = "local"


@dataclasses.dataclass(frozen=True)
class Factor:
    """One mixed-radix digit of a tile dimension (or a replication digit)."""

    size: int
    kind: str
    """:data:`THREAD` or :data:`LOCAL`."""
    stride: int
    """What one step of the digit adds to the thread index or to the local slot."""

    def text(self) -> str:
        return f"{self.size}{'t' if self.kind == THREAD else 'l'}{self.stride}"


def _check_radix(factors: Sequence[Factor], total: int, what: str) -> None:
    """Factors must tile [0, total) exactly: sorted by stride, each stride the product of
    the sizes below it."""
    expect = 1
    for f in sorted(factors, key=lambda f: (f.stride, f.size)):
        if f.stride != expect:
            raise ValueError(f"layout {what} factors {[f.text() for f in factors]} do not "
                             f"tile [0, {total}) (stride {f.stride}, expected {expect})")
        expect *= f.size
    if expect != total:
        raise ValueError(f"layout {what} factors cover {expect}, not {total}")


def digit_expr(var: str, stride: int, size: int, total: int) -> str:
    """C text of ``(var / stride) % size`` for ``0 <= var < total``, with shifts and masks
    for powers of two and without the modulo where the digit is the most significant."""
    pow2 = stride & (stride - 1) == 0 and size & (size - 1) == 0
    if stride == 1:
        base = var
    elif pow2:
        base = f"({var} >> {stride.bit_length() - 1})"
    else:
        base = f"({var} / {stride})"
    if stride * size >= total:
        return base
    return f"({base} & {size - 1})" if pow2 else f"({base} % {size})"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Element -> (thread, local slot) map of a tile; see the module docstring."""

    shape: tuple[int, ...]
    dims: tuple[tuple[Factor, ...], ...]
    """Per tile dimension, its factors, major first."""
    replicate: tuple[Factor, ...]
    """Thread factors no dimension uses."""
    threads: int
    label: str = dataclasses.field(default="", compare=False)
    """How the layout prints (without the ``#``); empty: its factors."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        dims = tuple(tuple(f for f in d if f.size > 1) for d in self.dims)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "replicate", tuple(f for f in self.replicate if f.size > 1))
        if len(dims) != len(self.shape):
            raise ValueError(f"layout has {len(dims)} dimensions for shape {self.shape}")
        for n, d in zip(self.shape, dims):
            if self._extent(d) < n:
                raise ValueError(f"layout dimension {[f.text() for f in d]} covers "
                                 f"{self._extent(d)} < {n}")
        _check_radix(self.thread_factors(), self.threads, "thread")
        _check_radix(self.local_factors(), self.num_local, "local")

    @staticmethod
    def _extent(factors: Sequence[Factor]) -> int:
        return math.prod(f.size for f in factors)

    def thread_factors(self) -> list[Factor]:
        """Every thread factor, replication included."""
        return [f for d in self.dims for f in d if f.kind == THREAD] + list(self.replicate)

    def local_factors(self) -> list[Factor]:
        return [f for d in self.dims for f in d if f.kind == LOCAL]

    @property
    def num_local(self) -> int:
        """Slots of the per-thread local array (padding slots included)."""
        return math.prod(f.size for d in self.dims for f in d if f.kind == LOCAL)

    @property
    def replication(self) -> int:
        """How many threads hold each element."""
        return math.prod(f.size for f in self.replicate)

    def extents(self) -> tuple[int, ...]:
        """Per dimension, the positions the factors cover (>= the shape)."""
        return tuple(self._extent(d) for d in self.dims)

    def padded_dims(self) -> tuple[int, ...]:
        """Dimensions whose factors reach past the tile's edge: accesses along them need a
        mask."""
        return tuple(i for i, (n, e) in enumerate(zip(self.shape, self.extents())) if e > n)

    # -- the map, numerically ------------------------------------------------------------

    def _weights(self, d: int) -> list[int]:
        """Per factor of dimension ``d``, what one step of its digit adds to the coordinate."""
        out, w = [], 1
        for f in reversed(self.dims[d]):
            out.append(w)
            w *= f.size
        return out[::-1]

    def coords(self, thread: int, slot: int) -> tuple[int, ...]:
        """The element (thread, slot) names; coordinates may lie past the edge (padding)."""
        out = []
        for d, factors in enumerate(self.dims):
            c = 0
            for f, w in zip(factors, self._weights(d)):
                c += ((thread if f.kind == THREAD else slot) // f.stride) % f.size * w
            out.append(c)
        return tuple(out)

    def elements(self) -> np.ndarray:
        """``[threads, num_local, ndim]`` coordinates of what each (thread, slot) holds, -1
        where it is padding."""
        out = np.full((self.threads, self.num_local, len(self.shape)), -1, np.int64)
        for t in range(self.threads):
            for k in range(self.num_local):
                c = self.coords(t, k)
                if all(x < n for x, n in zip(c, self.shape)):
                    out[t, k] = c
        return out

    def owners(self) -> tuple[np.ndarray, np.ndarray]:
        """``(thread, local)``: ``thread`` has shape ``shape + (replication,)`` (every thread
        holding the element, ascending), ``local`` has ``shape`` (the slot, the same in every
        replica)."""
        # :meth:`coords` for every (thread, slot) at once, in numpy: the barrier pass asks
        # this of every fragment layout, 16 K elements for an attention tile.
        t = np.arange(self.threads)[:, None]
        k = np.arange(self.num_local)[None, :]
        coords = []
        for d, factors in enumerate(self.dims):
            c = np.zeros((self.threads, self.num_local), np.int64)
            for f, w in zip(factors, self._weights(d)):
                c = c + ((t if f.kind == THREAD else k) // f.stride) % f.size * w
            coords.append(c.ravel())
        inside = np.ones(self.threads * self.num_local, bool)
        for c, n in zip(coords, self.shape):
            inside &= c < n
        held = np.flatnonzero(inside)               # (thread, slot) pairs, thread-major
        element = np.ravel_multi_index([c[held] for c in coords], self.shape) \
            if self.shape else np.zeros(len(held), np.int64)
        order = np.argsort(element, kind="stable")  # by element, each by ascending thread
        element, held = element[order], held[order]
        first = np.searchsorted(element, element, side="left")
        replica = np.arange(len(element)) - first
        size = math.prod(self.shape)
        thread = np.full((size, self.replication), -1, np.int64)
        thread[element, replica] = held // self.num_local
        local = np.full(size, -1, np.int64)
        local[element] = held % self.num_local      # the same slot in every replica
        return thread.reshape(self.shape + (self.replication,)), local.reshape(self.shape)

    # -- C expressions for code generation ---------------------------------------------

    def thread_coord_exprs(self, tid: str) -> list[str]:
        """Per dimension, C text of the coordinate's thread part for thread ``tid`` (a
        variable holding the linear thread index); ``"0"`` where no thread factor is."""
        out = []
        for d, factors in enumerate(self.dims):
            terms = []
            for f, w in zip(factors, self._weights(d)):
                if f.kind == THREAD:
                    digit = digit_expr(tid, f.stride, f.size, self.threads)
                    terms.append(digit if w == 1 else f"{digit} * {w}")
            out.append(" + ".join(terms) if terms else "0")
        return out

    def local_coords(self, slot: int) -> tuple[int, ...]:
        """Per dimension, the coordinate's local part for slot ``slot``."""
        out = []
        for d, factors in enumerate(self.dims):
            out.append(sum((slot // f.stride) % f.size * w
                           for f, w in zip(factors, self._weights(d)) if f.kind == LOCAL))
        return tuple(out)

    def replica_expr(self, tid: str) -> str | None:
        """C text of the thread's replica number (0 for the one that stores shared
        results), or None when each element has one owner."""
        if not self.replicate:
            return None
        terms, w = [], 1
        for f in sorted(self.replicate, key=lambda f: f.stride):
            digit = digit_expr(tid, f.stride, f.size, self.threads)
            terms.append(digit if w == 1 else f"{digit} * {w}")
            w *= f.size
        return " + ".join(terms)

    def vector_width(self) -> int:
        """Contiguous elements of the last dimension in consecutive slots: the innermost
        factor of the last dimension when it is local with stride 1, else 1."""
        if not self.dims or not self.dims[-1]:
            return 1
        f = self.dims[-1][-1]
        return f.size if f.kind == LOCAL and f.stride == 1 else 1

    # -- derived layouts ------------------------------------------------------------------

    def drop(self, axes: Sequence[int], keepdims: bool = False) -> Layout:
        """The layout of a reduction over ``axes``: their thread factors become replication
        (each reducing thread ends up holding the result) and their local factors go; the
        remaining local factors keep their order. With ``keepdims`` the axes stay, of size 1
        (the operand of a broadcast along them)."""
        # Plain ints: the label prints them, and numpy's (np.int64(1)) would not parse back.
        axes = tuple(sorted({int(a) for a in axes}))
        gone = [f for i, d in enumerate(self.dims) if i in axes for f in d]
        locals_kept = sorted((f for i, d in enumerate(self.dims) if i not in axes for f in d
                              if f.kind == LOCAL), key=lambda f: f.stride)
        restride, s = {}, 1
        for f in locals_kept:
            restride[id(f)] = s
            s *= f.size
        dims, shape = [], []
        for i, (n, d) in enumerate(zip(self.shape, self.dims)):
            if i in axes:
                if keepdims:
                    dims.append(())
                    shape.append(1)
                continue
            dims.append(tuple(dataclasses.replace(f, stride=restride[id(f)])
                              if f.kind == LOCAL else f for f in d))
            shape.append(n)
        replicate = self.replicate + tuple(f for f in gone if f.kind == THREAD)
        keep = ", keepdims" if keepdims else ""
        label = f"slice({self.text()[1:]}, {list(self.shape)}, dims {axes}{keep})"
        if not keepdims and self.label.endswith(f", dims {axes}, keepdims)"):
            # Dropping the size-1 dimensions a keepdims slice left: the parent's plain slice.
            label = self.label.removesuffix(", keepdims)") + ")"
        return Layout(tuple(shape), tuple(dims), replicate, self.threads, label)

    def permute(self, perm: Sequence[int]) -> Layout:
        """The layout of the transposed tile (result dim i is dim ``perm[i]``): the same
        threads and slots hold the same elements."""
        perm = tuple(int(p) for p in perm)  # printed in the label: numpy ints would not parse
        return Layout(tuple(self.shape[p] for p in perm), tuple(self.dims[p] for p in perm),
                      self.replicate, self.threads,
                      f"transpose({self.text()[1:]}, {list(self.shape)}, perm {tuple(perm)})")

    def local_coord_exprs(self, slot: str) -> list[str]:
        """Per dimension, C text of the coordinate's local part for slot variable
        ``slot`` (compile-time constant after unrolling)."""
        out = []
        for d, factors in enumerate(self.dims):
            terms = []
            for f, w in zip(factors, self._weights(d)):
                if f.kind == LOCAL:
                    digit = digit_expr(slot, f.stride, f.size, self.num_local)
                    terms.append(digit if w == 1 else f"{digit} * {w}")
            out.append(" + ".join(terms) if terms else "0")
        return out

    def drop_slot_expr(self, slot: str, axes: Sequence[int]) -> str:
        """C text of :meth:`drop_slot` for slot variable ``slot``."""
        axes = set(axes)
        kept = sorted((f for i, d in enumerate(self.dims) if i not in axes for f in d
                       if f.kind == LOCAL), key=lambda f: f.stride)
        terms, s = [], 1
        for f in kept:
            digit = digit_expr(slot, f.stride, f.size, self.num_local)
            terms.append(digit if s == 1 else f"{digit} * {s}")
            s *= f.size
        return " + ".join(terms) if terms else "0"

    def drop_slot(self, slot: int, axes: Sequence[int]) -> int:
        """The slot in ``self.drop(axes)`` holding the reduction of slot ``slot``'s row."""
        axes = set(axes)
        out, s = 0, 1
        kept = sorted((f for i, d in enumerate(self.dims) if i not in axes for f in d
                       if f.kind == LOCAL), key=lambda f: f.stride)
        for f in kept:
            out += (slot // f.stride) % f.size * s
            s *= f.size
        return out

    def text(self) -> str:
        """``#mma(m16n8k16, warps 2x2)`` and the like."""
        if self.label:
            return f"#{self.label}"
        dims = "; ".join(" ".join(f.text() for f in d) or "-" for d in self.dims)
        rep = " ".join(f.text() for f in self.replicate)
        return f"#factors({dims}{' | ' + rep if rep else ''})"

    def __repr__(self) -> str:
        return self.text()


# -- constructors ----------------------------------------------------------------------------


def _radix(sizes_kinds: list[tuple[int, str]]) -> list[Factor]:
    """Give factors (listed least significant first per kind) consecutive strides."""
    strides = {THREAD: 1, LOCAL: 1}
    out = []
    for size, kind in sizes_kinds:
        out.append(Factor(size, kind, strides[kind]))
        strides[kind] *= size
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _thread_split(units: Sequence[int], threads: int) -> list[int]:
    """Threads per dimension (each a divisor of what is left, last dimension first): the
    split with the fewest slots per thread, then the least padding, then the most threads
    along the last dimension (coalescing)."""
    best: tuple | None = None

    def visit(d: int, left: int, chosen: list[int]) -> None:
        nonlocal best
        if d < 0:
            split = chosen[::-1]
            slots = math.prod(math.ceil(u / t) for u, t in zip(units, split))
            waste = sum(t * math.ceil(u / t) - u for u, t in zip(units, split))
            score = (slots, waste, -split[-1])
            if best is None or score < best[0]:
                best = (score, split)
            return
        for t in _divisors(left):
            if t <= 2 * units[d] or t == 1:
                visit(d - 1, left // t, chosen + [t])

    visit(len(units) - 1, threads, [])
    return best[1]


def blocked(shape: Sequence[int], threads: int, vec: int = 1) -> Layout:
    """A coalesced layout: each thread holds ``vec`` contiguous elements of the last
    dimension, consecutive threads the next ones, then the next rows; what the threads do
    not cover in one sweep repeats in further local slots. Threads left over once the tile
    is covered replicate it."""
    shape = tuple(int(n) for n in shape)
    if not shape:
        return replicated(shape, threads)
    if vec < 1 or shape[-1] % vec:
        raise ValueError(f"vector width {vec} does not divide the last dimension {shape[-1]}")
    units = [*shape[:-1], shape[-1] // vec]
    split = _thread_split(units, threads)
    per_dim = [(t, math.ceil(u / t)) for u, t in zip(units, split)]
    left = threads // math.prod(split)
    # thread strides: last dimension fastest; local strides: vec fastest, then the last
    # dimension's repeats, then earlier dimensions'.
    order: list[tuple[int, str, int, str]] = []  # (dim, role, size, kind), least first
    last = len(shape) - 1
    order.append((last, "vec", vec, LOCAL))
    for d in reversed(range(len(shape))):
        order.append((d, "thr", per_dim[d][0], THREAD))
        order.append((d, "rep", per_dim[d][1], LOCAL))
    order.append((-1, "rep", left, THREAD))
    factors = _radix([(size, kind) for _, _, size, kind in order])
    by_role = {(d, role): f for (d, role, _, _), f in zip(order, factors)}
    dims = []
    for d in range(len(shape)):
        fs = [by_role[(d, "rep")], by_role[(d, "thr")]]
        if d == last:
            fs.append(by_role[(d, "vec")])
        dims.append(tuple(fs))
    threads_text = "x".join(str(t) for t, _ in per_dim)
    return Layout(shape, tuple(dims), (by_role[(-1, "rep")],), threads,
                  f"blocked(vec {vec}, threads {threads_text})")


def replicated(shape: Sequence[int], threads: int) -> Layout:
    """Every thread holds the whole tile, row-major in its local array."""
    shape = tuple(int(n) for n in shape)
    factors = _radix([(n, LOCAL) for n in reversed(shape)] + [(threads, THREAD)])
    dims = tuple((f,) for f in reversed(factors[:len(shape)]))
    return Layout(shape, dims, (factors[-1],), threads, "replicated")


def mma_accumulator(shape: Sequence[int], warps: tuple[int, int], threads: int | None = None,
                    instr: str = "m16n8k16") -> Layout:
    """The accumulator of ``mma.sync`` m16n8 (f32 C/D, docs/ptx_facts.md's table) over a ``wm x wn``
    grid of warps numbered row-major (warp ``w`` is at row ``w // wn``, column ``w % wn``).

    Warp ``(i, j)`` owns rows ``[i*M/wm, (i+1)*M/wm)`` and columns ``[j*N/wn, ...)`` of the
    tile and covers them with m16n8 atoms. For lane ``L`` (``g = L >> 2``, ``t = L % 4``), slot
    ``((mi * NI + ni) * 4 + c)`` holds atom ``(mi, ni)``'s element ``c``: row ``16 mi + g``
    (``+ 8`` for ``c >= 2``), column ``8 ni + 2 t + (c & 1)``. Threads beyond ``32*wm*wn``
    replicate."""
    m, n = (int(x) for x in shape)
    wm, wn = warps
    threads = 32 * wm * wn if threads is None else threads
    if m % (16 * wm) or n % (8 * wn):
        raise ValueError(f"accumulator {m}x{n} does not split into m16n8 atoms over "
                         f"{wm}x{wn} warps")
    mi, ni = m // (16 * wm), n // (8 * wn)
    if threads % (32 * wm * wn):
        raise ValueError(f"{threads} threads are not a multiple of {wm}x{wn} warps")
    c_col = Factor(2, LOCAL, 1)
    c_row = Factor(2, LOCAL, 2)
    l_ni = Factor(ni, LOCAL, 4)
    l_mi = Factor(mi, LOCAL, 4 * ni)
    t_t = Factor(4, THREAD, 1)
    t_g = Factor(8, THREAD, 4)
    w_n = Factor(wn, THREAD, 32)
    w_m = Factor(wm, THREAD, 32 * wn)
    rep = Factor(threads // (32 * wm * wn), THREAD, 32 * wm * wn)
    dims = ((w_m, l_mi, c_row, t_g), (w_n, l_ni, t_t, c_col))
    return Layout((m, n), dims, (rep,), threads, f"mma({instr}, warps {wm}x{wn})")


def mfma_accumulator(shape: Sequence[int], warps: tuple[int, int], threads: int | None = None,
                     instr: str = "32x32x8") -> Layout:
    """The f32 accumulator of AMD's MFMA ``SxSxK`` (``instr``, S = 16 or 32) as tile_gemm.h's
    gemm_mfma uses it, over a ``wm x wn`` grid of 64-lane waves numbered row-major.

    gemm_mfma computes ``C^T = op(B)^T op(A)^T`` (the instruction's A operand is a column of
    B, its B operand a row of A), so its D registers hold the transpose of the instruction's
    own accumulator layout (:mod:`..hip.mfma`; tests check the two agree): each lane holds
    one row of C and runs of 4 consecutive columns, which is also how the instruction wants
    a register A operand (``P @ V`` in attention) and allows 16-byte stores. Wave ``(i, j)``
    owns rows ``[i*M/wm, ...)`` and columns ``[j*N/wn, ...)``, covered by ``S x S`` tiles;
    for lane ``L`` slot ``(mi * NI + ni) * S*S/64 + r`` holds tile ``(mi, ni)``'s row
    ``L % S``, column ``8 (r / 4) + 4 (L / S) + r % 4``. Threads beyond ``64*wm*wn``
    replicate."""
    m, n = (int(x) for x in shape)
    wm, wn = warps
    size = int(instr.split("x")[0])
    if size not in (16, 32):
        raise ValueError(f"no MFMA accumulator layout for {instr}")
    wave = 64
    threads = wave * wm * wn if threads is None else threads
    if m % (size * wm) or n % (size * wn):
        raise ValueError(f"accumulator {m}x{n} does not split into {size}x{size} MFMA tiles "
                         f"over {wm}x{wn} waves")
    if threads % (wave * wm * wn):
        raise ValueError(f"{threads} threads are not a multiple of {wm}x{wn} waves")
    mi, ni = m // (size * wm), n // (size * wn)
    regs = size * size // wave
    rows = (Factor(wm, THREAD, wave * wn), Factor(mi, LOCAL, regs * ni), Factor(size, THREAD, 1))
    cols = (Factor(wn, THREAD, wave), Factor(ni, LOCAL, regs), Factor(regs // 4, LOCAL, 4),
            Factor(wave // size, THREAD, size), Factor(4, LOCAL, 1))
    rep = Factor(threads // (wave * wm * wn), THREAD, wave * wm * wn)
    return Layout((m, n), (rows, cols), (rep,), threads, f"mfma({instr}, warps {wm}x{wn})")


def wgmma_accumulator(shape: Sequence[int], warpgroups: tuple[int, int],
                      threads: int | None = None, k: int = 16) -> Layout:
    """The f32 accumulator of ``wgmma.m64nNkK`` (docs/ptx_facts.md) over a ``gm x gn`` grid of
    warpgroups (128 threads each) numbered row-major; ``k`` (16 for f16/bf16, 8 for tf32, 32
    for FP8) only names the instruction in the label: the accumulator layout is the same.

    Warpgroup ``(i, j)`` owns rows ``[i*M/gm, ...)`` and columns ``[j*N/gn, ...)`` and covers
    them with ``M / (64 gm)`` instructions of ``N' = N / gn`` columns stacked along M. Unlike
    ``mma_accumulator``, a warp's rows are not contiguous: warp ``w`` of the warpgroup holds
    rows ``64 mi + 16 w + ...`` of instruction ``mi``. For thread ``T`` of the warpgroup
    (``w = T / 32``, ``g = (T % 32) / 4``, ``t = T % 4``), slot ``mi * N'/2 + i`` holds
    instruction ``mi``'s register ``i``: row ``16 w + g + 8 ((i >> 1) & 1)``, column
    ``8 (i >> 2) + 2 t + (i & 1)``. Threads beyond ``128 gm gn`` replicate."""
    m, n = (int(x) for x in shape)
    gm, gn = warpgroups
    threads = 128 * gm * gn if threads is None else threads
    if m % (64 * gm) or n % (8 * gn):
        raise ValueError(f"accumulator {m}x{n} does not split into m64n8 steps over "
                         f"{gm}x{gn} warpgroups")
    if threads % (128 * gm * gn):
        raise ValueError(f"{threads} threads are not a multiple of {gm}x{gn} warpgroups")
    mi, ncols = m // (64 * gm), n // gn
    rows = (Factor(gm, THREAD, 128 * gn), Factor(mi, LOCAL, ncols // 2), Factor(4, THREAD, 32),
            Factor(2, LOCAL, 2), Factor(8, THREAD, 4))
    cols = (Factor(gn, THREAD, 128), Factor(ncols // 8, LOCAL, 4), Factor(4, THREAD, 1),
            Factor(2, LOCAL, 1))
    rep = Factor(threads // (128 * gm * gn), THREAD, 128 * gm * gn)
    return Layout((m, n), (rows, cols), (rep,), threads,
                  f"wgmma(m64n{ncols}k{k}, warpgroups {gm}x{gn})")


# -- parsing the printed form ---------------------------------------------------------------

_FACTOR = re.compile(r"(\d+)([tl])(\d+)")


def _parse_factors(text: str) -> list[Factor]:
    return [Factor(int(s), THREAD if k == "t" else LOCAL, int(st))
            for s, k, st in _FACTOR.findall(text)]


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def parse(text: str, shape: Sequence[int], threads: int) -> Layout:
    """The layout ``text`` (as :meth:`Layout.text` prints it, ``#`` optional) of a tile of
    ``shape`` in a block of ``threads`` threads."""
    text = text.strip().removeprefix("#")
    shape = tuple(int(n) for n in shape)
    head, _, rest = text.partition("(")
    args = _split_top(rest[:-1]) if rest else []
    if head == "replicated":
        return replicated(shape, threads)
    if head == "blocked":
        return blocked(shape, threads, int(args[0].split()[1]))
    if head == "mma":
        wm, wn = (int(x) for x in args[1].split()[1].split("x"))
        return mma_accumulator(shape, (wm, wn), threads, args[0])
    if head == "mfma":
        wm, wn = (int(x) for x in args[1].split()[1].split("x"))
        return mfma_accumulator(shape, (wm, wn), threads, args[0])
    if head == "wgmma":
        gm, gn = (int(x) for x in args[1].split()[1].split("x"))
        return wgmma_accumulator(shape, (gm, gn), threads, int(args[0].rsplit("k", 1)[1]))
    if head == "slice":
        keepdims = args[-1] == "keepdims"
        args = args[:-1] if keepdims else args
        parent_shape = tuple(int(x) for x in re.findall(r"\d+", args[-2]))
        axes = tuple(int(x) for x in re.findall(r"\d+", args[-1]))
        inner = ", ".join(args[:-2])
        return parse(inner, parent_shape, threads).drop(axes, keepdims)
    if head == "transpose":
        parent_shape = tuple(int(x) for x in re.findall(r"\d+", args[-2]))
        perm = tuple(int(x) for x in re.findall(r"\d+", args[-1]))
        inner = ", ".join(args[:-2])
        return parse(inner, parent_shape, threads).permute(perm)
    if head == "factors":
        body, _, rep = rest[:-1].partition("|")
        dims = tuple(tuple(_parse_factors(d)) for d in body.split(";")) if shape else ()
        return Layout(shape, dims, tuple(_parse_factors(rep)), threads)
    raise ValueError(f"unknown layout {text!r}")
