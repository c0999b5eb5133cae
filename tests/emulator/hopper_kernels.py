"""Host side of the hand-written sm_90a kernels: the emulator's tensor maps and the builds."""

import struct

import ml_dtypes
import numpy as np
from emu_kernels import kernel_source

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig, Scalar

# jaxtile::emu::TensorMap (ffi/emulator/include/jaxtile_emu/runtime.h): magic, buffer, rank,
# element bytes, 5 dims, 4 byte strides, 5 box extents, swizzle, 4 reserved words.
_TENSOR_MAP = struct.Struct("<4I5Q4Q5I5I")
_MAGIC = 0x4A544D31


def tensor_map(
    buffer: int, array: np.ndarray, box: tuple[int, ...], swizzle: int = 0
) -> np.ndarray:
    """The 128 bytes of the emulator's tensor map of `array` (row-major), the kernel's
    `buffer`-th buffer parameter, copying boxes of `box` elements (innermost dimension first,
    as CUDA's cuTensorMapEncodeTiled takes them) with a `swizzle` of 0, 32, 64 or 128 bytes."""
    assert array.flags.c_contiguous and len(box) == array.ndim
    dims = list(reversed(array.shape)) + [1] * (5 - array.ndim)
    strides = list(reversed(array.strides))[1:] + [0] * (5 - array.ndim)
    boxes = list(box) + [1] * (5 - array.ndim)
    raw = _TENSOR_MAP.pack(_MAGIC, buffer, array.ndim, array.itemsize, *dims, *strides[:4],
                           *boxes, swizzle, 0, 0, 0, 0)
    assert len(raw) == 128
    return np.frombuffer(raw, np.uint8).copy()


# gemm_sm90a.cu's tiles: BM = 64 x CONSUMERS rows, BN columns.
GEMM_BM, GEMM_BN, GEMM_BK = 128, 64, 64


def gemm_sm90a(M: int, N: int, K: int, source: str | None = None,
               dtype: str = "float16") -> EmulatedKernel:
    """gemm_sm90a.cu for C[M, N] = A[M, K] @ B[N, K].T (f16 or bf16 in, f32 out), 384 threads."""
    src = source or kernel_source("gemm_sm90a")
    if dtype == "bfloat16":
        src = "#define GEMM_BF16\n" + src
    smem = 1024 + 2 * (GEMM_BM + GEMM_BN) * GEMM_BK * 2 + 2 * 64 * GEMM_BN * 4
    return EmulatedKernel.build(
        src, "gemm_sm90a",
        [Buffer("map_a", "uint8"), Buffer("map_b", "uint8"), Buffer("map_c", "uint8"),
         Buffer("A", dtype), Buffer("B", dtype), Buffer("C", "float32"),
         Scalar("M", M), Scalar("N", N), Scalar("K", K)],
        LaunchConfig((-(-N // GEMM_BN), -(-M // GEMM_BM), 1), (384, 1, 1), dynamic_smem=smem),
        file="gemm_sm90a.cu",
    )


def gemm_args(M: int, N: int, K: int, seed: int = 0, dtype: str = "float16"):
    """The tensor maps and operands of gemm_sm90a (A: M x K, B: N x K, C: M x N)."""
    rng = np.random.default_rng(seed)
    elem = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    a = rng.standard_normal((M, K)).astype(elem)
    b = rng.standard_normal((N, K)).astype(elem)
    c = np.full((M, N), np.nan, np.float32)
    maps = (tensor_map(3, a, (GEMM_BK, GEMM_BM), 128), tensor_map(4, b, (GEMM_BK, GEMM_BN), 128),
            tensor_map(5, c, (GEMM_BN, 64)))
    return (*maps, a, b, c)
