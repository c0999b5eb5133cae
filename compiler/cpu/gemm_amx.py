"""``C += op(A) @ op(B)`` for bfloat16 ``A`` and ``B`` into a float32 ``C`` with AMX tiles
(``tdpbf16ps``), on targets whose capabilities say so (``CpuCaps.amx_bf16``: Sapphire
Rapids and later Xeons); :mod:`.gemm_bf16` hands such GEMMs here.

AMX has eight tile registers of up to 16 rows of 64 bytes, shaped by a 64-byte tile
configuration (``ldtilecfg``, palette 1). Every tile here is 16 rows of 64 bytes: a tile
of ``C`` is 16 x 16 float32, a tile of ``A`` 16 rows by 16 pairs of bfloat16 along K
(32 values of K), a tile of ``B`` 16 pairs of K by 16 columns, each 32-bit element
holding ``(B[2p, j], B[2p+1, j])`` (the "VNNI" layout ``tdpbf16ps`` reads, lower half the
even element). One ``tdpbf16ps`` adds a 16 x 32 by 32 x 16 product into a tile of ``C``.

The operands are first re-laid into local panels of 32-bit pairs padded with zeros to
whole tiles (``M`` and ``N`` to multiples of 16, ``K`` to a multiple of 32), and ``C``
into a padded float32 panel, so every tile operation is the same full 16 x 64-byte one and
no edge needs a configuration of its own: a padded ``K`` pairs zeros with zeros (0 x 0,
never an infinity), padded rows and columns of ``C`` are computed and dropped. The
re-layout reads each element once against ``m * n * k`` multiply-adds. ``C`` is then
computed in blocks of 2 x 2 tiles (tiles 0-3), with two tiles of ``A`` (4, 5) and two of
``B`` (6, 7) per step of 32 along K; a last row or column of single tiles takes blocks of
1 x 2, 2 x 1 or 1 x 1. The tiles are released (``tilerelease``) before the GEMM ends, so
no other code, and no context switch, sees tile state.

Before a process's first AMX instruction Linux must grant it the tile data state
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``): the FFI library asks (``ffi/cpu/host_cpu.cc``), and
without it the host's flags lose AMX (:func:`..target.host_isa`). Before the first AMX
GEMM a process compiles for its own CPU, :func:`enabled` asks whether a small GEMM through
this kernel agrees with numpy (:func:`self_check`, run once per machine in a child process
so that a fault cannot kill the caller, the child asking for the tile data state itself,
its answer kept in the build cache:
:func:`verdict`); a mismatch or a fault disables AMX with a warning, and the bfloat16 GEMMs
use ``vdpbf16ps``.

Emulation (test-only, ``CpuCaps.amx_emulated``): every tile operation is emitted as plain
TIR loops implementing its definition in Intel's SDM on a local array standing for the
tile registers, reading the same configuration bytes, so the very same kernel (its
configuration, addresses, strides, re-layout and padding) runs on a CPU without AMX.
What was implemented, from the SDM's text for ``TDPBF16PS`` (Vol. 2, as published on
felixcloutier.com; the stored excerpt ends inside the loop, the rest is the SDM as
recalled, see ``docs/design.md``): per row ``m`` and column ``n`` two float32 partial
sums, one of the even and one of the odd products of the 16 pairs, each step a float32
FMA rounding to nearest even; then the two sums are added and that is added to ``C``;
input subnormals count as zero and subnormal results are flushed (DAZ, FTZ) whatever
MXCSR says. ``tileloadd`` reads ``rows`` rows of ``colsb`` bytes ``stride`` bytes apart
and zeroes the rest of the tile; ``tilestored`` writes ``rows`` x ``colsb`` bytes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from tvm import tirx
from tvm.ir import Expr

from ..target import CpuCaps, amx_permitted
from .copy_reuse import Relayout, relaid_array, relaying

ROWS = 16
"""Rows of every tile (palette 1's maximum)."""
WORDS = 16
"""32-bit elements of a tile row: 64 bytes, palette 1's maximum."""
C_TILES = (0, 1, 2, 3)
A_TILES = (4, 5)
B_TILES = (6, 7)
CONFIG_BYTES = 64


def enabled(caps: CpuCaps) -> bool:
    """Whether bfloat16 GEMMs for ``caps`` use AMX tiles: the capability says so and, for
    the host's own CPU, :func:`self_check` passed (:func:`verdict`; code for a named CPU,
    ``cpu:sapphirerapids``, cannot run here, so nothing can be checked before it is
    built)."""
    if not getattr(caps, "amx_bf16", False):
        return False
    if caps.amx_emulated or caps.level != "host":
        return True
    return _native_checked(caps)


@functools.cache
def _native_checked(caps: CpuCaps) -> bool:
    problem = verdict(caps)
    if problem is not None:
        warnings.warn(f"jaxtile: AMX disabled for this process: its self-check failed "
                      f"({problem}); bfloat16 GEMMs use AVX512-BF16", RuntimeWarning,
                      stacklevel=3)
    return problem is None


SELF_CHECK_SECONDS = 300
"""How long the self-check's child process may take (it imports TVM and compiles one
kernel: a few seconds) before it counts as failed."""


def verdict(caps: CpuCaps) -> str | None:
    """:func:`self_check`'s answer for the host CPU ``caps`` describes (None: AMX works;
    emulated where ``caps.amx_emulated``). It runs in a child process, so that a fault of
    the AMX code (an illegal instruction, a bad tile address) kills the child and not the
    caller, and the answer is kept in the build cache (``amx-self-check-<key>.json``, the
    key covering the CPU backend's sources and ``caps``: the CPU's model and flags): it is
    found once per machine and compiler version (an unwritable cache: once per process),
    and every later process, and a kernel loaded from the cache, rests on the same
    answer."""
    from .. import cache

    key = cache.content_key("amx-self-check", _lowering_digest(), repr(caps))
    path = cache.cache_dir() / f"amx-self-check-{key[:32]}.json"
    try:
        return json.loads(path.read_text())["problem"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    problem = _in_child(caps.amx_emulated)
    cache.store_record(path, {"problem": problem})
    return problem


def _lowering_digest() -> str:
    """A digest of the sources the self-check's kernel comes from: the CPU backend and the
    target capabilities (the driver's ``compiler_version`` lies above this tier)."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in [*sorted(here.glob("*.py")), here.parent / "target.py"]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_CHILD = ("import json; from jaxtile.compiler.cpu import gemm_amx; "
          "print(json.dumps(gemm_amx.self_check(emulated={emulated})))")
"""The child's program: prints the self-check's answer as JSON on its last line."""


def _in_child(emulated: bool) -> str | None:
    """:func:`self_check` run by a fresh Python process; what went wrong if the child did
    not answer (a signal, a timeout, an exception)."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD.format(emulated=emulated)],
                              capture_output=True, text=True,
                              timeout=SELF_CHECK_SECONDS)
    except subprocess.TimeoutExpired:
        return f"the self-check process took more than {SELF_CHECK_SECONDS} s"
    except OSError as e:
        return f"the self-check process could not start ({e})"
    if done.returncode < 0:
        return f"the self-check process died of signal {-done.returncode}"
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the self-check process failed (exit {done.returncode}: {tail})"
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return f"the self-check process answered {lines[-1]!r}"
    return answer if answer is None else str(answer)


def lower_gemm_amx(kb, name: Callable[[str], str], caps: CpuCaps, A: tirx.Buffer,
                   B: tirx.Buffer, C: tirx.Buffer, *, transpose_a: bool,
                   transpose_b: bool, kept: Mapping[str, Relayout] | None = None,
                   a_read: Callable[[Expr, Expr], Expr] | None = None,
                   a_rows: Rows | None = None) -> None:
    """Emit ``C += op(A) @ op(B)`` with ``kb`` (a :class:`.tir_emit.KernelBuilder`) for whole
    local buffers ``A``, ``B`` (bfloat16) and ``C`` (float32) with static shapes; ``name``
    makes fresh names. An operand named in ``kept`` (``"a"``, ``"b"``) is re-laid into its
    :class:`.copy_reuse.Relayout`'s array only while that is stale. ``a_read(i, kk)``, where
    given, is ``op(A)[i, kk]`` (as float32) read from elsewhere: ``A`` is then never read;
    ``a_rows``, where given too, says where those elements lie as rows of bfloat16 (the
    same elements, all inside their buffer): where ``A`` is whole tiles (``M`` a multiple
    of 16, ``K`` of 32) its tiles are loaded from there, with no re-layout at all. Tile
    operations are native instructions, or their emulation where ``caps.amx_emulated``."""
    kept = kept or {}
    m, n = (int(d) for d in C.shape)
    k = int(A.shape[0] if transpose_a else A.shape[1])
    mp, np_ = _up(m, ROWS), _up(n, WORDS)
    kp = _up(k, 2 * WORDS) // 2            # pairs of K, whole tiles of them
    cfg = kb.alloc_local(name("amx_cfg"), (CONFIG_BYTES,), "uint8")
    tiles = (_Emulated if caps.amx_emulated else _Native)(kb, name, cfg)

    def a_at(i: Expr, kk: Expr) -> Expr:
        if a_read is not None:
            return a_read(i, kk)
        return A[kk, i] if transpose_a else A[i, kk]

    def b_at(kk: Expr, j: Expr) -> Expr:
        return B[j, kk] if transpose_b else B[kk, j]

    if a_rows is not None and (mp, 2 * kp) == (m, k):
        a_panel: _Panel = a_rows
    else:
        ap = relaid_array(kb, name, kept.get("a"), "amx_a", (mp * kp,), "int32")
        with relaying(kb, kept.get("a")):
            _pack_a(kb, name, ap, (m, k), (mp, kp), a_at)
        a_panel = _Local(kb, ap, kp)
    bp = relaid_array(kb, name, kept.get("b"), "amx_b", (kp * np_,), "int32")
    with relaying(kb, kept.get("b")):
        _pack_b(kb, name, bp, (k, n), (kp, np_), b_at)
    cp = kb.alloc_local(name("amx_c"), (mp * np_,), "float32")
    with kb.loop(name("i"), mp) as i, kb.loop(name("j"), np_) as j:
        inside = tirx.all(i < m, j < n)
        kb.store(cp, [i * np_ + j], tirx.if_then_else(inside, C[i, j],
                                                      tirx.const(0.0, "float32")))

    _configure(kb, cfg)
    tiles.configure()
    panels = (a_panel, _Local(kb, bp, np_), _Local(kb, cp, np_))
    _blocks(kb, name, mp, lambda i0, rows: _blocks(
        kb, name, np_, lambda j0, cols: _block(kb, name, tiles, panels, (i0, j0),
                                               (rows, cols), kp)))
    tiles.release()

    with kb.loop(name("i"), m) as i, kb.loop(name("j"), n) as j:
        kb.store(C, [i, j], cp[i * np_ + j])


class _Panel:
    """Rows of 32-bit words that tiles are loaded from (and stored to): word ``w`` of row
    ``r`` is :meth:`word` (for the emulation) at :meth:`address` (for the instructions),
    rows :attr:`pitch` bytes apart."""

    pitch: Expr | int

    def address(self, r: Expr, w: Expr) -> Expr:
        raise NotImplementedError

    def word(self, r: Expr, w: Expr) -> Expr:
        """The word as int32."""
        raise NotImplementedError

    def store_word(self, r: Expr, w: Expr, value: Expr) -> None:
        raise NotImplementedError


class _Local(_Panel):
    """A local array of 32-bit elements, ``words`` to a row."""

    def __init__(self, kb, buf: tirx.Buffer, words: int):
        self.kb, self.buf, self.words, self.pitch = kb, buf, words, 4 * words

    def address(self, r: Expr, w: Expr) -> Expr:
        return tirx.address_of(self.buf[r * self.words + w])

    def word(self, r: Expr, w: Expr) -> Expr:
        x = self.buf[r * self.words + w]
        return x if str(self.buf.dtype) == "int32" else tirx.reinterpret("int32", x)

    def store_word(self, r: Expr, w: Expr, value: Expr) -> None:
        dtype = str(self.buf.dtype)
        self.kb.store(self.buf, [r * self.words + w],
                      value if dtype == "int32" else tirx.reinterpret(dtype, value))


class Rows(_Panel):
    """Rows of bfloat16 where ``op(A)`` lies (its element ``(i, kk)`` is ``buffer[row + i,
    col + kk]``, a 2-D buffer), each pair of K one 32-bit word of ``A``'s tiles: the layout
    ``tdpbf16ps`` reads, so the tiles load straight from there."""

    def __init__(self, buffer: tirx.Buffer, row: Expr, col: Expr):
        self.buffer, self.row, self.col = buffer, row, col
        self.pitch = buffer.shape[1] * 2

    def address(self, r: Expr, w: Expr) -> Expr:
        return tirx.address_of(self.buffer[self.row + r, self.col + 2 * w])

    def word(self, r: Expr, w: Expr) -> Expr:
        lo = self.buffer[self.row + r, self.col + 2 * w]
        hi = self.buffer[self.row + r, self.col + 2 * w + 1]
        return _pair(_bits(lo), _bits(hi))

    def store_word(self, r: Expr, w: Expr, value: Expr) -> None:
        raise AssertionError("A's rows are never stored to")


def _up(x: int, step: int) -> int:
    return max(step, -(-x // step) * step)


def _configure(kb, cfg: tirx.Buffer) -> None:
    """The 64-byte tile configuration (SDM Vol. 1, "Tile Configuration"): byte 0 the
    palette (1), byte 1 ``start_row`` (0), bytes 16-31 ``colsb`` of tiles 0-7 (16-bit,
    little-endian), bytes 48-55 ``rows`` of tiles 0-7; everything else zero."""
    with kb.loop("cfg_byte", CONFIG_BYTES) as b:
        kb.store(cfg, [b], tirx.const(0, "uint8"))
    kb.store(cfg, [0], tirx.const(1, "uint8"))
    for t in range(8):
        kb.store(cfg, [16 + 2 * t], tirx.const(WORDS * 4, "uint8"))
        kb.store(cfg, [48 + t], tirx.const(ROWS, "uint8"))


def _blocks(kb, name, extent: int, body: Callable[[Expr, int], None]) -> None:
    """``body(origin, tiles)`` for the blocks along a padded dimension of ``extent``: a
    loop over blocks of two tiles, then one tile if one is left."""
    pairs, single = divmod(extent // ROWS, 2)
    if pairs:
        with kb.loop(name("blk"), pairs) as b:
            body(b * (2 * ROWS), 2)
    if single:
        body(tirx.const(extent - ROWS, "int32"), 1)


def _block(kb, name, tiles, panels, origin, shape, kp: int) -> None:
    """``rows x cols`` tiles of ``C`` at ``origin`` (element row and column of the padded
    panel): loaded, K in steps of 32 (one tile of pairs), stored. ``panels``: ``A`` (rows
    of M, words of K pairs), ``B`` (rows of K pairs, words of N), ``C`` (rows of M, words
    of N)."""
    ap, bp, cp = panels
    (i0, j0), (rows, cols) = origin, shape
    for r in range(rows):
        for c in range(cols):
            tiles.load(C_TILES[2 * r + c], cp, i0 + ROWS * r, j0 + WORDS * c)
    with kb.loop(name("kt"), kp // WORDS) as kt:
        for r in range(rows):
            tiles.load(A_TILES[r], ap, i0 + ROWS * r, kt * WORDS)
        for c in range(cols):
            tiles.load(B_TILES[c], bp, kt * ROWS, j0 + WORDS * c)
        for r in range(rows):
            for c in range(cols):
                tiles.dot(C_TILES[2 * r + c], A_TILES[r], B_TILES[c])
    for r in range(rows):
        for c in range(cols):
            tiles.store(C_TILES[2 * r + c], cp, i0 + ROWS * r, j0 + WORDS * c)


def _pair(lo: Expr, hi: Expr) -> Expr:
    """Two bfloat16 values (their float32 bits) as one int32, ``lo`` in the lower half."""
    return tirx.reinterpret("int32", tirx.bitwise_or(
        hi, tirx.shift_right(lo, tirx.const(16, "uint32"))))


def _bits(x: Expr) -> Expr:
    """The bits of bfloat16 ``x`` in the upper half of a uint32 (its exact float32 widening)."""
    return tirx.reinterpret("uint32", tirx.Cast("float32", x))


def _element(at, inside: Expr, r: Expr, c: Expr) -> Expr:
    """``at(r, c)``'s bits where ``inside``, else zero, the operand read only where
    ``inside``: ``if_then_else`` evaluates one branch. (A ``Select`` of a read at indices
    clamped with ``min`` reads out of bounds: TVM 0.27 drops the ``min`` under the
    ``Select``'s condition (``Select(i < 24, A[min(i, 23)], 0)`` loads ``A[i]`` for every
    ``i``), and both branches are evaluated; on stack arrays LLVM -O3 proved the read
    undefined and compiled the kernel to an endless loop.)"""
    return tirx.if_then_else(inside, _bits(at(r, c)), tirx.const(0, "uint32"))


def _pack_a(kb, name, ap: tirx.Buffer, mk: tuple[int, int], padded: tuple[int, int],
            a_at) -> None:
    """``ap[i * kp + q]`` = ``(A[i, 2q], A[i, 2q + 1])``, zero past ``m`` and ``k``."""
    (m, k), (mp, kp) = mk, padded
    with kb.loop(name("i"), mp) as i, kb.loop(name("q"), kp) as q:
        lo = _element(a_at, tirx.all(i < m, 2 * q < k), i, 2 * q)
        hi = _element(a_at, tirx.all(i < m, 2 * q + 1 < k), i, 2 * q + 1)
        kb.store(ap, [i * kp + q], _pair(lo, hi))


def _pack_b(kb, name, bp: tirx.Buffer, kn: tuple[int, int], padded: tuple[int, int],
            b_at) -> None:
    """The VNNI re-layout: ``bp[q * np + j]`` = ``(B[2q, j], B[2q + 1, j])``, zero past
    ``k`` and ``n``."""
    (k, n), (kp, np_) = kn, padded
    with kb.loop(name("q"), kp) as q, kb.loop(name("j"), np_) as j:
        lo = _element(b_at, tirx.all(2 * q < k, j < n), 2 * q, j)
        hi = _element(b_at, tirx.all(2 * q + 1 < k, j < n), 2 * q + 1, j)
        kb.store(bp, [q * np_ + j], _pair(lo, hi))


class _Native:
    """The tile operations as LLVM's AMX intrinsics (the forms with tile numbers as
    immediates, whose configuration is the program's own ``ldtilecfg``)."""

    def __init__(self, kb, name, cfg: tirx.Buffer):
        self.kb, self.cfg = kb, cfg

    def _call(self, intrinsic: str, *args: Expr) -> None:
        self.kb.emit(tirx.Evaluate(tirx.call_llvm_intrin("void", intrinsic, *args)))

    def configure(self) -> None:
        self._call("llvm.x86.ldtilecfg", tirx.address_of(self.cfg[0]))

    def load(self, tile: int, panel: _Panel, r: Expr, w: Expr) -> None:
        self._call("llvm.x86.tileloadd64", tirx.const(tile, "int8"), panel.address(r, w),
                   _int64(panel.pitch))

    def dot(self, dst: int, a: int, b: int) -> None:
        self._call("llvm.x86.tdpbf16ps", *(tirx.const(t, "int8") for t in (dst, a, b)))

    def store(self, tile: int, panel: _Panel, r: Expr, w: Expr) -> None:
        self._call("llvm.x86.tilestored64", tirx.const(tile, "int8"), panel.address(r, w),
                   _int64(panel.pitch))

    def release(self) -> None:
        self._call("llvm.x86.tilerelease")


_EXP = 0x7F800000
_SIGN = 0x80000000


class _Emulated:
    """The tile operations as TIR loops on a local ``8 x 16 x 16`` array of 32-bit words
    (the tile registers), shaped by the configuration bytes at run time as the hardware
    is (see the module docs for the semantics)."""

    def __init__(self, kb, name, cfg: tirx.Buffer):
        self.kb, self.name, self.cfg = kb, name, cfg
        self.tmm = kb.alloc_local(name("tmm"), (8, ROWS, WORDS), "int32")
        self.sums = kb.alloc_local(name("tmm_sums"), (2,), "float32")

    def _rows(self, tile: int) -> Expr:
        return tirx.Cast("int32", self.cfg[48 + tile])

    def _words(self, tile: int) -> Expr:
        colsb = tirx.Cast("int32", self.cfg[16 + 2 * tile]) + \
            tirx.Cast("int32", self.cfg[17 + 2 * tile]) * 256
        return colsb // 4

    def configure(self) -> None:
        """``ldtilecfg`` also zeroes every tile."""
        kb = self.kb
        with kb.loop(self.name("t"), 8) as t, kb.loop(self.name("r"), ROWS) as r, \
                kb.loop(self.name("w"), WORDS) as w:
            kb.store(self.tmm, [t, r, w], tirx.const(0, "int32"))

    def load(self, tile: int, panel: _Panel, r0: Expr, w0: Expr) -> None:
        kb = self.kb
        with kb.loop(self.name("r"), ROWS) as r, kb.loop(self.name("w"), WORDS) as w:
            with kb.if_(tirx.all(r < self._rows(tile), w < self._words(tile))):
                kb.store(self.tmm, [tile, r, w], panel.word(r0 + r, w0 + w))
            with kb.else_():
                kb.store(self.tmm, [tile, r, w], tirx.const(0, "int32"))

    def store(self, tile: int, panel: _Panel, r0: Expr, w0: Expr) -> None:
        kb = self.kb
        with kb.loop(self.name("r"), ROWS) as r, kb.loop(self.name("w"), WORDS) as w:
            with kb.if_(tirx.all(r < self._rows(tile), w < self._words(tile))):
                panel.store_word(r0 + r, w0 + w, self.tmm[tile, r, w])

    def dot(self, dst: int, a: int, b: int) -> None:
        kb, tmm, sums = self.kb, self.tmm, self.sums
        with kb.loop(self.name("m"), ROWS) as m, kb.loop(self.name("n"), WORDS) as n:
            with kb.if_(tirx.all(m < self._rows(dst), n < self._words(dst))):
                kb.store(sums, [0], tirx.const(0.0, "float32"))
                kb.store(sums, [1], tirx.const(0.0, "float32"))
                with kb.loop(self.name("k"), WORDS) as kk:
                    with kb.if_(kk < self._words(a)):
                        x = tirx.reinterpret("uint32", tmm[a, m, kk])
                        y = tirx.reinterpret("uint32", tmm[b, kk, n])
                        for half in (0, 1):
                            kb.store(sums, [half], _ftz(_fma(_daz(_half(x, half)),
                                                             _daz(_half(y, half)),
                                                             sums[half])))
                total = _ftz(sums[0] + sums[1])
                acc = _daz(tirx.reinterpret("uint32", tmm[dst, m, n]))
                kb.store(tmm, [dst, m, n], tirx.reinterpret("int32", _ftz(acc + total)))
            with kb.else_():
                kb.store(tmm, [dst, m, n], tirx.const(0, "int32"))

    def release(self) -> None:
        """``tilerelease`` returns the tiles to their initial state: nothing a program can
        read afterwards, so nothing to emulate."""


def _int64(x: Expr | int) -> Expr:
    return tirx.const(x, "int64") if isinstance(x, int) else tirx.Cast("int64", x)


def _half(word: Expr, half: int) -> Expr:
    """bfloat16 number ``half`` (0: the lower 16 bits) of a 32-bit word, as float32 bits."""
    if half == 0:
        return tirx.shift_left(word, tirx.const(16, "uint32"))
    return tirx.bitwise_and(word, tirx.const(0xFFFF0000, "uint32"))


def _daz(bits: Expr) -> Expr:
    """float32 ``bits`` as a float32 value, a subnormal as zero of its sign."""
    subnormal = tirx.bitwise_and(bits, tirx.const(_EXP, "uint32")) == tirx.const(0, "uint32")
    flushed = tirx.Select(subnormal, tirx.bitwise_and(bits, tirx.const(_SIGN, "uint32")), bits)
    return tirx.reinterpret("float32", flushed)


def _ftz(x: Expr) -> Expr:
    """float32 ``x`` with a subnormal result flushed to zero of its sign."""
    return _daz(tirx.reinterpret("uint32", x))


def _fma(a: Expr, b: Expr, c: Expr) -> Expr:
    """``a * b + c`` rounded once (LLVM's ``fma``, whatever the target's FMA units)."""
    return tirx.call_llvm_pure_intrin("float32", "llvm.fma", a, b, c)


def self_check(*, emulated: bool) -> str | None:
    """Run two small GEMMs through this kernel and compare them with numpy; None if they
    agree, else what differed: bfloat16 ``37 x 70`` by ``70 x 45`` (ragged in every
    dimension, one block of 2 x 2 tiles and single ones, three steps of K, a transposed B,
    A re-laid), and ``32 x 64`` by ``64 x 45`` with A's tiles loaded from its rows
    (:class:`Rows`).

    Two products: one of small integers, whose sums every order of addition computes
    exactly, so the result must be bitwise numpy's (this catches a wrong layout, stride,
    pairing or configuration whatever the instruction's rounding); one of random values,
    within the error bound of K float32 additions (``K * 2**-24 * sum |a_ik b_kj|``)."""

    # Linux grants the tile data state per process, and the child running this has not
    # asked yet (nothing it imports does): without it the first tile instruction is an
    # illegal instruction.
    if not emulated and not amx_permitted():
        return "Linux did not grant this process the AMX tile data state"
    rng = np.random.default_rng(20)
    for (m, k, n), direct in (((37, 70, 45), False), ((32, 64, 45), True)):
        problem = _check_one(_self_check_kernel(m, k, n, emulated, direct), (m, k, n), rng)
        if problem is not None:
            return f"{m} x {k} x {n}{', A from its rows' if direct else ''}: {problem}"
    return None


def _check_one(run, mkn: tuple[int, int, int], rng) -> str | None:
    """:func:`self_check`'s comparisons for one kernel ``run`` of shape ``mkn``."""
    import ml_dtypes

    m, k, n = mkn
    cases = (("integers", rng.integers(-8, 9, (m, k)), rng.integers(-8, 9, (n, k))),
             ("random", rng.standard_normal((m, k)), rng.standard_normal((n, k))))
    for label, a, bt in cases:
        a16, bt16 = a.astype(ml_dtypes.bfloat16), bt.astype(ml_dtypes.bfloat16)
        c0 = rng.integers(-4, 5, (m, n)).astype(np.float32)
        got = run(a16, bt16, c0)
        a64, b64 = a16.astype(np.float64), bt16.astype(np.float64).T
        want = c0 + a64 @ b64
        if label == "integers":
            if not np.array_equal(got, want.astype(np.float32)):
                bad = np.argwhere(got != want)[0].tolist()
                return f"{label}: C{bad} is {got[tuple(bad)]}, numpy {want[tuple(bad)]}"
        else:
            bound = k * 2.0 ** -24 * (np.abs(c0) + np.abs(a64) @ np.abs(b64))
            if not (np.abs(got - want) <= bound).all():
                bad = np.argwhere(np.abs(got - want) > bound)[0].tolist()
                return f"{label}: C{bad} is {got[tuple(bad)]}, numpy {want[tuple(bad)]}"
    return None


def _self_check_kernel(m: int, k: int, n: int, emulated: bool, direct: bool):
    """The self-check's GEMM compiled for the host: a function of ``(a, b_transposed, c)``
    (numpy arrays) returning the new ``c``; with ``direct``, A's tiles load from its rows."""
    import tvm

    from . import bf16_dot, tir_emit

    kb = tir_emit.KernelBuilder("jaxtile_amx_self_check", [
        ("a", (m, k), "bfloat16"), ("bt", (n, k), "bfloat16"), ("c", (m, n), "float32")])
    a, bt, c = kb.buffers
    names = iter(range(1 << 30))
    caps = CpuCaps("x86_64", ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f"), "", 512,
                   "host", emulated)
    lower_gemm_amx(kb, lambda p: f"{p}{next(names)}", caps, a, bt, c, transpose_a=False,
                   transpose_b=True, a_rows=Rows(a, 0, 0) if direct else None)
    module = bf16_dot.resolve(tir_emit.build(kb.finish(), tir_emit.host_cpu()))

    def run(a16, bt16, c0):
        args = [tvm.runtime.tensor(x) for x in (a16, bt16, c0)]
        module["jaxtile_amx_self_check"](0, 1, *args)
        return args[2].numpy()

    return run
