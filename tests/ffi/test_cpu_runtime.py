"""The CPU runtime behind the `jaxtile_cpu_call` custom call, driven through jax.ffi."""

import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from ffi_kernels import BLOCK, ROW, TVM_ALIGNMENT


def ffi_call(key, out_shape, out_dtype, *operands):
    out = jax.ShapeDtypeStruct(out_shape, out_dtype)
    return jax.ffi.ffi_call("jaxtile_cpu_call", out)(*operands, key=key)


def jitted_vadd(key):
    return jax.jit(lambda x, y: ffi_call(key, x.shape, x.dtype, x, y))


def aligned_empty(shape, dtype, align=64):
    """numpy only guarantees 16-byte alignment; kernels assume 64."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    offset = -raw.ctypes.data % align
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def blocks_for(n):
    return -(-n // BLOCK)


@pytest.mark.parametrize("n", [1, 8, 21, 1000])
def test_vadd_under_jit(ffi, kernel_lib, n):
    key = f"vadd-{n}"
    ffi.load_kernel(key, kernel_lib, "vadd", blocks_for(n), alignment=TVM_ALIGNMENT)
    x = jnp.arange(n, dtype=jnp.float32)
    y = jnp.full(n, 0.5, jnp.float32)
    np.testing.assert_array_equal(jitted_vadd(key)(x, y), np.asarray(x) + np.asarray(y))


def test_parallel_split_uneven(ffi, kernel_lib):
    # 13 blocks never divide evenly between 2, 3 or 4 threads; a block skipped or run twice
    # shows up as uninitialised output.
    n = 13 * BLOCK - 3
    ffi.load_kernel("vadd-uneven", kernel_lib, "vadd", blocks_for(n), alignment=TVM_ALIGNMENT)
    x = jnp.linspace(-1, 1, n, dtype=jnp.float32)
    fn = jitted_vadd("vadd-uneven")
    for _ in range(20):
        np.testing.assert_array_equal(fn(x, x), 2 * np.asarray(x))


def library_mentions(path, symbol):
    with open(path, "rb") as f:
        return symbol.encode() in f.read()


def test_workspace_allocation_across_threads(ffi, kernel_lib):
    # The scratch row is too big for the stack, so TVM allocates it through its runtime slot.
    assert library_mentions(kernel_lib, "__TVMBackendAllocWorkspace")
    rows = 7
    ffi.load_kernel("reverse-rows", kernel_lib, "reverse_rows", rows, alignment=TVM_ALIGNMENT)
    x = jnp.arange(rows * ROW, dtype=jnp.float32).reshape(rows, ROW)
    out = jax.jit(lambda a: ffi_call("reverse-rows", a.shape, a.dtype, a))(x)
    np.testing.assert_array_equal(out, 2 * np.asarray(x)[:, ::-1])


def test_tvm_parallel_loop_runs_serially(ffi, kernel_lib):
    assert library_mentions(kernel_lib, "__TVMBackendParallelLaunch")
    ffi.load_kernel("parallel-scale", kernel_lib, "parallel_scale", 1, alignment=TVM_ALIGNMENT)
    x = jnp.arange(64, dtype=jnp.float32)
    out = jax.jit(lambda a: ffi_call("parallel-scale", a.shape, a.dtype, a))(x)
    np.testing.assert_array_equal(out, 3 * np.asarray(x))


def test_dtype_mapping(ffi, kernel_lib):
    ffi.load_kernel("mixed-sum", kernel_lib, "__tvm_ffi_mixed_sum", 1, alignment=TVM_ALIGNMENT)
    rng = np.random.default_rng(0)
    operands = [
        rng.integers(-100, 100, 16).astype(np.int8),
        rng.integers(0, 2, 16).astype(np.bool_),
        rng.standard_normal(16).astype(np.float16),
        rng.standard_normal(16).astype(ml_dtypes.bfloat16),
        rng.integers(0, 60000, 16).astype(np.uint16),
    ]
    out = jax.jit(lambda *a: ffi_call("mixed-sum", (16,), jnp.float64, *a))(*operands)
    expected = sum(np.asarray(a).astype(np.float64) for a in operands)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_call_kernel_subrange(ffi, kernel_lib):
    n = 10 * BLOCK
    ffi.load_kernel("vadd-direct", kernel_lib, "vadd", 10, alignment=TVM_ALIGNMENT)
    x, y, out = (aligned_empty((n,), np.float32) for _ in range(3))
    x[:] = np.arange(n)
    y[:] = 1
    out[:] = -1
    ffi.call_kernel("vadd-direct", [x, y, out], 3, 7)
    expected = np.full(n, -1, np.float32)
    expected[3 * BLOCK : 7 * BLOCK] = x[3 * BLOCK : 7 * BLOCK] + 1
    np.testing.assert_array_equal(out, expected)


def test_concurrent_callers(ffi, kernel_lib):
    # Callers that find the pool busy run their blocks themselves; results must not mix.
    n = 64 * BLOCK
    ffi.load_kernel("vadd-threads", kernel_lib, "vadd", 64, alignment=TVM_ALIGNMENT)
    errors = []

    def worker(seed):
        try:
            x, out = aligned_empty((n,), np.float32), aligned_empty((n,), np.float32)
            x[:] = seed
            for _ in range(200):
                ffi.call_kernel("vadd-threads", [x, x, out])
                np.testing.assert_array_equal(out, 2 * x)
        except Exception as e:  # reported from the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_zero_blocks_is_a_no_op(ffi, kernel_lib):
    ffi.load_kernel("vadd-empty", kernel_lib, "vadd", 0, alignment=TVM_ALIGNMENT)
    x = jnp.ones(8, jnp.float32)
    jitted_vadd("vadd-empty")(x, x).block_until_ready()


def test_load_is_idempotent(ffi, kernel_lib):
    ffi.load_kernel("vadd-twice", kernel_lib, "vadd", 2, alignment=TVM_ALIGNMENT)
    ffi.load_kernel("vadd-twice", kernel_lib, "vadd", 2, alignment=TVM_ALIGNMENT)
    assert ffi.is_loaded("vadd-twice")
    assert ffi.loaded_keys().count("vadd-twice") == 1
    assert not ffi.is_loaded("never-loaded")
    assert ffi.num_threads() >= 1


def test_alternating_kernels_each_run_their_own(ffi, kernel_lib):
    """The handler keeps the kernel it found last and checks it by its key: calls that
    alternate between two kernels whose keys differ only in their last character, one after
    the other and inside one program, each run their own; an unknown key after them is still
    an error."""
    n = 21
    ffi.load_kernel("alternate-kernel-1", kernel_lib, "vadd", blocks_for(n),
                    alignment=TVM_ALIGNMENT)
    ffi.load_kernel("alternate-kernel-2", kernel_lib, "vmul", blocks_for(n),
                    alignment=TVM_ALIGNMENT)
    x = jnp.arange(n, dtype=jnp.float32)
    y = jnp.full(n, 3.0, jnp.float32)
    add, mul = jitted_vadd("alternate-kernel-1"), jitted_vadd("alternate-kernel-2")
    both = jax.jit(lambda x, y: (ffi_call("alternate-kernel-1", x.shape, x.dtype, x, y),
                                 ffi_call("alternate-kernel-2", x.shape, x.dtype, x, y)))
    xs, ys = np.asarray(x), np.asarray(y)
    for _ in range(3):
        np.testing.assert_array_equal(add(x, y), xs + ys)
        np.testing.assert_array_equal(mul(x, y), xs * ys)
        summed, product = both(x, y)
        np.testing.assert_array_equal(summed, xs + ys)
        np.testing.assert_array_equal(product, xs * ys)
    with pytest.raises(Exception, match="no kernel is loaded for key 'alternate-kernel-3'"):
        jitted_vadd("alternate-kernel-3")(x, y).block_until_ready()


def test_unknown_key_raises(ffi):
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(Exception, match="no kernel is loaded for key 'no-such-kernel'"):
        jitted_vadd("no-such-kernel")(x, x).block_until_ready()


def test_kernel_error_raises_and_process_survives(ffi, kernel_lib):
    ffi.load_kernel("vadd-mismatch", kernel_lib, "vadd", 1, alignment=TVM_ALIGNMENT)
    x = jnp.ones(8, jnp.float32)
    bad = jax.jit(lambda a, b: ffi_call("vadd-mismatch", (8,), jnp.float32, a, b))
    with pytest.raises(Exception, match=r"vadd-mismatch.*Mismatched B\.shape\[0\]"):
        bad(x, jnp.ones(5, jnp.float32)).block_until_ready()
    np.testing.assert_array_equal(bad(x, x), 2 * np.asarray(x))


def test_load_errors(ffi, kernel_lib, tmp_path):
    missing = str(tmp_path / "missing.so")
    with pytest.raises(RuntimeError, match="missing.so"):
        ffi.load_kernel("bad-path", missing, "vadd", 1, alignment=TVM_ALIGNMENT)
    not_a_library = tmp_path / "junk.so"
    not_a_library.write_text("not an ELF file")
    with pytest.raises(RuntimeError, match="junk.so"):
        ffi.load_kernel("bad-file", str(not_a_library), "vadd", 1, alignment=TVM_ALIGNMENT)
    with pytest.raises(RuntimeError, match="__tvm_ffi_nope"):
        ffi.load_kernel("bad-symbol", kernel_lib, "nope", 1, alignment=TVM_ALIGNMENT)
    with pytest.raises(ValueError, match="num_blocks"):
        ffi.load_kernel("bad-blocks", kernel_lib, "vadd", -1, alignment=TVM_ALIGNMENT)
    assert not any(ffi.is_loaded(k) for k in ["bad-path", "bad-file", "bad-symbol", "bad-blocks"])


def test_misaligned_buffer_is_rejected(ffi, kernel_lib):
    ffi.load_kernel("vadd-align", kernel_lib, "vadd", 1, alignment=TVM_ALIGNMENT)
    x = aligned_empty((BLOCK + 1,), np.float32)[1:]
    with pytest.raises(RuntimeError, match="not 64-byte aligned"):
        ffi.call_kernel("vadd-align", [x, x, x])


CACHE_HIT_SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import jaxtile._ffi as ffi

    lib, n = sys.argv[1], int(sys.argv[2])
    jax.ffi.register_ffi_target("jaxtile_cpu_call", ffi.cpu_handler(), platform="cpu")
    ffi.load_kernel("vadd", lib, "vadd", -(-n // 8), alignment=64)
    out = jax.ffi.ffi_call("jaxtile_cpu_call", jax.ShapeDtypeStruct((n,), jnp.float32))
    x = jnp.arange(n, dtype=jnp.float32)
    np.testing.assert_array_equal(jax.jit(lambda a: out(a, a, key="vadd"))(x), 2 * np.asarray(x))
    try:
        jax.jit(lambda a: out(a, a[:1], key="vadd"))(x).block_until_ready()
        raise SystemExit("a kernel error was not reported")
    except Exception as e:
        assert "Mismatched" in str(e), e
    maps = open("/proc/self/maps").read()
    assert "tvm" not in sys.modules and "libtvm" not in maps, "TVM was loaded"
    print(ffi.num_threads())
    """
)


@pytest.mark.parametrize("threads", ["1", "3"])
def test_cache_hit_path_without_tvm(kernel_lib, threads):
    # A fresh process that only loads a built kernel: TVM must stay out of it, kernel errors
    # must still be reported, and the thread count comes from the environment.
    env = dict(os.environ, JAXTILE_NUM_THREADS=threads)
    result = subprocess.run(
        [sys.executable, "-c", CACHE_HIT_SCRIPT, kernel_lib, str(13 * BLOCK - 1)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == threads


def test_more_buffers_than_the_handler_keeps_on_its_stack(tmp_path, monkeypatch):
    # The handler packs up to 30 buffers on its stack (ffi/cpu/handler.cc); a call of 34 (33
    # operands and the result) goes through its heap path and must compute the same sum.
    names = [f"x{k}" for k in range(33)]
    adds = "\n".join(f"    jt.copy({x}.at[i * 8], t)\n    acc[...] = acc[...] + t[...]"
                     for x in names[1:])
    (tmp_path / "many_operands.py").write_text(textwrap.dedent("""\
        import jax.numpy as jnp
        import jaxtile as jt

        @jt.kernel
        def add_all({params}):
            (n,) = x0.shape
            out = jt.empty((n,), jnp.float32)
            i = jt.grid(jt.cdiv(n, 8))
            acc = jt.fragment((8,), jnp.float32)
            t = jt.fragment((8,), jnp.float32)
            jt.copy(x0.at[i * 8], acc)
        {adds}
            jt.copy(acc, out.at[i * 8])
            return out
        """).format(params=", ".join(names), adds=adds))
    monkeypatch.syspath_prepend(str(tmp_path))
    from many_operands import add_all

    xs = [jnp.arange(21, dtype=jnp.float32) * (k + 1) for k in range(33)]
    got = jax.jit(add_all)(*xs)
    np.testing.assert_array_equal(np.asarray(got), np.sum([np.asarray(x) for x in xs], axis=0))
