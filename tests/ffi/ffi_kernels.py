"""Tiny TVM kernels following jaxtile's CPU kernel ABI, for the runtime tests.

Every kernel takes (block_begin, block_end) and then one buffer per XLA operand and result,
and runs the grid blocks in [block_begin, block_end).
"""

import tvm
from tvm.script import tirx as T

BLOCK = 8  # elements per block of `vadd`
ROW = 4096  # floats per block of `reverse_rows`: 16 KiB of scratch, beyond TVM's stack limit
TVM_ALIGNMENT = 64  # the data alignment TVM compiles these kernels to assume (its default)


@T.prim_func
def vadd(block_begin: T.int64, block_end: T.int64, a: T.handle, b: T.handle, c: T.handle):
    T.func_attr({"tir.noalias": True})
    n = T.int64()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    C = T.match_buffer(c, (n,), "float32")
    for blk in range(block_begin, block_end):
        for i in range(BLOCK):
            if blk * BLOCK + i < n:
                C[blk * BLOCK + i] = A[blk * BLOCK + i] + B[blk * BLOCK + i]


@T.prim_func
def vmul(block_begin: T.int64, block_end: T.int64, a: T.handle, b: T.handle, c: T.handle):
    """`vadd`'s signature with another result: a kernel taken for the other one shows."""
    T.func_attr({"tir.noalias": True})
    n = T.int64()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    C = T.match_buffer(c, (n,), "float32")
    for blk in range(block_begin, block_end):
        for i in range(BLOCK):
            if blk * BLOCK + i < n:
                C[blk * BLOCK + i] = A[blk * BLOCK + i] * B[blk * BLOCK + i]


@T.prim_func
def reverse_rows(block_begin: T.int64, block_end: T.int64, a: T.handle, c: T.handle):
    T.func_attr({"tir.noalias": True})
    rows = T.int64()
    A = T.match_buffer(a, (rows, ROW), "float32")
    C = T.match_buffer(c, (rows, ROW), "float32")
    scratch = T.alloc_buffer((ROW,), "float32")
    for blk in range(block_begin, block_end):
        for i in range(ROW):
            scratch[i] = A[blk, i] * T.float32(2)
        for i in range(ROW):
            C[blk, i] = scratch[ROW - 1 - i]


@T.prim_func
def parallel_scale(block_begin: T.int64, block_end: T.int64, a: T.handle, c: T.handle):
    T.func_attr({"tir.noalias": True})
    A = T.match_buffer(a, (64,), "float32")
    C = T.match_buffer(c, (64,), "float32")
    for _blk in range(block_begin, block_end):
        for i in T.parallel(64):
            C[i] = A[i] * T.float32(3)


@T.prim_func
def mixed_sum(
    block_begin: T.int64,
    block_end: T.int64,
    a: T.handle,
    b: T.handle,
    c: T.handle,
    d: T.handle,
    e: T.handle,
    o: T.handle,
):
    T.func_attr({"tir.noalias": True})
    A = T.match_buffer(a, (16,), "int8")
    B = T.match_buffer(b, (16,), "bool")
    C = T.match_buffer(c, (16,), "float16")
    D = T.match_buffer(d, (16,), "bfloat16")
    E = T.match_buffer(e, (16,), "uint16")
    Out = T.match_buffer(o, (16,), "float64")
    for _blk in range(block_begin, block_end):
        for i in range(16):
            Out[i] = (
                T.Cast("float64", A[i])
                + T.Cast("float64", B[i])
                + T.Cast("float64", C[i])
                + T.Cast("float64", T.Cast("float32", D[i]))
                + T.Cast("float64", E[i])
            )


def build(path):
    """Compile every kernel above into one library at `path`, exporting `__tvm_ffi_<name>`."""
    mod = tvm.IRModule(
        {
            "vadd": vadd,
            "vmul": vmul,
            "reverse_rows": reverse_rows,
            "parallel_scale": parallel_scale,
            "mixed_sum": mixed_sum,
        }
    )
    cpu = tvm.get_global_func("target.llvm_get_system_cpu")()
    tvm.compile(mod, target={"kind": "llvm", "mcpu": cpu}).export_library(str(path))
