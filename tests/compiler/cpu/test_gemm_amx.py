"""The AMX-BF16 GEMM (``compiler/cpu/gemm_amx.py``), proven on CPUs without AMX, and run on
its own tiles where the CPU has them (the same checks, bitwise against the model included).

Structurally: a bfloat16 GEMM compiled for ``cpu:sapphirerapids`` has ``ldtilecfg`` before
its tile operations and ``tilerelease`` after them, a float32 GEMM no tile instruction.
Semantically: the same kernel, its tile operations emulated as loops implementing the SDM's
definitions (``CpuCaps.amx_emulated``, on this machine described with AMX's flags), against
(1) a numpy model of ``tdpbf16ps`` written separately here, bitwise, (2) a float64 product
within the error bound of ``tests/jaxtile/test_cpu_gemm_bf16.py``, (3) ``jnp`` in float32
within the same bound, on dividing and ragged shapes, odd and large K, transposes,
NaN/infinities/subnormals, empty operands. Mutations of the kernel (B without its VNNI
re-layout, padding that is not zero, a wrong tile configuration) fail these checks, and the
self-check that guards the native path catches them too.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from described_cpu import describe_host
from gemm_kernels import transposed_matmul

from jaxtile import _ffi
from jaxtile.compiler import build, target
from jaxtile.compiler.cpu import bf16_dot, gemm_amx, lower, tir_emit
from jaxtile.compiler.target import CpuCaps, parse_target

BF16 = np.dtype(ml_dtypes.bfloat16)
TINY = np.float32(2.0 ** -126)
AMX = ("amx_bf16", "amx_tile")
NATIVE_HOST = CpuCaps("x86_64", ("avx512f", "avx512_bf16", *AMX), "model", 512)
EMULATED_HOST = CpuCaps("x86_64", ("avx512f", "avx512_bf16", *AMX), "model", 512, "host", True)
ON_X86 = pytest.mark.skipif(target.platform.machine() not in ("x86_64", "AMD64"),
                            reason="AMX is an x86-64 extension")


def matmul(a, b, *, bm=32, bn=32, bk=64, ta=False, tb=False):
    """The shared transposed GEMM with whole AMX tiles by default."""
    return transposed_matmul(a, b, bm=bm, bn=bn, bk=bk, ta=ta, tb=tb)


@pytest.mark.parametrize("isa, has", [
    (("avx512f", "avx512_bf16", "amx_tile", "amx_bf16"), True),
    (("avx512f", "avx512_bf16", "amx_tile", "amx_int8"), False),   # AMX without BF16
    (("avx512f", "avx512_bf16", "amx_bf16"), False),               # no tiles
    (("avx512f", "amx_tile", "amx_bf16"), False),                  # no AVX512-BF16 path
])
def test_amx_follows_the_isa(isa, has):
    assert CpuCaps("x86_64", isa, "model", 512).amx_bf16 is has


def test_a_named_amx_cpu_is_a_target():
    spr = parse_target("cpu:sapphirerapids")
    assert spr.caps.level == "sapphirerapids" and spr.caps.amx_bf16 and spr.caps.bf16_dot
    assert spr.caps.vector_bits == 512 and not spr.caps.amx_emulated
    assert spr.describe() != parse_target("cpu:x86-64-v4").describe()
    # The test-only field is in the key only when set (the keys of real CPUs kept).
    assert "amx_emulated" not in spr.describe()
    if not set(target.ISA_CPUS["sapphirerapids"]) <= set(target.host_isa()):
        with pytest.raises(ValueError, match="amx_bf16 amx_int8 amx_tile"):
            target.check_isa_level("sapphirerapids")


def _asm(dtype, tgt, cpu):
    x = jnp.zeros((70, 45), dtype)
    y = jnp.zeros((45, 37), dtype)
    kernel = build.lowered_ir(transposed_matmul.lower(x, y, bm=32, bn=48, bk=45).kernel, tgt)
    module = bf16_dot.resolve(tir_emit.build(lower.to_tir(kernel, tgt), cpu, checks=False))
    return module.inspect_source("asm")


def _mnemonics(asm):
    return [line.split()[0] for line in asm.splitlines()
            if line.startswith("\t") and not line.startswith("\t.")]


TILE_OPS = ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease")


def test_sapphirerapids_code_has_the_tile_instructions():
    """A bfloat16 GEMM for Sapphire Rapids: the tile configuration loaded before any tile
    operation, the tiles released after the last; a float32 GEMM has no tile instruction."""
    spr = parse_target("cpu:sapphirerapids")
    ops = _mnemonics(_asm(BF16, spr, "sapphirerapids"))
    tiles = [i for i, op in enumerate(ops) if op.startswith(("tile", "tdp", "ldtile"))]
    assert set(TILE_OPS) <= {ops[i] for i in tiles}
    assert ops[tiles[0]] == "ldtilecfg" and ops[tiles[-1]] == "tilerelease"
    assert ops.count("ldtilecfg") == ops.count("tilerelease") == 1
    assert not [op for op in ops if "vdpbf16ps" in op]          # AMX replaces that path
    f32 = _mnemonics(_asm(np.float32, spr, "sapphirerapids"))
    assert not [op for op in f32 if op.startswith(("tile", "tdp", "ldtile", "sttile"))]
    # An LLVM CPU name that does not imply AMX (a generic one) still compiles (the IR
    # rewrite gives the functions AMX's features; without them LLVM aborts the process).
    assert "tdpbf16ps" in _mnemonics(_asm(BF16, spr, "x86-64-v4"))


@pytest.fixture
def emulated(monkeypatch):
    """This machine described with AMX's flags, its tile operations emulated."""
    describe_host(monkeypatch, add={*AMX, "avx512f", "avx512_bf16"})
    monkeypatch.setattr(target, "AMX_EMULATION", True)
    caps = parse_target("cpu").caps
    assert caps.amx_bf16 and caps.amx_emulated
    return caps


def _host_has_amx() -> bool:
    """Whether this process may run AMX tile instructions natively."""
    return bool(target.platform.machine() in ("x86_64", "AMD64")
                and parse_target("cpu").caps.amx_bf16)


@pytest.fixture(params=["emulated", "native"])
def amx(request, monkeypatch):
    """The AMX kernel emulated (any machine), and on its own tiles where this machine has
    AMX: the same checks, the numpy model of ``tdpbf16ps`` bitwise included, hold for
    both."""
    if request.param == "emulated":
        return request.getfixturevalue("emulated")
    if not _host_has_amx():
        pytest.skip("this CPU has no AMX-BF16 (or Linux refused this process the tile data "
                    "state): the native kernel cannot run here")
    caps = parse_target("cpu").caps
    assert gemm_amx.enabled(caps), "the native self-check failed on a CPU with AMX"
    return caps


def _flush(x):
    return np.where(np.abs(x) < TINY, np.copysign(0, x), x)


def _f32(x):
    """float64 values to float32 (round to nearest even), subnormal results flushed."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _flush(np.asarray(x, np.float64).astype(np.float32))


def _tdpbf16ps_model(a, b):
    """``a @ b`` (float32 operands holding bfloat16 values) as the kernel computes it with
    ``tdpbf16ps``, written from the SDM independently of the TIR emulation: K padded with
    zeros to steps of 32 (one instruction each); per step, for each output, float32 sums of
    the even and of the odd products (each an FMA: the product is exact in float64, so
    rounding the float64 sum once is the FMA's one rounding), then ``c + (even + odd)``;
    subnormal inputs and results are zero. The steps start at multiples of 32 of K when
    every ``jt.gemm`` covers a multiple of 32 of K (``bk``, which the pipeline may merge
    into longer panels) or all of it: the tests choose ``bk`` so."""
    a, b = (_flush(np.asarray(x, np.float64)) for x in (a, b))
    m, k = a.shape
    c = np.zeros((m, b.shape[1]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for p0 in range(0, k, 32):
            ap, bp = a[:, p0:p0 + 32], b[p0:p0 + 32]
            ap = np.pad(ap, ((0, 0), (0, 32 - ap.shape[1])))
            bp = np.pad(bp, ((0, 32 - bp.shape[0]), (0, 0)))
            sums = [np.zeros_like(c), np.zeros_like(c)]
            for q in range(0, 32, 2):
                for half in (0, 1):
                    prod = ap[:, q + half, None] * bp[None, q + half, :]
                    sums[half] = _f32(sums[half] + prod)
            c = _f32(_flush(c.astype(np.float64)) + _f32(sums[0].astype(np.float64) + sums[1]))
    return c


def _check(a, b, bk, **params):
    """Run the kernel; compare it with the model (bitwise), a float64 product and jnp in
    float32 (within K float32 roundings); returns the result."""
    a_op = np.asarray(a).T if params.get("ta") else np.asarray(a)
    b_op = np.asarray(b).T if params.get("tb") else np.asarray(b)
    got = np.asarray(jax.jit(lambda x, y: matmul(x, y, bk=bk, **params))(a, b))
    a32, b32 = a_op.astype(np.float32), b_op.astype(np.float32)
    assert bk % 32 == 0 or bk >= a32.shape[1]
    np.testing.assert_array_equal(got, _tdpbf16ps_model(a32, b32))
    a64, b64 = (_flush(x.astype(np.float64)) for x in (a32, b32))
    k = a64.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        products = a64[:, :, None] * b64[None, :, :]
        exact = products.sum(axis=1)
        bound = k * 2.0 ** -24 * np.abs(products).sum(axis=1) + k * float(TINY)
    xla = np.asarray(jnp.dot(jnp.asarray(a_op), jnp.asarray(b_op),
                             preferred_element_type=jnp.float32))
    finite = np.isfinite(exact) & (np.abs(exact) < 1e38)
    for name, want, slack in (("float64", exact, 1), ("jnp", xla, 2)):
        err = np.abs(got[finite].astype(np.float64) - want[finite])
        assert (err <= slack * bound[finite]).all(), name
    special = ~np.isfinite(exact)
    np.testing.assert_array_equal(got[special], exact[special].astype(np.float32))
    return got


def _bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


@pytest.mark.parametrize("mkn, tiles", [
    ((64, 64, 64), dict(bm=32, bn=32, bk=64)),      # whole 2 x 2 tile blocks, two K steps
    ((37, 29, 45), dict(bm=24, bn=40, bk=29)),      # tiles padded in M, N, K (odd)
    ((20, 1, 70), dict(bm=16, bn=64, bk=1)),        # K = 1
    ((48, 70, 16), dict(bm=48, bn=16, bk=64)),      # 3 x 1 tiles: a pair and a single
], ids=["even", "ragged", "k1", "blocks"])
def test_amx_matches(amx, rng, mkn, tiles):
    m, k, n = mkn
    _check(_bf16(rng, (m, k)), _bf16(rng, (k, n)), **tiles)


def test_amx_transposed_and_large_k(amx, rng):
    a, b = _bf16(rng, (37, 45)), _bf16(rng, (29, 37))     # A is K x M, B is N x K
    _check(a, b, 37, bm=40, bn=24, ta=True, tb=True)
    # Large K: 1200 in panels of 384 (12 steps of 32), the last partial (48 of K).
    _check(_bf16(rng, (20, 1200)), _bf16(rng, (1200, 18)), 384, bm=32, bn=32)


def test_amx_edge_values(amx, rng):
    """NaN, infinities (times positive, negative and zero), huge sums that stay finite,
    subnormal products and inputs (flushed), and an empty K (no gemm runs: zeros)."""
    m, k, n = 12, 24, 20
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a[0, 3] = np.nan
    a[1, :] = 0.5
    a[1, 5] = np.inf
    b[5, :] = np.tile([2.0, -3.0, 0.0, 1.0], n // 4)
    a[2, :] = 0.0
    a[2, :3] = 1e38
    b[:3, :] = np.abs(b[:3, :]) / (1 + np.abs(b[:3, :]))
    a[3, :] = 1e-20
    b[7, :] = 1e-19                                       # products of 1e-39: subnormal
    a[4, :] = 1e-39                                       # bfloat16 subnormal inputs
    got = _check(a.astype(BF16), b.astype(BF16), 24, bm=16, bn=32)
    assert np.isnan(got[0]).all()
    assert (got[1, 0::4] == np.inf).all() and (got[1, 1::4] == -np.inf).all()
    assert np.isnan(got[1, 2::4]).all()
    assert np.isfinite(got[2]).all() and np.abs(got[2]).max() > 1e37
    assert (got[4] == 0).all()
    empty = np.asarray(jax.jit(lambda x, y: matmul(x, y, bk=8))(
        jnp.zeros((16, 0), BF16), jnp.zeros((0, 16), BF16)))
    assert empty.shape == (16, 16) and (empty == 0).all()


def _row_major_b(kb, name, bp, kn, padded, b_at):
    """Mutation: B packed as pairs along N (row-major) instead of pairs along K."""
    (k, n), (kp, np_) = kn, padded
    with kb.loop(name("q"), kp) as q, kb.loop(name("j"), np_) as j:
        inside = gemm_amx.tirx.all(q < k, 2 * j + 1 < n)
        lo = gemm_amx._element(b_at, inside, q, 2 * j)
        hi = gemm_amx._element(b_at, inside, q, 2 * j + 1)
        kb.store(bp, [q * np_ + j], gemm_amx._pair(lo, hi))


def _padding_one(at, inside, r, c):
    """Mutation: the padding past the operands is 1.0 instead of zero."""
    one = gemm_amx.tirx.const(0x3F800000, "uint32")
    return gemm_amx.tirx.if_then_else(inside, gemm_amx._bits(at(r, c)), one)


def _eight_rows(kb, cfg):
    """Mutation: tiles of 8 rows in the configuration."""
    _configure(kb, cfg)
    for t in range(8):
        kb.store(cfg, [48 + t], gemm_amx.tirx.const(8, "uint8"))


_configure = gemm_amx._configure


@pytest.mark.parametrize("attr, mutant", [
    ("_pack_b", _row_major_b), ("_element", _padding_one), ("_configure", _eight_rows),
], ids=["no_vnni", "padding", "config_rows"])
def test_mutations_are_caught(emulated, monkeypatch, rng, attr, mutant):
    """Each mutation fails the checks above (a fresh compiler version, so that nothing
    cached answers) and the self-check of the native path."""
    monkeypatch.setattr(gemm_amx, attr, mutant)
    monkeypatch.setattr(build, "compiler_version", lambda: f"mutated-amx-{attr}")
    a, b = _bf16(rng, (37, 45)), _bf16(rng, (45, 29))
    with pytest.raises(AssertionError):
        _check(a, b, 45, bm=48, bn=32)
    assert gemm_amx.self_check(emulated=True) is not None


def _source(a, b, **tiles):
    spr = parse_target("cpu:sapphirerapids")
    return lower.source(build.lowered_ir(transposed_matmul.lower(a, b, **tiles).kernel, spr),
                        spr)


def test_whole_tiles_of_a_load_from_a_itself():
    """A panel of whole tiles (M a multiple of 16, K of 32) read where it lies (forwarded,
    ``forwarding.gemm_operand_rows``) is loaded into tiles straight from A, re-laid into
    nothing; a ragged one, or a transposed one, is re-laid into pairs first."""
    x = jnp.zeros((64, 64), BF16)
    even = _source(x, x, bm=32, bn=32, bk=64)
    assert "amx_a" not in even
    assert re.search(r'"llvm\.x86\.tileloadd64", T\.int8\(4\), T\.address_of\(a\[', even)
    ragged = _source(jnp.zeros((37, 29), BF16), jnp.zeros((29, 45), BF16), bm=24, bn=40,
                     bk=29)
    assert "amx_a" in ragged
    transposed = _source(x, x, bm=32, bn=32, bk=64, ta=True)
    assert "amx_a" in transposed


def _swapped_word(self, r, w):
    """A mutant of ``Rows.word``: the two bfloat16 of a pair of K swapped."""
    lo = self.buffer[self.row + r, self.col + 2 * w]
    hi = self.buffer[self.row + r, self.col + 2 * w + 1]
    return gemm_amx._pair(gemm_amx._bits(hi), gemm_amx._bits(lo))


def test_a_mutation_of_the_tiles_read_from_a_is_caught(emulated, monkeypatch, rng):
    """Whole tiles of A load from A itself (as in the even shape of ``test_amx_matches``):
    with the pairs swapped there, the checks fail, and so does the self-check (its second
    GEMM). A shape of its own: a process keeps the kernels it has specialised."""
    monkeypatch.setattr(gemm_amx.Rows, "word", _swapped_word)
    monkeypatch.setattr(build, "compiler_version", lambda: "mutated-amx-rows")
    a, b = _bf16(rng, (48, 96)), _bf16(rng, (96, 32))
    assert "amx_a" not in _source(a, b, bm=16, bn=32, bk=96)
    with pytest.raises(AssertionError):
        _check(a, b, 96, bm=16, bn=32)
    assert "A from its rows" in gemm_amx.self_check(emulated=True)


def test_the_self_check_passes_on_the_emulation():
    assert gemm_amx.self_check(emulated=True) is None


def test_the_native_self_check_asks_for_the_tile_state_first(monkeypatch):
    """The self-check's child asks Linux for the tile data state itself (nothing it imports
    does): refused, it says so and runs no tile instruction, which would be illegal."""
    monkeypatch.setattr(gemm_amx, "amx_permitted", lambda: False)
    assert "did not grant" in gemm_amx.self_check(emulated=False)


@pytest.mark.skipif(not _host_has_amx(), reason="this CPU has no AMX-BF16 (or Linux refused "
                    "this process the tile data state): the native kernel cannot run here")
def test_the_native_self_check_passes_in_a_child():
    """On a CPU with AMX, the child that decides whether AMX is used runs the native kernel
    and agrees with numpy (before it asked for the tile state, it died of SIGILL and AMX
    stayed off)."""
    assert gemm_amx._in_child(False) is None


def test_a_failed_self_check_disables_amx(monkeypatch):
    """On a host reporting AMX, a self-check that fails keeps the GEMMs on AVX512-BF16,
    with a warning; one that passes enables AMX (once per process)."""
    host = NATIVE_HOST
    for problem, enabled in (("C[0, 1] is 2.0, numpy 3.0", False), (None, True)):
        gemm_amx._native_checked.cache_clear()
        monkeypatch.setattr(gemm_amx, "verdict", lambda caps, p=problem: p)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert gemm_amx.enabled(host) is enabled
            assert gemm_amx.enabled(host) is enabled
        assert len(caught) == (0 if enabled else 1)
        if not enabled:
            assert "AMX disabled" in str(caught[0].message) and problem in str(caught[0].message)
    gemm_amx._native_checked.cache_clear()


def test_the_self_check_runs_in_a_child_once_per_machine(monkeypatch, tmp_path):
    """The verdict comes from a child process running the real self-check (here the
    emulated one, as this CPU may lack AMX), and is then read from the build cache."""
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    assert gemm_amx.verdict(EMULATED_HOST) is None
    assert len(list(tmp_path.glob("amx-self-check-*.json"))) == 1

    def no_child(emulated):
        raise AssertionError("the verdict was not read from the cache")

    monkeypatch.setattr(gemm_amx, "_in_child", no_child)
    assert gemm_amx.verdict(EMULATED_HOST) is None


@pytest.mark.parametrize("program, expected", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGILL)", "died of signal 4"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "died of signal 11"),
    ("raise SystemExit(3)", "exit 3"),
    ("print('tiles!')", "answered 'tiles!'"),
    ("print('\"C[0, 1] is 2.0, numpy 3.0\"')", "C[0, 1] is 2.0"),
    ("import time; time.sleep(30)", "took more than 2 s"),
], ids=["sigill", "sigsegv", "exit", "garbage", "mismatch", "hang"])
def test_a_child_that_faults_is_a_failed_check_not_a_dead_caller(monkeypatch, tmp_path,
                                                                   program, expected):
    """Whatever the AMX code does to the child, the caller gets a verdict saying what
    happened, keeps it, and AMX stays off."""
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm_amx, "_CHILD", program + "  # {emulated}")
    monkeypatch.setattr(gemm_amx, "SELF_CHECK_SECONDS", 2)
    problem = gemm_amx.verdict(NATIVE_HOST)
    assert problem is not None and expected in problem, problem
    monkeypatch.setattr(gemm_amx, "_CHILD", "print('null')  # {emulated}")
    assert gemm_amx.verdict(NATIVE_HOST) == problem      # kept: not asked again


@ON_X86
def test_amx_needs_the_permission(monkeypatch):
    """Without the tile data state (refused, or no AMX), the host's flags lose AMX and the
    capability is false, with a note for ``jaxtile doctor``; the FFI library's answer is
    false on a CPU without AMX."""
    if "amx_tile" not in target._cpuinfo().get("flags", "").split():
        assert _ffi.amx_permitted() is False
    describe_host(monkeypatch, add={*AMX, "avx512f", "avx512_bf16"})
    monkeypatch.setattr(target, "amx_permitted", lambda: False)
    assert not set(AMX) & set(target.host_isa())
    assert not parse_target("cpu").caps.amx_bf16
    assert "refused" in target.amx_note()
    monkeypatch.setattr(target, "amx_permitted", lambda: True)
    assert set(AMX) <= set(target.host_isa()) and target.amx_note() is None
