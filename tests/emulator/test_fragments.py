"""ldmatrix and mma.sync, lane by lane, against a numpy model of the PTX ISA fragment tables.

The model below is written from the tables (PTX ISA, "Matrix Fragments for mma.m16n8k16
with floating point type" and "ldmatrix"; summarised in docs/ptx_facts.md), not from
the emulator's code: for each lane it says which matrix element each register half holds.
"""

import ml_dtypes
import numpy as np
import pytest
from emu_kernels import kernel_source

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig, Scalar

LANES = np.arange(32)


def _probe(name, params):
    return EmulatedKernel.build(
        kernel_source("fragments"), name, params, LaunchConfig((1, 1, 1), (32, 1, 1)),
        file="fragments.cu",
    )


@pytest.fixture(scope="module")
def ldmatrix_probe():
    return _probe(
        "ldmatrix_probe",
        [Buffer("src", "uint16"), Buffer("rows", "int32"), Buffer("mode", "int32"),
         Buffer("out", "uint32")],
    )


@pytest.fixture(scope="module")
def mma_probe():
    return _probe(
        "mma_probe",
        [Buffer("a", "uint32"), Buffer("b", "uint32"), Buffer("c", "float32"),
         Buffer("kind", "int32"), Buffer("d", "float32")],
    )


# ---- the model: ldmatrix ----

def ldmatrix_model(matrices, trans):
    """Registers of every lane: lane L's register j holds, low half first, elements
    (L/4, 2(L%4)) and (L/4, 2(L%4)+1) of matrix j, or (2(L%4), L/4) and (2(L%4)+1, L/4) with
    .trans."""
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        for j, m in enumerate(matrices):
            if trans:
                lo, hi = m[2 * (lane % 4), lane // 4], m[2 * (lane % 4) + 1, lane // 4]
            else:
                lo, hi = m[lane // 4, 2 * (lane % 4)], m[lane // 4, 2 * (lane % 4) + 1]
            out[lane, j] = int(lo) | (int(hi) << 16)
    return out


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_lane_by_lane(ldmatrix_probe, count, trans):
    rng = np.random.default_rng(count * 2 + trans)
    src = rng.permutation(65536)[:512].astype(np.uint16)  # distinct values
    # Lanes 8j..8j+7 give the rows of matrix j, scattered over the 64 rows of shared memory;
    # the other lanes give addresses ldmatrix must ignore.
    rows = rng.permutation(64)[:32].astype(np.int32)
    out = np.zeros(128, np.uint32)
    ldmatrix_probe.run(src, rows, np.array([count, int(trans)], np.int32), out)
    table = src.reshape(64, 8)
    matrices = [table[rows[8 * j : 8 * j + 8]] for j in range(count)]
    expected = ldmatrix_model(matrices, trans)
    np.testing.assert_array_equal(out.reshape(32, 4)[:, :count], expected[:, :count])


def test_ldmatrix_x4_gives_the_mma_a_fragment(ldmatrix_probe):
    # ldmatrix (docs/ptx_facts.md): .x4 over (rows 0-7, k 0-7), (rows 8-15, k 0-7),
    # (rows 0-7, k 8-15), (rows 8-15, k 8-15) of a row-major 16x16 tile is the m16n8k16 A fragment.
    a = np.arange(256, dtype=np.uint16).reshape(16, 16)
    src = np.zeros((64, 8), np.uint16)
    src[:32] = np.concatenate([a[:, :8], a[:, 8:]])  # row r of k-half h at 16 h + r
    rows = np.array([(j >> 1) * 16 + (j & 1) * 8 + r for j in range(4) for r in range(8)],
                    np.int32)
    out = np.zeros(128, np.uint32)
    ldmatrix_probe.run(src.reshape(-1), rows, np.array([4, 0], np.int32), out)
    np.testing.assert_array_equal(out.reshape(32, 4), pack_a_f16(a.view(np.float16)))


# ---- the model: mma fragments ----

def a_coords_k16(lane, i):
    g, t = lane >> 2, lane % 4
    row = g if i in (0, 1, 4, 5) else g + 8
    col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_coords_k16(lane, i):
    g, t = lane >> 2, lane % 4
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


def c_coords(lane, i):
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), 2 * t + (i & 1)


def a_coords_tf32(lane, i):
    g, t = lane >> 2, lane % 4
    return g + (8 if i in (1, 3) else 0), t + (4 if i >= 2 else 0)


def b_coords_tf32(lane, i):
    g, t = lane >> 2, lane % 4
    return t + 4 * i, g


def _bits16(x):
    return np.asarray(x).view(np.uint16).astype(np.uint32)


def pack_a_f16(a):
    bits = _bits16(a)
    regs = np.zeros((32, 4), np.uint32)
    for lane in LANES:
        for i in range(8):
            regs[lane, i // 2] |= bits[a_coords_k16(lane, i)] << (16 * (i & 1))
    return regs


def pack_b_f16(b):
    bits = _bits16(b)
    regs = np.zeros((32, 2), np.uint32)
    for lane in LANES:
        for i in range(4):
            regs[lane, i // 2] |= bits[b_coords_k16(lane, i)] << (16 * (i & 1))
    return regs


def pack_c(c):
    return np.array([[c[c_coords(lane, i)] for i in range(4)] for lane in LANES], np.float32)


def unpack_d(d):
    out = np.zeros((16, 8), np.float32)
    for lane in LANES:
        for i in range(4):
            out[c_coords(lane, i)] = d[lane, i]
    return out


def _small_values(rng, shape, dtype):
    # Multiples of 1/8 in [-2, 2]: exact in f16, bf16 and tf32, and every product and sum
    # of the 16-term dot products is exact in f32, so D must match exactly.
    return (rng.integers(-16, 17, shape) / 8).astype(dtype)


@pytest.mark.parametrize("dtype,kind", [(np.float16, 0), (ml_dtypes.bfloat16, 1)])
def test_mma_m16n8k16_lane_by_lane(mma_probe, dtype, kind):
    rng = np.random.default_rng(kind)
    a = _small_values(rng, (16, 16), dtype)
    b = _small_values(rng, (16, 8), dtype)
    c = _small_values(rng, (16, 8), np.float32)
    d = np.zeros((32, 4), np.float32)
    mma_probe.run(pack_a_f16(a), pack_b_f16(b), pack_c(c), np.array([kind], np.int32), d)
    expected = a.astype(np.float32) @ b.astype(np.float32) + c
    np.testing.assert_array_equal(unpack_d(d), expected)


def test_mma_m16n8k8_tf32_lane_by_lane(mma_probe):
    rng = np.random.default_rng(7)
    a = _small_values(rng, (16, 8), np.float32)
    b = _small_values(rng, (8, 8), np.float32)
    c = _small_values(rng, (16, 8), np.float32)
    ra = np.array([[a[a_coords_tf32(lane, i)] for i in range(4)] for lane in LANES], np.float32)
    rb = np.array([[b[b_coords_tf32(lane, i)] for i in range(2)] for lane in LANES], np.float32)
    d = np.zeros((32, 4), np.float32)
    mma_probe.run(ra.view(np.uint32), rb.view(np.uint32), pack_c(c), np.array([2], np.int32), d)
    np.testing.assert_array_equal(unpack_d(d), a @ b + c)


def test_mma_tf32_ignores_low_mantissa_bits(mma_probe):
    # The tensor core reads only the 19 high bits of a tf32 operand.
    a = np.zeros((16, 8), np.float32)
    b = np.zeros((8, 8), np.float32)
    a[0, 0] = np.float32(1.0) + np.float32(2.0**-12)  # below tf32's 10-bit mantissa
    b[0, 0] = 1.0
    ra = np.array([[a[a_coords_tf32(lane, i)] for i in range(4)] for lane in LANES], np.float32)
    rb = np.array([[b[b_coords_tf32(lane, i)] for i in range(2)] for lane in LANES], np.float32)
    d = np.zeros((32, 4), np.float32)
    zero_c = np.zeros((32, 4), np.float32)
    mma_probe.run(ra.view(np.uint32), rb.view(np.uint32), zero_c, np.array([2], np.int32), d)
    assert unpack_d(d)[0, 0] == 1.0


@pytest.fixture(scope="module")
def convert_probe():
    n = 4096
    return n, EmulatedKernel.build(
        kernel_source("fragments"),
        "convert_probe",
        [Buffer("x", "float32"), Buffer("h", "uint16"), Buffer("bf", "uint16"),
         Buffer("tf", "uint32"), Buffer("back", "float32"), Scalar("n", n)],
        LaunchConfig((n // 128, 1, 1), (128, 1, 1)),
        file="fragments.cu",
    )


def test_16bit_conversions_round_to_nearest_even(convert_probe):
    n, kernel = convert_probe
    rng = np.random.default_rng(3)
    special = np.array(
        [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e9, -1e9, np.inf, -np.inf,
         2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 1e-30,
         1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8],
        np.float32,
    )
    # Random bit patterns cover every exponent, ties included by the specials above.
    x = np.concatenate([special, rng.integers(0, 2**32, n, dtype=np.uint64)
                        .astype(np.uint32).view(np.float32)])[:n]
    x = np.where(np.isnan(x), np.float32(1.5), x).astype(np.float32)
    h, bf = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    tf, back = np.zeros(n, np.uint32), np.zeros(n, np.float32)
    kernel.run(x, h, bf, tf, back)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h, x.astype(np.float16).view(np.uint16))
        np.testing.assert_array_equal(bf, x.astype(ml_dtypes.bfloat16).view(np.uint16))
        np.testing.assert_array_equal(back, x.astype(np.float16).astype(np.float32))
    # cvt.rna.tf32.f32: nearest on the 10-bit mantissa, ties away from zero.
    bits = x.view(np.uint32)
    finite = np.abs(x) < np.inf
    expected_tf = np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits)
    np.testing.assert_array_equal(tf[finite], expected_tf[finite])


def test_nan_converts_to_canonical_nan(convert_probe):
    n, kernel = convert_probe
    x = np.full(n, np.nan, np.float32)
    h, bf = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    tf, back = np.zeros(n, np.uint32), np.zeros(n, np.float32)
    kernel.run(x, h, bf, tf, back)
    assert (h == 0x7FFF).all() and (bf == 0x7FFF).all() and np.isnan(back).all()
