"""CPU kernels compiled for an ISA level narrower than the host (``JAXTILE_CPU_ISA``,
targets ``cpu:x86-64-v3`` and ``cpu:x86-64-v4``): the variable's checks, the target's
capabilities and key, the instructions in the object code (AVX2 code has no AVX-512
instruction; the GEMM's k loop is the register tile chosen for each level, instruction by
instruction), and the GEMM (edge values, transposes, ``matmul_relu``), bfloat16 GEMM,
attention and ragged row tiles run under the override and on the host, checked against
their reference semantics and independent formulas."""

import collections
import re
import shutil
import subprocess
import uuid
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_helpers import TOL, np_attention, qkv
from described_cpu import describe_host
from gemm_kernels import matmul
from test_cpu_gemm_bf16 import _check as check_bf16_gemm
from test_cpu_gemm_bf16 import _operands as bf16_operands
from test_cpu_gemm_bf16 import matmul as bf16_matmul

import jaxtile as jt
from jaxtile import _config, _ffi
from jaxtile.compiler import build, cache, target
from jaxtile.compiler.cpu import gemm, gemm_amx
from jaxtile.compiler.target import ISA_LEVELS, parse_target
from jaxtile.primitives import payload

HOST = set(target.host_isa())
RUNNABLE = [level for level in ISA_LEVELS if set(ISA_LEVELS[level]) <= HOST]
"""The levels this machine can run (x86-64-v3 on an AVX2 machine, both on an AVX-512 one)."""


def _requires(level):
    return pytest.mark.skipif(level not in RUNNABLE and level != "host",
                              reason=f"this CPU cannot run {level} code")


LEVELS = [pytest.param(level, marks=_requires(level)) for level in ("x86-64-v3", "host")]


TILES = {"bm": 64, "bn": 64, "bk": 64}
"""The GEMM's tiles here: whole 6 x 2 register tiles on AVX2, and ragged ones."""


# -- the variable and the target ------------------------------------------------------------

def test_the_variable_selects_the_target(monkeypatch):
    monkeypatch.delenv("JAXTILE_CPU_ISA", raising=False)
    assert _config.cpu_target_name() == "cpu"
    if "x86-64-v3" in RUNNABLE:
        monkeypatch.setenv("JAXTILE_CPU_ISA", "X86-64-V3")
        assert _config.cpu_target_name() == "cpu:x86-64-v3"


@pytest.mark.parametrize("value, words", [
    ("avx2", "expected host or one of x86-64-v3, x86-64-v4"),
    ("x86-64-v3 ", "expected host or one of"),
])
def test_a_bad_value_warns_and_compiles_for_the_host(monkeypatch, value, words):
    monkeypatch.setenv("JAXTILE_CPU_ISA", value)
    with pytest.warns(_config.ConfigWarning, match="JAXTILE_CPU_ISA") as record:
        assert _config.cpu_target_name() == "cpu"
    assert words in str(record[0].message)


def test_a_level_the_cpu_lacks_warns(monkeypatch):
    """On a CPU without AVX-512 (described so), x86-64-v4 code could not run."""
    describe_host(monkeypatch, remove={"avx512f"})
    monkeypatch.setenv("JAXTILE_CPU_ISA", "x86-64-v4")
    # a CPU with no AVX-512 at all (a Zen 3) lacks the level's other AVX-512 flags too
    with pytest.warns(_config.ConfigWarning,
                      match=r"this CPU lacks (\w+ )*avx512f( \w+)* of x86-64-v4"):
        assert _config.cpu_target_name() == "cpu"


def test_levels_narrow_the_capabilities_and_the_key():
    v3, v4, host = (parse_target(n) for n in ("cpu:x86-64-v3", "cpu:x86-64-v4", "cpu"))
    assert v3.caps.isa == ISA_LEVELS["x86-64-v3"] and "avx512f" not in v3.caps.isa
    assert (v3.caps.vector_bits, v3.caps.vector_registers, v3.caps.level) == \
        (256, 16, "x86-64-v3")
    assert (v4.caps.vector_bits, v4.caps.vector_registers) == (512, 32)
    assert not v3.caps.bf16_dot and not v4.caps.bf16_dot  # AVX512-BF16 is not in v4
    assert host.caps.level == "host" and host.caps.isa == target.host_isa()
    x = jnp.zeros((64, 64), jnp.float32)
    kernel = matmul.lower(x, x, **TILES).kernel
    keys = {build.kernel_key(kernel, t) for t in (v3, v4, host)}
    assert len(keys) == 3


# -- the object code ------------------------------------------------------------------------

def _disassembly(level, dtype=jnp.float32, shape=(128, 128)):
    """``objdump -d`` of the library of ``matmul`` compiled for ``cpu:<level>``."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    x = jnp.zeros(shape, dtype)
    entry = build.build(matmul.lower(x, x, **TILES).kernel, parse_target(f"cpu:{level}"))
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", entry.library],
                          capture_output=True, text=True, check=True).stdout


_AVX512_ONLY = re.compile(r"%zmm|%ymm(1[6-9]|2\d|3[01])|%xmm(1[6-9]|2\d|3[01])|%k[0-7]|\{1to")
"""Operands only EVEX (AVX-512) instructions have: zmm registers, the upper 16 vector
registers, mask registers, embedded broadcasts."""


def _two_fmas_per_broadcast(code, register):
    """The broadcasts (of A) into a ``register`` (ymm, zmm) register that at least two FMAs
    read before anything overwrites it (AT&T syntax: the destination comes last)."""
    reused, reads = 0, {}
    for line in code.splitlines():
        regs = re.findall(rf"%{register}\d+", line)
        if not regs:
            continue
        *sources, dest = regs
        if "vbroadcastss" in line:
            reads[dest] = 0
            continue
        if "vfmadd231ps" in line:
            for reg in set(sources) & reads.keys():
                reads[reg] += 1
                reused += reads[reg] == 2
        reads.pop(dest, None)
    return reused


def test_avx2_code_has_no_avx512_instruction():
    code = _disassembly("x86-64-v3")
    assert not _AVX512_ONLY.search(code), _AVX512_ONLY.search(code).group(0)
    assert re.search(r"vfmadd\d+ps\s+.*%ymm", code)
    # The 6 x 2 register tile: each k step broadcasts 6 elements of A, each into a register
    # that two FMAs (two vectors of B) then read (the 8 x 1 tile had one FMA per broadcast).
    assert _two_fmas_per_broadcast(code, "ymm") >= 6


def test_avx512_code_uses_zmm_registers():
    """The 8 x 2 register tile: each broadcast of A feeds two FMAs (8 x 1 folded each
    broadcast into its one FMA, ``{1to16}``, and took a load per FMA)."""
    code = _disassembly("x86-64-v4")
    assert re.search(r"vfmadd\d+ps\s+.*%zmm", code)
    assert _two_fmas_per_broadcast(code, "zmm") >= 8


def _innermost_loops(code):
    """The instruction counts (mnemonic -> count) and the text of every innermost loop of
    ``objdump -d`` output: a backward jump and what lies from its target to it, with no
    other backward jump inside."""
    rows = [(int(m[1], 16), m[2]) for m in re.finditer(r"^\s*([0-9a-f]+):\t(.*)$", code,
                                                       re.MULTILINE)]
    back = [(int(m[1], 16), at) for at, ins in rows
            if (m := re.match(r"j\w+\s+([0-9a-f]+) <", ins)) and int(m[1], 16) < at]
    out = []
    for start, end in back:
        if any(start <= s and e < end for s, e in back if (s, e) != (start, end)):
            continue
        body = [ins for at, ins in rows if start <= at <= end]
        out.append((collections.Counter(ins.split()[0] for ins in body), "\n".join(body)))
    return out


_STORE = re.compile(r"^v?mov\w*\s+%[xyz]mm\d+,\s*[-\w]*\(", re.MULTILINE)
"""A vector register stored to memory (AT&T syntax: the destination comes last)."""

_CONVERSION = re.compile(r"^(vpmovzxwd|vpslld|vcvt\w*|vpunpck\w*)\s", re.MULTILINE)
"""Instructions that widen bfloat16 to float32 (a zero-extend and a shift, or a convert)."""


def _fma_loops(code, register):
    """The innermost loops with FMAs on ``register`` (ymm, zmm) registers."""
    return [(counts, text) for counts, text in _innermost_loops(code)
            if re.search(rf"^vfmadd\d+ps\s+.*%{register}", text, re.MULTILINE)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_the_avx2_micro_kernel(dtype):
    """The AVX2 GEMM's k loop, exactly: per k step two loads of B, six broadcasts of A and
    12 FMAs (6 x 2 register tiles; LLVM unrolls the 4 x 2 tiles of the rows left over by
    two, 16 FMAs per 8 broadcasts), with the accumulators in registers (no store in the
    loop) and, for bfloat16 operands, no conversion in it (the copies into the panels widen
    each element once, :mod:`jaxtile.compiler.passes.gemm_panels`)."""
    loops = _fma_loops(_disassembly("x86-64-v3", dtype), "ymm")
    main = {"vmovups": 2, "vbroadcastss": 6, "vfmadd231ps": 12}
    assert any({k: v for k, v in counts.items() if k in main} == main for counts, _ in loops)
    for counts, text in loops:
        fmas = sum(v for k, v in counts.items() if k.startswith("vfmadd"))
        assert fmas == 2 * counts["vbroadcastss"] and fmas <= 16, dict(counts)
        assert not _STORE.search(text), _STORE.search(text).group(0)
        assert not _CONVERSION.search(text), _CONVERSION.search(text).group(0)


def test_the_avx512_micro_kernel():
    """The 8 x 2 register tile on AVX-512: 16 FMAs per 8 broadcasts and 2 loads of B per
    k step, the accumulators in registers."""
    loops = _fma_loops(_disassembly("x86-64-v4"), "zmm")
    main = {"vmovups": 2, "vbroadcastss": 8, "vfmadd231ps": 16}
    assert any({k: v for k, v in counts.items() if k in main} == main for counts, _ in loops)
    assert not any(_STORE.search(text) for _, text in loops)


def test_register_tiles_follow_the_vector_registers():
    v3, v4 = (parse_target(n).caps for n in ("cpu:x86-64-v3", "cpu:x86-64-v4"))
    assert gemm.tile_shape(v3) == ((6, 4), 2) and gemm.tile_shape(v4) == ((8, 4), 2)
    for caps in (v3, v4):
        rows, vectors = gemm.tile_shape(caps)
        # Accumulators, the vectors of B and one broadcast fit the vector registers.
        assert rows[0] * vectors + vectors + 1 <= caps.vector_registers


# -- kernels run under the override ---------------------------------------------------------

def _use(monkeypatch, level):
    monkeypatch.setenv("JAXTILE_CPU_ISA", level)
    with warnings.catch_warnings():
        warnings.simplefilter("error", _config.ConfigWarning)
        return parse_target(_config.cpu_target_name())


@_requires("x86-64-v3")
@pytest.mark.parametrize("mkn", [(128, 128, 128), (70, 90, 100)], ids=["tiles", "ragged"])
def test_f32_gemm_on_avx2(monkeypatch, rng, mkn):
    """Whole 6 x 2 tiles, and ragged edges: rows in bands of 6 and 4 and the i-k-j nest,
    columns in two-vector, one-vector and 8-lane tiles. (The host's f32 GEMM is tested in
    test_cpu_gemm_*.py and test_language_gemm_control.py.)"""
    tgt = _use(monkeypatch, "x86-64-v3")
    m, k, n = mkn
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = np.asarray(jax.jit(lambda x, y: matmul(x, y, **TILES))(a, b))
    lowered = matmul.lower(a, b, **TILES)
    assert lowered.target == tgt.name  # "cpu" is the CPU platform's target
    assert cache.find(build.kernel_key(lowered.kernel, tgt))[0] is not None  # what ran
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = k * 2.0 ** -23 * (np.abs(a).astype(np.float64) @ np.abs(b))
    assert (np.abs(got - want) <= bound).all()
    np.testing.assert_allclose(got, matmul.reference(a, b, **TILES), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got, jnp.matmul(a, b, precision="highest"), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mkn", [(128, 128, 128), (70, 90, 100)], ids=["tiles", "ragged"])
def test_f32_gemm_nan_and_inf_propagate(monkeypatch, rng, level, mkn):
    """NaN and infinities in A and in B reach exactly the outputs they reach in a float64
    product, in whole blocks and in blocks that straddle the ragged edges (70 x 100 leaves
    the last blocks 6 live rows and 36 live columns): a NaN poisons its row of A's (column
    of B's) output, inf times a positive, negative and zero element gives +inf, -inf and
    NaN, and +inf meeting -inf in one sum gives NaN."""
    _use(monkeypatch, level)
    m, k, n = mkn
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a[0, 3] = np.nan                      # row 0: NaN
    b[4, n - 1] = np.nan                  # last column: NaN
    b[5, :] = 0.0
    b[5, 7] = np.inf                      # column 7: sign(a[i, 5]) * inf
    a[1:4, 5] = (2.0, -1.0, 0.0)          # ... +inf, -inf and NaN (0 * inf) in rows 1-3
    a[m - 1, :] = 0.0
    a[m - 1, 9:11] = (np.inf, -np.inf)    # last row: b[9, j] * inf - b[10, j] * inf
    b[9:11, :] = 1.0
    b[9:11, 1] = (1.0, -1.0)              # ... +inf in column 1, NaN elsewhere
    got = np.asarray(jax.jit(lambda x, y: matmul(x, y, **TILES))(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):   # 0 x inf, inf - inf
        want = (a64[:, :, None] * b64[None, :, :]).sum(axis=1)
        bound = k * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
    special = ~np.isfinite(want)
    assert np.isnan(got[0]).all() and np.isnan(got[:, n - 1]).all()
    assert got[1, 7] == np.inf and got[2, 7] == -np.inf and np.isnan(got[3, 7])
    assert got[m - 1, 1] == np.inf and np.isnan(np.delete(got[m - 1], [1])).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[special & ~np.isnan(want)],
                                  want[special & ~np.isnan(want)])
    assert (np.abs(got[~special] - want[~special]) <= bound[~special]).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ta, tb", [(True, False), (False, True), (True, True)],
                         ids=["ta", "tb", "ta_tb"])
def test_f32_gemm_transposed_operands(monkeypatch, rng, level, ta, tb):
    """Transposed operands in float32 (a transposed B is copied once into [k, j] layout
    before the register tiles), ragged: 70 x 90 x 100 in 64 x 64 x 32 tiles."""
    _use(monkeypatch, level)
    m, k, n = 70, 90, 100
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    got = np.asarray(jax.jit(lambda x, y: bf16_matmul(x, y, bm=64, bn=64, bk=32, ta=ta,
                                                      tb=tb))(a, b))
    a64, b64 = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    bound = k * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
    assert (np.abs(got - a64 @ b64) <= bound).all()


@pytest.mark.parametrize("level", LEVELS)
def test_matmul_relu_follows_the_gemm(monkeypatch, rng, level):
    """The library's ``matmul_relu`` at a ragged shape and its default tiles (128 x 128 x
    32: the register tiles, then the rows and columns left over)."""
    _use(monkeypatch, level)
    a = rng.standard_normal((150, 70)).astype(np.float32)
    b = rng.standard_normal((70, 140)).astype(np.float32)
    got = np.asarray(jax.jit(jt.ops.matmul_relu)(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = 70 * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
    assert (np.abs(got - np.maximum(a64 @ b64, 0)) <= bound).all()
    assert (got == 0).any() and (got > 0).any()


# The bfloat16 GEMM and attention cases are those of test_cpu_gemm_bf16.py ("panels") and
# test_ops_attention.py (test_forward_gqa_ragged, causal, d = 64), which cover the host:
# the same shapes, so that the host runs here reuse their compiled kernels in a whole run.

@pytest.mark.parametrize("level", LEVELS)
def test_bf16_gemm(monkeypatch, rng, level):
    """bfloat16 operands: widened to float32 FMAs on AVX2 (6 x 2 and 4 x 2 tiles of a 64 x
    16 accumulator), ``vdpbf16ps`` on a host with it, AMX tiles on a host with them; then
    NaN, infinities, huge and subnormal values among the operands
    (``language_helpers.edge_values``), ragged."""
    tgt = _use(monkeypatch, level)
    path = "amx" if gemm_amx.enabled(tgt.caps) else "dot" if tgt.caps.bf16_dot else "fma"
    check_bf16_gemm(path, *bf16_operands(rng, 70, 300, 33), bm=64, bn=16, bk=32)
    got = check_bf16_gemm(path, *bf16_operands(rng, 45, 40, 37, edges=True), bm=32, bn=32,
                          bk=16)
    assert np.isnan(got).any() and np.isinf(got).any()


@pytest.mark.parametrize("level", LEVELS)
def test_attention(monkeypatch, rng, level):
    _use(monkeypatch, level)
    q, k, v = qkv(rng, 2, 4, 2, 37, 37, 64, jnp.float32)
    got = jax.jit(lambda *a: jt.ops.attention(*a, causal=True, block_q=16, block_k=16))(
        q, k, v)
    want, _ = np_attention(q, k, v, causal=True)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, **TOL[jnp.float32])
    nn = jax.nn.dot_product_attention(*(jnp.swapaxes(t, 1, 2) for t in (q, k, v)),
                                      is_causal=True)
    np.testing.assert_allclose(got, jnp.swapaxes(nn, 1, 2), **TOL[jnp.float32])


@pytest.mark.skipif("x86-64-v3" not in RUNNABLE, reason="this CPU cannot run x86-64-v3 code")
def test_an_export_requires_the_level_not_the_host(monkeypatch, rng):
    """A program exported under the override needs only the level's extensions of the
    machine that loads it (so one exported on an AVX-512 machine for v3 runs on AVX2)."""
    _use(monkeypatch, "x86-64-v3")
    a = rng.standard_normal((64, 64)).astype(np.float32)
    exported = jax.export.export(jax.jit(lambda x: matmul(x, x, **TILES)),
                                 disabled_checks=jt.export_checks())(a)
    fields = re.findall(r"isa=([\w,]*)", exported.mlir_module())
    assert fields and all(f.split(",") == list(ISA_LEVELS["x86-64-v3"]) for f in fields)
    np.testing.assert_allclose(exported.call(a), matmul.reference(a, a, **TILES), rtol=1e-5,
                               atol=1e-4)
    # The runtime's check (ffi/cpu/exported_kernel.cc) passes such a payload on this host:
    # loaded under a key not loaded yet, so the check runs (a loaded key returns early).
    entry = build.build(matmul.lower(a, a, **TILES).kernel, parse_target("cpu:x86-64-v3"))
    with open(entry.library, "rb") as f:
        library = f.read()
    key = f"test-cpu-isa-{uuid.uuid4().hex}"
    _ffi.load_exported_kernel(key, payload.pack(
        key=key, name="matmul", symbol=entry.symbol, num_blocks=entry.num_blocks,
        alignment=entry.alignment, isa=ISA_LEVELS["x86-64-v3"], library=library,
        signature=entry.meta.signature))
    assert _ffi.is_loaded(key)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("shape, dtype", [((37, 1000), np.float32), ((9, 130), "bfloat16"),
                                          ((6, 7), np.float16)],
                         ids=["1000-f32", "130-bf16", "7-f16"])
def test_ragged_rows_read_the_pad_and_drop_past_the_end(monkeypatch, rng, level, shape,
                                                        dtype):
    """``jt.ops.softmax`` rounds its row tile up past the end of the rows (to 1024, 256,
    128 columns) and pads with -inf; the rows of the last block run past the array's end.
    The vector straddling a row's end (1000 = 62 x 16 + 8: a partial vector on AVX-512,
    none on AVX2; 130 and 7 straddle on both) must read the pad, not the next row: rows 2
    and 4 start with +inf and NaN, which would make rows 1 and 3 NaN if they leaked; and
    no write may reach past the end of a row (it would change the start of the next)."""
    _use(monkeypatch, level)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    x[2, 0], x[4, 0] = np.inf, np.nan
    x = jnp.asarray(x, dtype)
    got = np.asarray(jax.jit(lambda v: jt.ops.softmax(v, rows=4))(x), np.float64)
    xf = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(xf - xf.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    tol = {"rtol": 1e-5, "atol": 1e-7} if dtype == np.float32 else {"rtol": 1e-2,
                                                                    "atol": 1e-3}
    special = np.isin(np.arange(shape[0]), [2, 4])
    assert np.isnan(got[special]).all() and np.isfinite(got[~special]).all()
    np.testing.assert_allclose(got[~special], want[~special], **tol)
    ref = np.asarray(jt.ops.softmax.reference(x, rows=4), np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got[~np.isnan(got)], ref[~np.isnan(ref)], **tol)
