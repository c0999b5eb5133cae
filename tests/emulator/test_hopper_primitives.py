"""The emulator's wgmma and TMA against independent models of the sm_90a layouts.

The models are written here from other sources than the emulator's code: the accumulator and
register-A fragments are CuTe's GMMA thread-value layouts (``CLayout_64xN`` and the RS
``ALayout_64x16`` of cute/atom/mma_traits_sm90_gmma.hpp, re-tabulated as shapes and strides:
(thread, value) -> m + 64 n); the swizzles are CuTe's generic ``Swizzle<B, M, S>`` functor on
byte offsets (B = 3, 2, 1 for 128, 64, 32 bytes; M = 4, S = 3); the K-major operand layouts
are CuTe's GMMA K-major atoms (8 rows of 16/32/64/128 bytes) tiled with the descriptor's
stride offsets; the descriptor bits are the PTX ISA's "Matrix Descriptor Format" table.
"""

import numpy as np
import pytest
from emu_kernels import kernel_source, mutate
from hopper_kernels import tensor_map

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig

# CuTe's CLayout_64xN: thread shape (4, 8, 4) strides (128, 1, 16); value shape (2, 2, N/8)
# strides (64, 8, 512); the index is m + 64 n. The RS A layout is the same for 64 x 16 (m + 64 k).
_THREAD = ((4, 128), (8, 1), (4, 16))
_VALUE = ((2, 64), (2, 8), (None, 512))


def _tv_index(t: int, v: int) -> int:
    index = 0
    for extent, stride in _THREAD:
        index += (t % extent) * stride
        t //= extent
    for extent, stride in _VALUE:
        if extent is None:
            index += v * stride
        else:
            index += (v % extent) * stride
            v //= extent
    return index


def _cute_swizzle(offset: int, bits: int, base: int = 4, shift: int = 3) -> int:
    """CuTe's Swizzle<bits, base, shift>: XOR bits [base, base+bits) with the ones `shift` above."""
    mask = ((1 << bits) - 1) << (base + shift)
    return offset ^ ((offset & mask) >> shift)


_SWIZZLE_BITS = {0: 0, 32: 1, 64: 2, 128: 3}


def _place(image: np.ndarray, start: int, tile: np.ndarray, swizzle: int, lbo: int, sbo: int):
    """Writes `tile` (rows x 16 of 16-bit words, K-major) into `image` (uint16 words) at byte
    `start` in the canonical layout the descriptor (lbo, sbo, swizzle) describes."""
    rows = tile.shape[0]
    for r in range(rows):
        for k in range(16):
            if swizzle == 0:  # 8 x 8 core matrices of 16-byte rows
                off = (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
            else:  # 8-row atoms of `swizzle`-byte rows
                off = (r // 8) * sbo + (r % 8) * swizzle + 2 * k
            addr = _cute_swizzle(start + off, _SWIZZLE_BITS[swizzle])
            image[addr // 2] = tile[r, k]


def _descriptor(start: int, lbo: int, sbo: int, swizzle: int, base: int) -> int:
    # PTX ISA: start address bits 0-13, leading byte offset 16-29, stride byte offset 32-45
    # (all >> 4), swizzle mode bits 62-63 (1: 128 B, 2: 64 B, 3: 32 B).
    mode = {0: 0, 128: 1, 64: 2, 32: 3}[swizzle]
    return (((base + start) >> 4) & 0x3FFF) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (mode << 62)


@pytest.fixture(scope="module")
def probe():
    return EmulatedKernel.build(
        kernel_source("wgmma_probe_sm90a"), "wgmma_probe",
        [Buffer("image", "uint32"), Buffer("a_regs", "uint32"), Buffer("params", "int32"),
         Buffer("out", "float32"), Buffer("descs", "uint64")],
        LaunchConfig((1, 1, 1), (128, 1, 1), dynamic_smem=16384 + 1024),
        file="wgmma_probe_sm90a.cu",
    )


def _to_bits(x: np.ndarray, bf16: bool) -> np.ndarray:
    if bf16:
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(np.float16).view(np.uint16)


# (swizzle bytes, lbo and sbo of A, of B, the k16 step inside a swizzled row, N).
_CASES = [
    (0, (128, 256), (1024, 128), 0, 64),
    (32, (16, 256), (16, 256), 0, 64),
    (64, (16, 512), (16, 512), 1, 64),
    (128, (16, 1024), (16, 1024), 3, 64),
]
_WIDE = [(64, (16, 512), (16, 512), 1, 128), (32, (16, 256), (16, 256), 0, 256)]


def _params(case):
    return [pytest.param(case, bf16, register_a,
                         id=f"n{case[4]}-swizzle{case[0]}-{'bf16' if bf16 else 'f16'}-"
                            f"{'register' if register_a else 'smem'}_a")
            for bf16 in (False, True) for register_a in (False, True)]


@pytest.mark.parametrize(
    "case, bf16, register_a",
    [p for c in _CASES for p in _params(c)] + [p for c in _WIDE for p in _params(c)[::3]],
)
def test_wgmma_fragments_descriptors_and_swizzles(probe, case, bf16, register_a):
    swizzle, (lbo_a, sbo_a), (lbo_b, sbo_b), step, n = case
    rng = np.random.default_rng(swizzle + 2 * bf16 + register_a)
    # Small integers: every product and sum is exact in f32.
    a = rng.integers(-4, 5, (64, 16)).astype(np.float32)
    b = rng.integers(-4, 5, (n, 16)).astype(np.float32)
    image = rng.integers(0, 2**16, 8192).astype(np.uint16)  # garbage around the operands
    a_at, b_at = 0, 8192
    # The k16 slice at `step` of a wider swizzled row: the descriptor starts 32 bytes further.
    _place(image, a_at, np.zeros((64, 16)), swizzle, lbo_a, sbo_a)
    _place(image, a_at + 32 * step, _to_bits(a, bf16), swizzle, lbo_a, sbo_a)
    _place(image, b_at + 32 * step, _to_bits(b, bf16), swizzle, lbo_b, sbo_b)
    a_bits = _to_bits(a, bf16)
    regs = np.zeros((128, 4), np.uint32)
    for t in range(128):
        for e in range(8):
            idx = _tv_index(t, e)
            regs[t, e // 2] |= np.uint32(a_bits[idx % 64, idx // 64]) << np.uint32(16 * (e % 2))
    params = np.array([lbo_a, sbo_a, lbo_b, sbo_b, swizzle, a_at + 32 * step, b_at + 32 * step,
                       int(register_a), int(bf16), 1, n, 0], np.int32)
    out = np.zeros((128, n // 2), np.float32)
    descs = np.zeros(2, np.uint64)
    report = probe.run(image.view(np.uint32), regs, params, out, descs)
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    # The descriptors wgmma_desc made: the PTX table's bits at the image's shared address
    # (its low 10 bits are zero: the image starts at a multiple of 1024).
    base = (int(descs[0]) & 0x3FFF) << 4
    base -= a_at + 32 * step
    assert base % 1024 == 0
    assert int(descs[0]) == _descriptor(a_at + 32 * step, lbo_a, sbo_a, swizzle, base)
    assert int(descs[1]) == _descriptor(b_at + 32 * step, lbo_b, sbo_b, swizzle, base)
    d = a @ b.T  # independent: D[m, n] = sum_k A[m, k] B[n, k]
    expected = np.empty((128, n // 2), np.float32)
    for t in range(128):
        for v in range(n // 2):
            idx = _tv_index(t, v)
            expected[t, v] = d[idx % 64, idx // 64] + (t * n + v)  # accumulated onto C
    np.testing.assert_array_equal(out, expected)


def _place_mn_major(image: np.ndarray, start: int, tile: np.ndarray, swizzle: int, lbo: int,
                    sbo: int):
    """Writes `tile` (n x 16 of 16-bit words) MN-major: CuTe's canonical GMMA Major-MN layouts
    (``make_gmma_desc<Major::MN>``), in bytes, T = 16 bytes. No swizzle:
    ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), 8 n x 8 k core matrices whose rows are k; swizzled
    by S bytes: ((T,S/16,m),(8,k)):((1,T,LBO),(S/16 T,SBO)), k-rows of S bytes."""
    for n in range(tile.shape[0]):
        for k in range(16):
            if swizzle == 0:
                off = (n % 8) * 2 + (n // 8) * sbo + (k % 8) * 16 + (k // 8) * lbo
            else:
                per_row = swizzle // 2
                off = (n % per_row) * 2 + (n // per_row) * lbo + (k % 8) * swizzle \
                    + (k // 8) * sbo
            addr = _cute_swizzle(start + off, _SWIZZLE_BITS[swizzle])
            image[addr // 2] = tile[n, k]


# (swizzle bytes, lbo and sbo of the MN-major B, N); A K-major as in _CASES. The offsets
# leave gaps (the layouts are not dense) and differ, so each field is pinned; N = 128 with the
# 128-byte swizzle so that B spans two LBO-apart blocks of 64 columns.
_MN_CASES = [(0, 128, 512, 64), (32, 1536, 512, 64), (64, 2048, 1024, 64),
             (128, 4096, 2048, 128)]


@pytest.mark.parametrize("swizzle, lbo_b, sbo_b, n", _MN_CASES)
def test_wgmma_reads_an_mn_major_b_through_the_transpose_bit(probe, swizzle, lbo_b, sbo_b, n):
    lbo_a, sbo_a = (128, 256) if swizzle == 0 else (16, 8 * swizzle)
    rng = np.random.default_rng(40 + swizzle)
    a = rng.integers(-4, 5, (64, 16)).astype(np.float32)
    b = rng.integers(-4, 5, (n, 16)).astype(np.float32)
    image = rng.integers(0, 2**16, 8192).astype(np.uint16)
    _place(image, 0, _to_bits(a, False), swizzle, lbo_a, sbo_a)
    _place_mn_major(image, 8192, _to_bits(b, False), swizzle, lbo_b, sbo_b)
    params = np.array([lbo_a, sbo_a, lbo_b, sbo_b, swizzle, 0, 8192, 0, 0, 0, n, 1], np.int32)
    out = np.zeros((128, n // 2), np.float32)
    report = probe.run(image.view(np.uint32), np.zeros((128, 4), np.uint32), params, out,
                       np.zeros(2, np.uint64))
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    d = a @ b.T
    expected = np.empty((128, n // 2), np.float32)
    for t in range(128):
        for v in range(n // 2):
            idx = _tv_index(t, v)
            expected[t, v] = d[idx % 64, idx // 64]
    np.testing.assert_array_equal(out, expected)
    # without the transpose bit the same bytes are read K-major: other numbers, or (with
    # these offsets as K-major strides) a read past the shared memory, reported
    params[11] = 0
    try:
        probe.run(image.view(np.uint32), np.zeros((128, 4), np.uint32), params, out,
                  np.zeros(2, np.uint64))
    except EmulatorError as e:
        assert "beyond the" in str(e)
    else:
        assert not np.array_equal(out, expected)


def test_wgmma_with_the_wrong_swizzle_gives_wrong_numbers(probe):
    swizzle, (lbo_a, sbo_a), (lbo_b, sbo_b), step, _ = _CASES[3]
    rng = np.random.default_rng(1)
    a = rng.integers(-4, 5, (64, 16)).astype(np.float32)
    b = rng.integers(-4, 5, (64, 16)).astype(np.float32)
    image = np.zeros(8192, np.uint16)
    _place(image, 0, _to_bits(a, False), swizzle, lbo_a, sbo_a)
    _place(image, 8192, _to_bits(b, False), swizzle, lbo_b, sbo_b)
    # The descriptor says 64-byte swizzle; the tiles are laid out with 128.
    params = np.array([lbo_a, sbo_a, lbo_b, sbo_b, 64, 0, 8192, 0, 0, 0, 64, 0], np.int32)
    out = np.zeros((128, 32), np.float32)
    probe.run(image.view(np.uint32), np.zeros((128, 4), np.uint32), params, out,
              np.zeros(2, np.uint64))
    d = a @ b.T
    right = np.array([[d[_tv_index(t, v) % 64, _tv_index(t, v) // 64] for v in range(32)]
                      for t in range(128)])
    assert not np.array_equal(out, right)


@pytest.fixture(scope="module")
def tma_probe():
    return EmulatedKernel.build(
        kernel_source("tma_probe_sm90a"), "tma_probe",
        [Buffer("map", "uint8"), Buffer("args", "int32"), Buffer("src", "uint16"),
         Buffer("out", "uint32"), Buffer("map_back", "uint8"), Buffer("back", "uint16")],
        LaunchConfig((1, 1, 1), (128, 1, 1), dynamic_smem=16384 + 1024),
        file="tma_probe_sm90a.cu",
    )


@pytest.mark.parametrize(
    "shape, box, coords, swizzle",
    [
        ((1, 40, 64), (64, 16, 1), (0, 8, 0), 128),     # 128-byte rows, fully inside
        ((1, 40, 72), (64, 16, 1), (16, 30, 0), 128),   # past the right and bottom edges
        ((1, 20, 32), (32, 16, 1), (0, -3, 0), 64),     # before the top edge
        ((3, 9, 24), (16, 8, 2), (8, 2, 1), 32),        # 3-D, past the last extent
        ((2, 12, 40), (8, 8, 2), (-4, 6, 0), 0),        # no swizzle, before the left edge
    ],
)
def test_tma_boxes_swizzle_zero_fill_and_clipped_stores(tma_probe, shape, box, coords, swizzle):
    src = np.arange(np.prod(shape), dtype=np.uint16).reshape(shape) + 1  # 0 only when filled
    nbytes = int(np.prod(box)) * 2
    out = np.zeros(nbytes // 4, np.uint32)
    back = np.full(shape, 0xFFFF, np.uint16)
    args = np.array([*coords, nbytes], np.int32)
    report = tma_probe.run(tensor_map(2, src, box, swizzle), args, src, out,
                           tensor_map(5, back, box, swizzle), back)
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    expected = np.zeros(nbytes // 2, np.uint16)
    b0, b1, b2 = box
    for i2 in range(b2):
        for i1 in range(b1):
            for i0 in range(b0):
                g = (coords[2] + i2, coords[1] + i1, coords[0] + i0)
                inside = all(0 <= g[d] < shape[d] for d in range(3))
                dense = ((i2 * b1 + i1) * b0 + i0) * 2
                at = _cute_swizzle(dense, _SWIZZLE_BITS[swizzle]) // 2
                expected[at] = src[g] if inside else 0
    np.testing.assert_array_equal(out.view(np.uint16), expected)
    # The store undoes the swizzle and writes only the part of the box inside the tensor.
    inside = tuple(slice(max(c, 0), max(min(c + n, e), 0))
                   for c, n, e in zip(coords[::-1], box[::-1], shape))
    expected_back = np.full(shape, 0xFFFF, np.uint16)
    expected_back[inside] = src[inside]
    np.testing.assert_array_equal(back, expected_back)


def test_wgmma_reading_unfenced_generic_writes_is_reported():
    source = kernel_source("wgmma_probe_sm90a")
    probe = EmulatedKernel.build(
        mutate(source, "fence", "jaxtile::fence_proxy_async();", ""), "wgmma_probe",
        [Buffer("image", "uint32"), Buffer("a_regs", "uint32"), Buffer("params", "int32"),
         Buffer("out", "float32"), Buffer("descs", "uint64")],
        LaunchConfig((1, 1, 1), (128, 1, 1), dynamic_smem=16384 + 1024),
        file="wgmma_probe_sm90a.cu",
    )
    params = np.array([128, 256, 1024, 128, 0, 0, 8192, 0, 0, 0, 64, 0], np.int32)
    with pytest.raises(EmulatorError) as e:
        probe.run(np.zeros(4096, np.uint32), np.zeros((128, 4), np.uint32), params,
                  np.zeros((128, 32), np.float32), np.zeros(2, np.uint64))
    wgmma_line = next(n for n, line in enumerate(source.splitlines(), 1)
                      if "wgmma_f16<N>(acc, da" in line)
    copy_line = next(n for n, line in enumerate(source.splitlines(), 1)
                     if "img[i] = image[i]" in line)
    messages = [f["message"] for f in e.value.report["findings"]]
    assert any(m.startswith("missing fence.proxy.async")
               and f"at wgmma_probe_sm90a.cu:{wgmma_line}" in m
               and f"wrote at wgmma_probe_sm90a.cu:{copy_line}" in m for m in messages), messages


def test_tma_with_a_stride_that_is_not_16_bytes_is_reported(tma_probe):
    # An f16 row of 999 elements: TMA needs strides in multiples of 16 bytes.
    src = np.zeros((1, 4, 999), np.uint16)
    args = np.array([0, 0, 0, 64 * 4 * 2], np.int32)
    with pytest.raises(EmulatorError, match="bad tensor map") as e:
        tma_probe.run(tensor_map(2, src, (64, 4, 1)), args, src, np.zeros(128, np.uint32),
                      tensor_map(5, src, (64, 4, 1)), src.copy())
    messages = [f["message"] for f in e.value.report["findings"]]
    assert any("the stride of dimension 1 (1998 bytes) is not a multiple of 16" in m
               and "tma_load at tma_probe_sm90a.cu:" in m for m in messages), messages
