"""Tests for compiler.cpu.tir_emit (build TIR kernels, compile, export, load and run them)
and for the compiler.cpu.vector_math expressions, compiled through it."""

from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx

from jaxtile import _ffi
from jaxtile.compiler.cpu import tir_emit
from jaxtile.compiler.cpu import vector_math as vm

CPU = tir_emit.host_cpu()


def _compile_and_load(kb: tir_emit.KernelBuilder, tmp_path, **build_kwargs):
    """Build, export and load a kernel; return (runtime module, function)."""
    lib = tir_emit.reload_ir(tir_emit.build(kb.finish(), CPU, **build_kwargs))
    path = str(tmp_path / f"{kb.name}.so")
    tir_emit.export(lib, path)
    mod = tvm.runtime.load_module(path)
    return lib, mod[kb.name]


def _vector_add(n: int, dtype: str) -> tir_emit.KernelBuilder:
    """out = x + y; block b covers [b*64, min(b*64 + 64, n))."""
    kb = tir_emit.KernelBuilder(
        f"vadd_{dtype}", [("x", (n,), dtype), ("y", (n,), dtype), ("out", (n,), dtype)]
    )
    x, y, out = kb.buffers
    with kb.block_loop() as b:
        start = kb.let("start", b * 64)
        with kb.if_(start + 64 <= n):
            with kb.loop("i", 64, kind="vectorized") as i:
                kb.store(out, [start + i], x[start + i] + y[start + i])
        with kb.else_():
            with kb.loop("t", n - start) as i:
                kb.store(out, [start + i], x[start + i] + y[start + i])
    return kb


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
def test_blocked_vector_add_with_tail(dtype, tmp_path):
    n = 1000  # 15 full blocks and a 40-element tail
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * 100).astype(np_dtype)
    y = (rng.standard_normal(n) * 100).astype(np_dtype)
    _, fn = _compile_and_load(_vector_add(n, dtype), tmp_path)

    out = tvm.runtime.tensor(np.zeros(n, np_dtype))
    fn(0, 16, tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    expected = (x.astype(np.float32) + y.astype(np.float32)).astype(np_dtype)
    np.testing.assert_array_equal(out.numpy(), expected)

    # Only blocks [3, 5) are written.
    out = tvm.runtime.tensor(np.zeros(n, np_dtype))
    fn(3, 5, tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    got = out.numpy().astype(np.float32)
    np.testing.assert_array_equal(got[192:320], expected[192:320].astype(np.float32))
    assert not got[:192].any() and not got[320:].any()


def test_exported_object_has_no_debug_info(tmp_path):
    """reload_ir drops the debug info TVM always emits; the machine code stays the same
    (the same kernel exported straight from build still has it: the check bites)."""
    built = tir_emit.build(_vector_add(1000, "float32").finish(), CPU)
    plain, lean = str(tmp_path / "plain.o"), str(tmp_path / "lean.o")
    built.write_to_file(plain)
    tir_emit.reload_ir(built).write_to_file(lean)
    with open(plain, "rb") as f:
        assert b".debug_info" in f.read()
    with open(lean, "rb") as f:
        assert b".debug_info" not in f.read()

    def instructions(path):
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], check=True,
                              capture_output=True, text=True).stdout
        return [line.split("\t", 1)[1] for line in text.splitlines() if "\t" in line]

    assert instructions(plain) == instructions(lean)
    assert len(instructions(lean)) > 50


def test_without_debug_info_text():
    text = (
        "define i32 @f(i32 %a) #0 !dbg !5 {\n"
        "  #dbg_value(i32 %a, !9, !DIExpression(), !10)\n"
        "  %b = add i32 %a, 1, !dbg !10\n"
        "  call void @llvm.dbg.value(metadata i32 %b, metadata !9, metadata !DIExpression())\n"
        "  ret i32 %b, !dbg !11\n"
        "}\n"
        "declare void @llvm.dbg.value(metadata, metadata, metadata)\n"
        "!llvm.dbg.cu = !{!0}\n"
        "!llvm.module.flags = !{!2}\n"
    )
    assert tir_emit.without_debug_info(text) == (
        "define i32 @f(i32 %a) #0 {\n"
        "  %b = add i32 %a, 1\n"
        "  ret i32 %b\n"
        "}\n"
        "!llvm.module.flags = !{!2}\n"
    )


def test_vector_add_on_16_byte_aligned_data(tmp_path):
    """Buffers are declared 16-byte aligned, so data that is not 64-byte aligned works."""
    n = 1000
    lib, _ = _compile_and_load(_vector_add(n, "float32"), tmp_path)
    ll = lib.inspect_source("ll")
    assumed = set(re.findall(r'"align"\(ptr %[\w.]+, i64 (\d+)\)', ll))
    assert assumed == {"16"}, assumed
    assert re.search(r"<(16|32|64) x float>", ll), "the 64-wide loop was not vectorised"

    def misaligned(values):
        base = np.zeros(n + 32, np.float32)
        start = (-(base.ctypes.data // 4)) % 16 + 4  # 64-byte boundary + 16 bytes
        view = base[start : start + n]
        view[:] = values
        assert view.ctypes.data % 64 == 16
        return view

    x = misaligned(np.arange(n))
    y = misaligned(np.arange(n) * 2)
    out = misaligned(np.zeros(n))
    mod = tvm_ffi.load_module(str(tmp_path / "vadd_float32.so"))
    mod["vadd_float32"](0, 16, *(tvm_ffi.from_dlpack(a) for a in (x, y, out)))
    np.testing.assert_array_equal(out, np.arange(n) * 3)


def _row_softmax(rows: int, cols: int) -> tir_emit.KernelBuilder:
    """Softmax over each row of x; block b is row b. Lane-parallel partial max/sum."""
    lanes = 16
    full = cols // lanes * lanes
    kb = tir_emit.KernelBuilder(
        "softmax", [("x", (rows, cols), "float32"), ("y", (rows, cols), "float32")]
    )
    x, y = kb.buffers
    part = kb.alloc_local("part", (lanes,), "float32")
    total = kb.alloc_local("total", (1,), "float32")
    with kb.block_loop() as r:
        with kb.loop("l0", lanes, kind="vectorized") as lane:
            kb.store(part, [lane], float("-inf"))
        with kb.loop("c0", full // lanes) as c:
            with kb.loop("l1", lanes, kind="vectorized") as lane:
                kb.store(part, [lane], vm.maximum(part[lane], x[r, c * lanes + lane]))
        kb.store(total, [0], float("-inf"))
        with kb.loop("l2", lanes) as lane:
            kb.store(total, [0], vm.maximum(total[0], part[lane]))
        with kb.loop("t0", cols - full) as t:
            kb.store(total, [0], vm.maximum(total[0], x[r, full + t]))
        row_max = kb.let("row_max", total[0])

        with kb.loop("l3", lanes, kind="vectorized") as lane:
            kb.store(part, [lane], 0.0)
        with kb.loop("c1", full // lanes) as c:
            with kb.loop("l4", lanes, kind="vectorized") as lane:
                e = vm.exp_f32(x[r, c * lanes + lane] - row_max)
                kb.store(y, [r, c * lanes + lane], e)
                kb.store(part, [lane], part[lane] + y[r, c * lanes + lane])
        kb.store(total, [0], 0.0)
        with kb.loop("t1", cols - full) as t:
            kb.store(y, [r, full + t], vm.exp_f32(x[r, full + t] - row_max))
            kb.store(total, [0], total[0] + y[r, full + t])
        with kb.loop("l5", lanes) as lane:
            kb.store(total, [0], total[0] + part[lane])
        inv = kb.let("inv", tirx.const(1.0, "float32") / total[0])
        with kb.loop("c2", full // lanes) as c:
            with kb.loop("l6", lanes, kind="vectorized") as lane:
                kb.store(y, [r, c * lanes + lane], y[r, c * lanes + lane] * inv)
        with kb.loop("t2", cols - full) as t:
            kb.store(y, [r, full + t], y[r, full + t] * inv)
    return kb


def test_row_softmax(tmp_path):
    rows, cols = 37, 1003
    lib, fn = _compile_and_load(_row_softmax(rows, cols), tmp_path)
    ll = lib.inspect_source("ll")
    assert "<16 x float>" in ll
    assert not re.search(r"@(expf|llvm\.exp\.)", ll), "exp_f32 should not call expf"

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, cols)) * 20).astype(np.float32)
    x[3, 10] = 1e30  # one dominant entry
    x[4, :] = -1e30  # constant row
    y = tvm.runtime.tensor(np.zeros((rows, cols), np.float32))
    fn(0, rows, tvm.runtime.tensor(x), y)
    shifted = x - x.max(axis=1, keepdims=True)  # rounded to float32 like in the kernel
    e = np.exp(shifted.astype(np.float64))
    np.testing.assert_allclose(y.numpy(), e / e.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-37)


def _tiled_matmul(
    m: int, n: int, k: int, tm: int = 64, tn: int = 64, tk: int = 32
) -> tir_emit.KernelBuilder:
    """c = a @ b with a (tm, tn) output tile per block, k-steps of tk, zero-padded edge tiles."""
    n_tiles_n, n_steps = -(-n // tn), -(-k // tk)
    kb = tir_emit.KernelBuilder(
        "matmul", [("a", (m, k), "float32"), ("b", (k, n), "float32"), ("c", (m, n), "float32")]
    )
    a, b, c = kb.buffers
    acc = kb.alloc_local("acc", (tm, tn), "float32")
    a_tile = kb.alloc_local("a_tile", (tm, tk), "float32")
    b_tile = kb.alloc_local("b_tile", (tk, tn), "float32")

    def load_tile(dst, src, r0, c0, rows, cols, src_rows, src_cols, tag):
        with kb.if_(tirx.And(r0 + rows <= src_rows, c0 + cols <= src_cols)):
            with kb.loop(tag + "_r", rows) as i:
                with kb.loop(tag + "_c", cols, kind="vectorized") as j:
                    kb.store(dst, [i, j], src[r0 + i, c0 + j])
        with kb.else_():
            with kb.loop(tag + "_pr", rows) as i:
                with kb.loop(tag + "_pc", cols) as j:
                    inside = tirx.And(r0 + i < src_rows, c0 + j < src_cols)
                    value = tirx.if_then_else(
                        inside, src[r0 + i, c0 + j], tirx.const(0.0, "float32")
                    )
                    kb.store(dst, [i, j], value)

    with kb.block_loop() as blk:
        m0 = kb.let("m0", tirx.Cast("int32", blk // n_tiles_n) * tm)
        n0 = kb.let("n0", tirx.Cast("int32", blk % n_tiles_n) * tn)
        with kb.loop("zi", tm) as i:
            with kb.loop("zj", tn, kind="vectorized") as j:
                kb.store(acc, [i, j], 0.0)
        with kb.loop("ks", n_steps) as ks:
            k0 = kb.let("k0", ks * tk)
            load_tile(a_tile, a, m0, k0, tm, tk, m, k, "la")
            load_tile(b_tile, b, k0, n0, tk, tn, k, n, "lb")
            with kb.loop("i", tm) as i:
                with kb.loop("kk", tk) as kk:
                    with kb.loop("j", tn, kind="vectorized") as j:
                        kb.store(acc, [i, j], acc[i, j] + a_tile[i, kk] * b_tile[kk, j])
        with kb.if_(tirx.And(m0 + tm <= m, n0 + tn <= n)):
            with kb.loop("si", tm) as i:
                with kb.loop("sj", tn, kind="vectorized") as j:
                    kb.store(c, [m0 + i, n0 + j], acc[i, j])
        with kb.else_():
            with kb.loop("pi", tm) as i:
                with kb.loop("pj", tn) as j:
                    with kb.if_(tirx.And(m0 + i < m, n0 + j < n)):
                        kb.store(c, [m0 + i, n0 + j], acc[i, j])
    return kb


@pytest.mark.parametrize("shape", [(200, 150, 77), (128, 64, 64)])
def test_tiled_matmul(shape, tmp_path):
    m, n, k = shape
    lib, fn = _compile_and_load(_tiled_matmul(m, n, k), tmp_path)
    ll = lib.inspect_source("ll")
    assert "TVMBackendAllocWorkspace" not in ll, "local tiles must be stack allocations"
    assert re.search(r"alloca \[4096 x float\]", ll), "acc should be one 16 KiB stack array"

    rng = np.random.default_rng(2)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = tvm.runtime.tensor(np.full((m, n), np.nan, np.float32))
    blocks = -(-m // 64) * -(-n // 64)
    fn(0, blocks, tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def _ordered(v: np.ndarray) -> np.ndarray:
    """float32 bit patterns mapped to integers monotone in the value (ulp distance)."""
    bits = v.view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def test_exp_f32_accuracy(tmp_path):
    n = 1 << 20
    kb = tir_emit.KernelBuilder("exp", [("x", (n,), "float32"), ("y", (n,), "float32")])
    x, y = kb.buffers
    with kb.block_loop() as b:
        with kb.loop("i", 16, kind="vectorized") as i:
            kb.store(y, [b * 16 + i], vm.exp_f32(x[b * 16 + i]))
    _, fn = _compile_and_load(kb, tmp_path)

    edges = np.array(
        [0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, 0.34657359, -0.34657359, 0.6931472,
         88.0, 88.72283, 88.72284, 88.7229, 89.0, 100.0, 1e30, np.inf,
         -87.33, -87.34, -100.0, -103.27, -103.97, -103.98, -104.0, -1e30, -np.inf, np.nan],
        np.float32,
    )  # fmt: skip
    rng = np.random.default_rng(3)
    xs = np.concatenate(
        [
            edges,
            rng.uniform(-110.0, 95.0, n // 2).astype(np.float32),
            rng.uniform(-1.0, 1.0, n // 4).astype(np.float32),
            # random bit patterns: every exponent, NaNs, infs, subnormals
            rng.integers(0, 2**32, n - n // 2 - n // 4 - len(edges), dtype=np.uint32).view(
                np.float32
            ),
        ]
    )
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    fn(0, n // 16, tvm.runtime.tensor(xs), out)
    got = out.numpy()
    with np.errstate(all="ignore"):
        ref = np.exp(xs.astype(np.float64)).astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    np.testing.assert_array_equal(got[ref == 0], 0.0)
    assert np.abs(_ordered(got[~nan]) - _ordered(ref[~nan])).max() <= 2


def test_float_helpers(tmp_path):
    vals = np.array([-3, -0.5, 0, 2, np.nan, np.inf, -np.inf, 4] * 2, np.float32)
    n = len(vals)
    kb = tir_emit.KernelBuilder(
        "helpers", [("x", (n,), "float32"), ("h", (n,), "float16"), ("out", (4, n), "float32")]
    )
    x, h, out = kb.buffers
    with kb.block_loop():
        with kb.loop("i", n, kind="vectorized") as i:
            kb.store(out, [0, i], vm.maximum(x[i], 1.0))
            kb.store(out, [1, i], vm.minimum(x[i], 1.0))
            kb.store(out, [2, i], vm.rsqrt(x[i]))
            kb.store(
                out, [3, i], tirx.Cast("float32", vm.maximum(h[i], tirx.const(1.0, "float16")))
            )
    lib, fn = _compile_and_load(kb, tmp_path)
    assert "llvm.sqrt.v16f32" in lib.inspect_source("ll")
    res = tvm.runtime.tensor(np.zeros((4, n), np.float32))
    fn(0, 1, tvm.runtime.tensor(vals), tvm.runtime.tensor(vals.astype(np.float16)), res)
    with np.errstate(all="ignore"):
        expected = [
            np.maximum(vals, 1),
            np.minimum(vals, 1),
            1 / np.sqrt(vals),
            np.maximum(vals, 1),
        ]
    np.testing.assert_array_equal(res.numpy(), np.array(expected, np.float32))


def test_bfloat16_bindings_and_rounding(tmp_path):
    """let() of bfloat16-derived values, exp_f32 of them, and explicit bfloat16 rounding."""
    n = 4096
    kb = tir_emit.KernelBuilder(
        "bf16", [("x", (n,), "bfloat16"), ("u", (n,), "float32"), ("out", (3, n), "float32")]
    )
    x, u, out = kb.buffers
    local = kb.alloc_local("local", (16,), "bfloat16")
    with kb.block_loop() as b:
        with kb.loop("i", 16, kind="vectorized") as i:
            kb.store(local, [i], x[b * 16 + i])
        with kb.loop("j", 16, kind="vectorized") as j:
            k = b * 16 + j
            a = kb.let("a", tirx.Cast("float32", x[k]))  # bfloat16 parameter
            c = kb.let("c", tirx.Cast("float32", local[j]) * 2.0)  # bfloat16 local array
            kb.store(out, [0, k], vm.exp_f32(a))
            kb.store(out, [1, k], c)
            kb.store(out, [2, k], vm.round_to_bfloat16(u[k]))
    _, fn = _compile_and_load(kb, tmp_path)

    rng = np.random.default_rng(4)
    xv = rng.uniform(-20, 20, n).astype(ml_dtypes.bfloat16)
    uv = rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)
    uv[:4] = [np.inf, -np.inf, np.nan, 3.4028235e38]
    res = tvm.runtime.tensor(np.zeros((3, n), np.float32))
    fn(0, n // 16, tvm.runtime.tensor(xv), tvm.runtime.tensor(uv), res)
    got = res.numpy()
    xf = xv.astype(np.float32)
    np.testing.assert_allclose(got[0], np.exp(xf.astype(np.float64)), rtol=3e-7)
    np.testing.assert_array_equal(got[1], xf * 2)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got[2], uv.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_bfloat16_bindings_tvm_would_miscompile_are_rejected():
    kb = tir_emit.KernelBuilder("bad_let", [("x", (16,), "bfloat16"), ("y", (16,), "float32")])
    x, y = kb.buffers
    with pytest.raises(ValueError, match="bfloat16"):
        vm.exp_f32(tirx.Cast("float32", x[0]))
    with kb.block_loop():
        with kb.loop("i", 16) as i:
            var = tirx.Var("v", "float32")
            kb.store(y, [i], tirx.Let(var, tirx.Cast("float32", x[i]), var + 1.0))
    with pytest.raises(ValueError, match="bfloat16"):
        tir_emit.build(kb.finish(), CPU)


def test_raw_c_abi_without_checks(tmp_path):
    """Call the exported symbol directly through the tvm-ffi C calling convention."""

    class DLTensor(ctypes.Structure):
        _fields_ = [
            ("data", ctypes.c_void_p),
            ("device_type", ctypes.c_int32),
            ("device_id", ctypes.c_int32),
            ("ndim", ctypes.c_int32),
            ("dtype_code", ctypes.c_uint8),
            ("dtype_bits", ctypes.c_uint8),
            ("dtype_lanes", ctypes.c_uint16),
            ("shape", ctypes.POINTER(ctypes.c_int64)),
            ("strides", ctypes.POINTER(ctypes.c_int64)),
            ("byte_offset", ctypes.c_uint64),
        ]

    class TVMFFIAny(ctypes.Structure):
        _fields_ = [
            ("type_index", ctypes.c_int32),
            ("pad", ctypes.c_uint32),
            ("value", ctypes.c_int64),
        ]

    n = 200
    _compile_and_load(_vector_add(n, "float32"), tmp_path, checks=False)
    lib = ctypes.CDLL(str(tmp_path / "vadd_float32.so"))
    func = getattr(lib, tir_emit.ffi_symbol("vadd_float32"))
    func.restype = ctypes.c_int32

    arrays = [np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32), np.zeros(n, np.float32)]
    shape = (ctypes.c_int64 * 1)(n)
    tensors = [DLTensor(a.ctypes.data, 1, 0, 1, 2, 32, 1, shape, None, 0) for a in arrays]
    k_int, k_dltensor_ptr = 1, 7
    args = (TVMFFIAny * 5)(
        TVMFFIAny(k_int, 0, 0),
        TVMFFIAny(k_int, 0, 4),
        *(TVMFFIAny(k_dltensor_ptr, 0, ctypes.addressof(t)) for t in tensors),
    )
    result = TVMFFIAny(0, 0, 0)
    assert func(None, args, 5, ctypes.byref(result)) == 0
    np.testing.assert_array_equal(arrays[2], np.arange(n) + 0.5)


def _ifs(func: tirx.PrimFunc) -> int:
    return sum(isinstance(node, tirx.IfThenElse) for node in tir_emit._nodes(func.body))


def _gridded_add(n: int, blocks: int | None) -> tir_emit.KernelBuilder:
    """:func:`_vector_add` on a kernel that declares its grid."""
    kb = tir_emit.KernelBuilder(f"gadd_{n}_{blocks}", [("x", (n,), "float32"),
                                                      ("out", (n,), "float32")], blocks=blocks)
    x, out = kb.buffers
    with kb.block_loop() as b:
        start = kb.let("start", tirx.Cast("int32", b) * 64)
        with kb.if_(start + 64 <= n):
            with kb.loop("i", 64, kind="vectorized") as i:
                kb.store(out, [start + i], x[start + i] + 1.0)
        with kb.else_():
            with kb.loop("t", n - start) as i:
                kb.store(out, [start + i], x[start + i] + 2.0)
    return kb


def test_static_grid_decides_guards_and_clamps_the_block_range(tmp_path):
    # 4 blocks of 64 cover 256 exactly: every block is whole, so only the vector path is
    # emitted, and blocks asked for outside [0, 4) are not run.
    kb = _gridded_add(256, 4)
    func = kb.finish()
    assert _ifs(func) == 0
    x = np.arange(256, dtype=np.float32)
    lib = tir_emit.reload_ir(tir_emit.build(func, CPU))
    path = str(tmp_path / "gadd.so")
    tir_emit.export(lib, path)
    fn = tvm.runtime.load_module(path)[kb.name]
    for begin, end, written in [(0, 4, (0, 256)), (2, 100, (128, 256)), (-7, 1, (0, 64)),
                                (5, 9, (0, 0))]:
        out = tvm.runtime.tensor(np.zeros(256, np.float32))
        fn(begin, end, tvm.runtime.tensor(x), out)
        expected = np.zeros(256, np.float32)
        expected[written[0]:written[1]] = x[written[0]:written[1]] + 1.0
        np.testing.assert_array_equal(out.numpy(), expected)
    # A fifth block would straddle the end: the guard stays, and the tail path runs.
    assert _ifs(_gridded_add(256, 5).finish()) == 1
    # Without a declared grid nothing is decided.
    assert _ifs(_gridded_add(256, None).finish()) == 1
    kb = _gridded_add(300, 5)
    x = np.arange(300, dtype=np.float32)
    _, fn = _compile_and_load(kb, tmp_path)
    out = tvm.runtime.tensor(np.zeros(300, np.float32))
    fn(0, 5, tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), np.concatenate([x[:256] + 1.0, x[256:] + 2.0]))


def test_guards_decided_false_keep_the_else_and_loads_are_never_decided():
    kb = tir_emit.KernelBuilder("guards", [("c", (4,), "int32")], blocks=4)
    (c,) = kb.buffers
    with kb.block_loop() as b:
        with kb.if_(b >= 4):            # never: the grid has 4 blocks
            kb.store(c, [0], 1)
        with kb.else_():
            kb.store(c, [1], 2)
        with kb.if_(c[0] == c[0]):      # a load: memory may change between two reads
            kb.store(c, [2], 3)
        with kb.if_(b < 4):             # always
            kb.store(c, [3], 4)
        with kb.else_():
            kb.store(c, [3], 5)
    func = kb.finish()
    stores = [(int(n.indices[0].value), int(n.value.value)) for n in tir_emit._nodes(func.body)
              if isinstance(n, tirx.BufferStore)]
    assert sorted(stores) == [(1, 2), (2, 3), (3, 4)]
    assert _ifs(func) == 1


def test_builder_rejects_misuse():
    kb = tir_emit.KernelBuilder("bad", [("x", (8,), "float32")])
    with pytest.raises(ValueError):
        with kb.else_():
            pass
    with pytest.raises(ValueError):
        with kb.loop("i", kb.block_end - kb.block_begin, kind="vectorized"):
            pass
    with pytest.raises(ValueError):
        tir_emit.KernelBuilder("not-an-identifier", [])


@pytest.mark.parametrize("n", [37, 1000])
def test_dynamic_sizes_are_bound_without_checks(n, tmp_path):
    # jaxtile builds its kernels without TVM's entry assertions (the FFI handler checks the
    # calls); the packed entry must still bind a dynamic size from the buffers' shapes.
    kb = _vector_add(tirx.Var("n", "int32"), "float32")
    lib, fn = _compile_and_load(kb, tmp_path, checks=False)
    checked = tir_emit.build(_vector_add(tirx.Var("n", "int32"), "float32").finish(), CPU)
    assert "Mismatched" in checked.inspect_source("ll")
    assert "Mismatched" not in lib.inspect_source("ll")
    x, y = np.arange(n, dtype=np.float32), np.full(n, 0.25, np.float32)
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    fn(0, -(-n // 64), tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    np.testing.assert_array_equal(out.numpy(), x + y)


def _libm_exp_kernel(n: int) -> tir_emit.KernelBuilder:
    """out = exp(x) in float64 (one libm call per element: an undefined symbol of the
    object, resolved in the process) with TVM's entry checks (whose error function is
    another)."""
    kb = tir_emit.KernelBuilder("libm_exp", [("x", (n,), "float64"), ("out", (n,), "float64")])
    x, out = kb.buffers
    with kb.block_loop():
        with kb.loop("i", n) as i:
            kb.store(out, [i], tirx.exp(x[i]))
    return kb


def test_object_code_links_in_process(tmp_path):
    """object_code's object is what jaxtile's FFI links itself: a relocatable ELF object
    whose calls to libm and to the runtime resolve, and whose result is exact."""
    if not _ffi.CPU_LINKS_OBJECTS:
        pytest.skip("the FFI links objects on x86-64 Linux only")
    n = 100
    data = tir_emit.object_code(tir_emit.reload_ir(tir_emit.build(_libm_exp_kernel(n).finish(),
                                                                  CPU)))
    assert data[:4] == b"\x7fELF" and data[16] == 1  # e_type ET_REL: not linked
    assert b"exp\0" in data and b"TVMFFIErrorSetRaisedFromCStrParts" in data
    path = tmp_path / "kernel.o"
    path.write_bytes(data)
    key = f"tir-emit-object-{id(data)}"
    _ffi.load_kernel(key, str(path), "libm_exp", 1, alignment=16)
    x = np.concatenate([np.linspace(-700, 700, n - 4), [0.0, -np.inf, np.inf, np.nan]])
    out = np.zeros(n)
    _ffi.call_kernel(key, [x, out])
    # glibc's exp, which the kernel calls (numpy's own differs in the last bit here and there).
    np.testing.assert_array_equal(out, [math.inf if v >= 710 else math.exp(v) for v in x])


# A kernel compiled, cached, loaded and run by a process whose PATH has no `ld`.
_WITHOUT_LD = r"""
import shutil, sys
import jax, jax.numpy as jnp, numpy as np
import jaxtile as jt
from jaxtile.compiler import cache

assert shutil.which("ld") is None, shutil.which("ld")
x = np.random.default_rng(0).standard_normal((37, 200)).astype(np.float32)
x[3, :5] = -np.inf
got = np.asarray(jax.jit(jt.ops.softmax)(x))
e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-7)
kinds = sorted({e.kind for e in cache._memory.values()})
print(cache.stats()["stored"], *kinds)
"""


def test_kernels_compile_and_run_without_ld(tmp_path):
    if not _ffi.CPU_LINKS_OBJECTS:
        pytest.skip("machines whose FFI does not link objects link kernels with ld")
    bin_dir = os.path.dirname(sys.executable)
    assert shutil.which("ld", path=bin_dir) is None
    env = dict(os.environ, PATH=bin_dir, JAXTILE_CACHE_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_LD], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stored, *kinds = proc.stdout.split()
    assert int(stored) >= 1 and kinds == ["cpu-object"], proc.stdout
