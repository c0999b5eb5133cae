"""TMA copies from the pipelining pass, run in the emulator as sm_90a code: ``jt.ops.matmul``
(wgmma on TMA-filled, swizzled tiles in an mbarrier ring) in f16 and bf16, on shapes that do
and do not divide the tiles, against its reference and numpy; a shape whose rows are not
16-byte multiples falling back to cp.async; seeded mistakes in the generated ring (a wrong
expect_tx count, a wait on the wrong phase) reported by the emulator."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler import build
from jaxtile.compiler.cuda import emulated, nvrtc
from jaxtile.compiler.cuda.compile import compile_to_library
from jaxtile.compiler.cuda.sass import sass_counts
from jaxtile.compiler.emulator import EmulatedKernel, EmulatorError
from jaxtile.compiler.target import parse_target


def _operands(m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = jnp.asarray(rng.standard_normal((m, k)), dtype)
    b = jnp.asarray(rng.standard_normal((k, n)), dtype)
    return a, b


def _check(got, a, b, ref):
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    tol = 3e-2 if a.dtype == jnp.bfloat16 else 4e-3
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * 4)
    np.testing.assert_allclose(np.asarray(ref, np.float64), want, rtol=tol, atol=tol * 4)


# Each emulator build takes seconds on the 2-core machine: the default run keeps the ring's
# own kernel below (run clean, and mutated); jt.ops.matmul's runs are under `slow`.
@pytest.mark.slow
@pytest.mark.parametrize("dtype, shape", [
    (jnp.float16, (128, 64, 64)),       # dividing: 2 x 1 blocks, 2 k-tiles
    (jnp.bfloat16, (100, 72, 40)),      # ragged M, K, N: TMA's zero fill is the mask
])
def test_matmul_runs_on_a_tma_ring(hopper, dtype, shape):
    m, k, n = shape
    a, b = _operands(m, k, n, dtype)
    got = jax.jit(ops.matmul)(a, b)
    src = hopper[-1]
    assert "TMA into an mbarrier ring" in src and "tma_load_2d(" in src
    assert "cp_async" not in src and "wgmma_" in src
    _check(got, a, b, ops.matmul.reference(a, b))


@pytest.mark.slow
def test_rows_of_999_halves_fall_back_to_cp_async(hopper):
    """K = 999: A's rows are 1998 bytes, not a multiple of 16, so the loop stays cp.async
    (and still runs right); the lowered IR shows no TMA."""
    a, b = _operands(40, 999, 64, jnp.float16, seed=1)
    low = ops.matmul.lower(a, b, target="cuda:sm_90a")
    assert "tma_issue" not in low.lowered_ir and "async_issue" in low.lowered_ir
    got = jax.jit(ops.matmul)(a, b)
    assert "cp_async<" in hopper[-1] and "tma_load" not in hopper[-1]
    _check(got, a, b, ops.matmul.reference(a, b))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_matmul_on_a_tma_ring_larger(hopper, dtype):
    a, b = _operands(192, 160, 136, dtype, seed=2)
    got = jax.jit(lambda x, y: ops.matmul(x, y, stages=3))(a, b)
    assert "tma_load_2d(" in hopper[-1]
    _check(got, a, b, ops.matmul.reference(a, b, stages=3))


def _build(source: str, code, name: str) -> EmulatedKernel:
    """The emulator build of ``code``'s kernel from (possibly mutated) ``source``, with the
    parameters the cuda-emulator backend gives it."""
    params, launch = emulated.emulator_launch(code)
    return EmulatedKernel.build(source, code.symbol, params, launch, file=f"{name}.cu")


def _ring_kernel():
    a, b = _operands(64, 64, 64, jnp.float16, seed=3)
    code = ops.matmul.lower(a, b, target="cuda:sm_90a")._gpu
    arrays = [np.asarray(a).view(np.float16), np.asarray(b).view(np.float16),
              np.zeros((64, 64), np.float16)]
    return code, arrays, np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def test_the_unmutated_ring_runs_clean():
    code, arrays, want = _ring_kernel()
    report = _build(code.source, code, "ring_ok").run(*arrays)
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    np.testing.assert_allclose(arrays[2].astype(np.float64), want, rtol=4e-3, atol=2e-2)


@pytest.mark.parametrize("mutate, finding", [
    # announce 16 bytes fewer than the loads complete: the transaction count goes negative
    (lambda s: re.sub(r"(mbarrier_arrive_expect_tx\([^,]+, )(\d+)\)",
                      lambda m: f"{m.group(1)}{int(m.group(2)) - 16})", s, count=1),
     "transaction"),
    # wait on the wrong phase's parity: the phase it waits for never completes
    pytest.param(lambda s: s.replace("/ 2) & 1);  // tile", "/ 2 + 1) & 1);  // tile", 1),
                 "deadlock", marks=pytest.mark.slow),
])
def test_seeded_ring_mistakes_are_reported(mutate, finding):
    code, arrays, _ = _ring_kernel()
    bad = mutate(code.source)
    assert bad != code.source
    kernel = _build(bad, code, "ring_mutated")
    kernel.set_timeout(60)
    with pytest.raises(EmulatorError) as err:
        kernel.run(*arrays)
    text = (str(err.value) + str(err.value.report)).lower()
    assert finding in text, text[:2000]


def test_bf16_tiles_move_as_raw_bytes():
    """The tensor map's element size is what the launch shim gets: 2 bytes for bf16."""
    a, b = _operands(64, 64, 64, jnp.bfloat16)
    code = ops.matmul.lower(a, b, target="cuda:sm_90a")._gpu
    assert [np.dtype(code.params[t.buffer][1]) for t in code.tensor_maps] == [
        np.dtype(ml_dtypes.bfloat16)] * 2
    assert {(t.box, t.swizzle) for t in code.tensor_maps} == {((32, 64), 64), ((64, 32), 128)}


@jt.kernel(threads=128)
def _column_sums(x, *, bk=32, stages=3):
    """Column sums of ``x`` over row tiles of ``bk``: a pipelined loop whose staged copy is a
    plain (unswizzled) shared tile, the last one past the end of ``x``."""
    n, m = x.shape
    out = jt.empty((1, m), jnp.float32)
    s = jt.shared((bk, m), x.dtype)
    acc = jt.fragment((1, m), jnp.float32)
    acc[...] = jnp.zeros((1, m), jnp.float32)

    @jt.pipelined(jt.cdiv(n, bk), stages=stages)
    def _(k):
        jt.copy(x.at[k * bk, 0], s, pad=0)
        acc[...] = acc[...] + jnp.sum(s[...].astype(jnp.float32), axis=0, keepdims=True)

    jt.copy(acc, out.at[0, 0])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("rows, stages", [(100, 3), (32, 3), (256, 2)])
def test_a_plain_tile_ring_with_a_ragged_last_tile(hopper, rows, stages):
    """Rows 100: the fourth tile's last 28 rows lie past the end, filled with zeros by TMA;
    rows 32: one tile, fewer than the prologue's two; stages 2 over 8 tiles: the ring wraps
    four times."""
    x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, 64)), jnp.float16)
    got = jax.jit(lambda v: _column_sums(v, stages=stages))(x)
    assert "tma_load_2d(" in hopper[-1]
    want = np.asarray(x, np.float64).sum(0, keepdims=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(np.asarray(_column_sums.reference(x, stages=stages)), want,
                               rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed (jaxtile[cuda])")
def test_the_cuda_launch_carries_the_tensor_maps_it_needs():
    """What the handler gets for a real GPU: after the buffers, one ``tmap`` parameter per map
    with the buffer's shape and the box (innermost first) and swizzle the IR records; the
    cubin compiles with no spills and TMA loads in its SASS where cuobjdump is installed."""
    a, b = _operands(100, 72, 40, jnp.float16)
    target = parse_target("cuda:sm_90a")
    low = ops.matmul.lower(a, b, target=target.name)
    assert "tma_box=(32, 64), tma_swizzle=64" in low.lowered_ir
    assert "tma_box=(64, 32), tma_swizzle=128" in low.lowered_ir
    compiled = compile_to_library(build.lowered_ir(low.kernel, target), target)
    assert compiled.launch.params == ("b0", "b1", "b2", "tmap0:2:72x100:32x64:64",
                                      "tmap1:2:40x72:64x32:128")
    assert compiled.ptxas.spill_stores == compiled.ptxas.spill_loads == 0
    counts = sass_counts(compiled.cubin)
    if counts is not None:
        assert counts.get("UTMALDG", 0) > 0 and counts.get("LDGSTS", 0) == 0
