"""kernel.lower(..., target="hip:gfx942" / "hip:gfx90a"): elementwise and reduction kernels
go through the GPU passes and code generator with the AMD capabilities (64-lane waves) and
compile with clang against device_hip.h (gemms: tests/hip/test_hip_gemm.py); what is not
there yet is a clear error."""

import jax.numpy as jnp
import pytest

import jaxtile as jt
from jaxtile.compiler import build
from jaxtile.compiler.hip import lower as hip_lower
from jaxtile.compiler.hip import toolchain
from jaxtile.compiler.target import parse_target

needs_clang = pytest.mark.skipif(toolchain.clang_path() is None,
                                 reason=f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}")


@jt.kernel(threads=128)
def exp_add(x, y, *, block=256):
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, block))
    t = jt.fragment((block,), x.dtype)
    u = jt.fragment((block,), y.dtype)
    jt.copy(x.at[i * block], t)
    jt.copy(y.at[i * block], u)
    t[...] = jnp.exp(t[...]) + u[...]
    jt.copy(t, out.at[i * block])
    return out


@jt.kernel(threads=128)
def row_sums(x, *, rows=4):
    n_rows, n_cols = x.shape
    out = jt.empty((n_rows,), x.dtype)
    r = jt.grid(jt.cdiv(n_rows, rows))
    tile = jt.fragment((rows, jt.cdiv(n_cols, 128) * 128), jnp.float32)
    jt.copy(x.at[r * rows, 0], tile, pad=0)
    s = jt.fragment((rows,), jnp.float32)
    s[...] = jnp.sum(tile[...], axis=1)
    jt.copy(s, out.at[r * rows])
    return out


@jt.kernel(threads=128)
def staged_sums(x, *, rows=4, cols=128):
    """Column sums of row blocks, the columns streamed through LDS by a pipelined loop
    (cp_async in the generated code)."""
    n_rows, n_cols = x.shape
    out = jt.empty((n_rows, cols), jnp.float32)
    r = jt.grid(jt.cdiv(n_rows, rows))
    s = jt.shared((rows, cols), x.dtype)
    acc = jt.fragment((rows, cols), jnp.float32)
    acc[...] = jnp.zeros((rows, cols), jnp.float32)

    @jt.pipelined(jt.cdiv(n_cols, cols), stages=2)
    def _(k):
        jt.copy(x.at[r * rows, k * cols], s)
        acc[...] = acc[...] + s[...]

    jt.copy(acc, out.at[r * rows, 0])
    return out


@jt.kernel(threads=128)
def matmul(a, b):
    out = jt.empty((64, 64), jnp.float32)
    jt.grid(1)
    sa = jt.shared((64, 64), a.dtype)
    sb = jt.shared((64, 64), b.dtype)
    acc = jt.fragment((64, 64), jnp.float32)
    jt.copy(a.at[0, 0], sa)
    jt.copy(b.at[0, 0], sb)
    acc[...] = jnp.zeros((64, 64), jnp.float32)
    jt.gemm(sa, sb, acc)
    jt.copy(acc, out.at[0, 0])
    return out


CASES = [(exp_add, (jnp.ones(1000), jnp.ones(1000))), (row_sums, (jnp.ones((100, 300)),)),
         (staged_sums, (jnp.ones((100, 1000)),))]


@needs_clang
@pytest.mark.parametrize("kernel,args,gfx", [
    (*CASES[0], "gfx942"), (*CASES[1], "gfx942"), (*CASES[2], "gfx942"),
    (*CASES[2], "gfx90a")], ids=["elementwise", "reduction", "pipelined", "pipelined-gfx90a"])
def test_lowered_hip_compiles_for_the_target(kernel, args, gfx):
    target = parse_target(f"hip:{gfx}")
    lowered = kernel.lower(*args, target=target.name)
    assert "#include <jaxtile/device.h>" in lowered.source
    assert "#blocked" in lowered.lowered_ir  # the GPU passes' layouts
    co = hip_lower.compile_code_object(build.lowered_ir(lowered.kernel, target), target)
    figures = co.kernels[f"jt_{kernel.name}"]
    assert figures.wave_size == 64 and figures.max_workgroup_size == 128
    assert figures.scratch_bytes == 0 and "s_swappc" not in co.assembly
    if kernel is staged_sums:
        # Global -> LDS copies of the pipeline: loads, then LDS stores, then a barrier.
        assert "cp_async<" in lowered.source and "s_barrier" in co.assembly
        assert "ds_write_b" in co.assembly
    if kernel is row_sums:
        # The row's 32 lanes fold by shuffles: xor 1 and 2 as DPP, the rest ds_bpermute.
        assert "quad_perm" in co.assembly and "ds_bpermute_b32" in co.assembly


@needs_clang
def test_lowered_gives_the_resource_figures():
    lowered = row_sums.lower(*CASES[1][1], target="hip:gfx942")
    figures = lowered.hip_resources
    assert figures.name == "jt_row_sums" and figures.vgprs > 0 and figures.scratch_bytes == 0
    assert figures.waves_per_simd(parse_target("hip:gfx942").caps) == figures.llvm_occupancy
    with pytest.raises(jt.KernelError, match="cuda:sm_80 has no HIP code"):
        _ = row_sums.lower(*CASES[1][1], target="cuda:sm_80").hip_resources


def test_keys_differ_per_architecture():
    keys = {exp_add.lower(*CASES[0][1], target=t).key
            for t in ("hip:gfx90a", "hip:gfx942", "cuda:sm_80")}
    assert len(keys) == 3


@jt.kernel(threads=64)
def _printing(x):
    out = jt.empty(x.shape, x.dtype)
    t = jt.fragment(x.shape, x.dtype)
    jt.copy(x, t)
    jt.print("max {}", jnp.max(t[...]))
    jt.copy(t, out)
    return out


def test_print_on_amd_is_a_clear_error_at_the_users_line():
    x = jnp.ones((64, 64), jnp.float32)
    with pytest.raises(jt.KernelError,
                       match=r"jt.print is not supported on hip:gfx942.*test_hip_lower.py:\d+"):
        _ = _printing.lower(x, target="hip:gfx942").source
