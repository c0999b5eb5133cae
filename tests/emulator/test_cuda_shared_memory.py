"""Shared memory in generated CUDA: every shared array is a view of one dynamic buffer at
the planner's offset, buffers with disjoint lifetimes share bytes, the barrier pass orders
the reuse (the emulator's race detector shows the barrier is needed), and kernels above the
48 KiB default launch with the opt-in size, in the emulator and through ptxas."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler import build, ir
from jaxtile.compiler.cuda import toolchain
from jaxtile.compiler.cuda.compile import compile_to_library
from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig
from jaxtile.compiler.gpu.codegen.lower import generate
from jaxtile.compiler.gpu.smem_plan import plan_kernel
from jaxtile.compiler.target import parse_target

SM80 = parse_target("cuda:sm_80")


@jt.kernel(threads=128)
def _reuse(x):
    """Two shared buffers with disjoint lifetimes: ``a`` (read whole, then element 7 by
    every thread), then ``b``, which the plan puts on ``a``'s bytes."""
    out = jt.empty((2, 512), jnp.float32)
    a = jt.shared((512,), jnp.float32)
    b = jt.shared((512,), jnp.float32)
    jt.copy(x.at[0, 0], a)
    t = a[7]
    out[0, :] = a[...] * 2.0
    jt.copy(x.at[1, 0], b)
    out[1, :] = b[...] + t
    return out


def _lowered(kernel, *args, **params):
    low = kernel.lower(*args, target="cuda:sm_80", **params)
    return build.lowered_ir(low.kernel, SM80)


def _emulate(k: ir.Kernel, *arrays):
    code = generate(k, SM80)
    emu = EmulatedKernel.build(code.source, code.symbol,
                               [Buffer(n, d) for n, d in code.params],
                               LaunchConfig((code.num_blocks, 1, 1), (code.threads, 1, 1),
                                            code.shared_bytes), file=f"{k.name}.cu")
    return emu.run(*arrays)


def _drop_barriers(k: ir.Kernel, reason: str) -> ir.Kernel:
    body = tuple(s for s in k.body if not (isinstance(s, ir.Op) and s.kind == "barrier"
                                           and reason in s.notes.get("reason", "")))
    assert len(body) < len(k.body)
    return dataclasses.replace(k, body=body)


def test_disjoint_buffers_share_bytes_and_the_barrier_between_them_is_needed():
    x = np.random.default_rng(0).standard_normal((2, 512)).astype(np.float32)
    k = _lowered(_reuse, jnp.asarray(x))
    plan = plan_kernel(k, SM80.caps)
    assert plan.offsets["smem0"] == plan.offsets["smem1"] == 0 and plan.total == 2048
    assert plan.shares() == [("smem0", "smem1")]
    reasons = [s.notes["reason"] for s in k.body if isinstance(s, ir.Op) and s.kind == "barrier"]
    assert "write after read of smem1 (shares bytes with smem0)" in reasons
    code = generate(k, SM80)
    assert "JT_SHARED_AT(float, smem0, 512, 0);" in code.source
    assert "JT_SHARED_AT(float, smem1, 512, 0);" in code.source and code.shared_bytes == 2048
    want = np.stack([2 * x[0], x[1] + x[0, 7]])
    out = np.zeros((2, 512), np.float32)
    report = _emulate(k, x, out)
    np.testing.assert_array_equal(out, want)
    assert report["findings"] == []
    np.testing.assert_array_equal(np.asarray(_reuse.reference(jnp.asarray(x))), want)
    # Without the barrier the planner's reuse is a race: b's first writes overwrite bytes
    # of a that other threads may still read.
    with pytest.raises(EmulatorError, match=r"data race \(write after read\) on shared "
                                            r"array 'smem1'"):
        _emulate(_drop_barriers(k, "shares bytes"), x, np.zeros((2, 512), np.float32))


def test_plan_is_the_same_before_and_after_barriers_and_renaming():
    """The plan of the kernel before the GPU passes and that of the lowered IR (renamed,
    with barriers) agree: the offsets the barrier pass and code generation read are the
    ones planned."""
    a = jnp.zeros((200, 192), jnp.float16)
    low = ops.matmul_relu.lower(a, a.T, target="cuda:sm_80", bk=64)
    before = dict(plan_kernel(low.kernel, SM80.caps).offsets)
    after = build.lowered_ir(low.kernel, SM80)
    assert dict(plan_kernel(after, SM80.caps).offsets) == before


@pytest.mark.parametrize("mnk", [(128, 128, 192), pytest.param((200, 136, 320),
                                                               marks=pytest.mark.slow)],
                         ids=["one-block", "ragged"])
def test_gemm_above_48k_runs_in_the_emulator(emulator, mnk):
    """128x128x64 f16 tiles, 3 stages: 96 KiB of shared memory (the opt-in)."""
    m, n, kk = mnk
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((m, kk)), jnp.float16)
    b = jnp.asarray(rng.standard_normal((kk, n)), jnp.float16)
    code = generate(_lowered(ops.matmul_relu, a, b, bk=64), SM80)
    assert code.shared_bytes == 3 * (128 * 64 + 64 * 128) * 2 > 48 * 1024
    got = jax.jit(lambda a, b: ops.matmul_relu(a, b, bk=64))(a, b)
    want = np.maximum(np.asarray(a, np.float64) @ np.asarray(b, np.float64), 0)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-2, atol=5e-2)
    ref = ops.matmul_relu.reference(a, b, bk=64)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(ref, np.float64),
                               rtol=1e-2, atol=5e-2)


@pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc is not installed")
def test_gemm_above_48k_compiles_with_the_opt_in_launch():
    a = jnp.zeros((4096, 4096), jnp.float16)
    k = _lowered(ops.matmul_relu, a, a, bk=64)
    compiled = compile_to_library(k, SM80)
    assert compiled.launch.dynamic_smem == 98304
    assert "smem=98304" in compiled.launch.encode()
    assert compiled.ptxas.spill_stores == compiled.ptxas.spill_loads == 0
    assert compiled.ptxas.shared_bytes == 0          # nothing static: one dynamic buffer


def test_more_than_the_target_allows_is_a_kernel_error():
    a = jnp.zeros((512, 512), jnp.float16)
    with pytest.raises(jt.KernelError, match="more than the 166912 an sm_80 block can have"):
        generate(_lowered(ops.matmul_relu, a, a, bk=128, stages=4), SM80)


@jt.kernel(threads=128)
def _scaled_matmul(a, b, s, *, bm=64, bn=64, bk=32, stages=2):
    """``(a @ b) * s[0, 0]``: ``s`` goes through a shared buffer that is dead before the
    pipelined loop, whose stages the plan puts on its bytes."""
    m, kk = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    pre = jt.shared((64, 64), jnp.float32)
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    jt.copy(s.at[0, 0], pre)
    t = pre[0, 0]
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(kk, bk), stages=stages)
    def _(k):
        jt.copy(a.at[by * bm, k * bk], a_s)
        jt.copy(b.at[k * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    acc[...] = acc[...] * t
    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


def test_pipeline_stages_reusing_a_dead_buffer_get_a_barrier_before_the_prologue():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 96)).astype(np.float16)
    b = rng.standard_normal((96, 64)).astype(np.float16)
    s = rng.standard_normal((64, 64)).astype(np.float32)
    k = _lowered(_scaled_matmul, *(jnp.asarray(x) for x in (a, b, s)))
    plan = plan_kernel(k, SM80.caps)
    assert ("smem0", "smem1") in plan.shares()         # pre and the stages of a_s
    prologue = next(i for i, st in enumerate(k.body) if isinstance(st, ir.Op)
                    and st.kind == "async_issue")     # the pipelining pass's prologue
    barrier = k.body[prologue - 1]
    assert barrier.kind == "barrier" and "before the pipeline's prologue" in \
        barrier.notes["reason"]
    want = (a.astype(np.float64) @ b.astype(np.float64)) * s[0, 0]
    out = np.zeros((64, 64), np.float32)
    assert _emulate(k, a, b, s, out)["findings"] == []
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)
    with pytest.raises(EmulatorError, match=r"data race \(write after read\) on shared "
                                            r"array .smem1."):
        _emulate(_drop_barriers(k, "prologue"), a, b, s, np.zeros((64, 64), np.float32))


@jt.kernel(threads=128)
def _column_sums(a, b, *, bm=64, bn=64, bk=32):
    """The column sums of ``a @ b`` for one block: the reduction over rows crosses warps,
    so its partials go through a shared scratch array, which the plan puts on the bytes of
    the (by then dead) pipeline stages."""
    kk = a.shape[1]
    out = jt.empty((bn,), jnp.float32)
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(kk, bk), stages=2)
    def _(k):
        jt.copy(a.at[0, k * bk], a_s)
        jt.copy(b.at[k * bk, 0], b_s)
        jt.gemm(a_s, b_s, acc)

    out[...] = jnp.sum(acc[...], axis=0)
    return out


def _reasons(k: ir.Kernel) -> list[str]:
    return [s.notes["reason"] for s in k.body if isinstance(s, ir.Op) and s.kind == "barrier"]


def test_scratch_reusing_dead_buffers_gets_its_own_barrier():
    rng = np.random.default_rng(4)
    # One k step: the gemm's last reads are of stage 0, the bytes the partials take.
    a = rng.standard_normal((64, 32)).astype(np.float16)
    b = rng.standard_normal((32, 64)).astype(np.float16)
    k = _lowered(_column_sums, jnp.asarray(a), jnp.asarray(b))
    # The barrier pass's, as IR: the reduction's scratch writes after the stages' reads.
    assert [r for r in _reasons(k) if "partials" in r] == [
        "write after write of reduce partials (shares bytes with smem0)"]
    code = generate(k, SM80)
    assert "JT_SHARED_AT(float, partials" in code.source and ", 0);" in code.source
    want = (a.astype(np.float64) @ b.astype(np.float64)).sum(0)
    out = np.zeros(64, np.float32)
    assert _emulate(k, a, b, out)["findings"] == []
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-2)
    with pytest.raises(EmulatorError, match=r"data race .* on shared array 'partials"):
        _emulate(_drop_barriers(k, "reduce partials"), a, b, np.zeros(64, np.float32))


@jt.kernel(threads=128)
def _sum_and_max(x):
    """Two reductions across warps: their partials live for their own op each, so the plan
    puts both on the same bytes (those of ``t``, dead after its load)."""
    n, m = x.shape
    out = jt.empty((2, n), jnp.float32)
    jt.grid(1)
    t = jt.shared((n, m), jnp.float32)
    jt.copy(x.at[0, 0], t)
    v = t[...]
    out[0, :] = jnp.sum(v, axis=1)
    out[1, :] = jnp.max(v, axis=1)
    return out


@pytest.mark.slow   # two emulator builds; the default run keeps the gemm one above
def test_two_reductions_on_the_same_scratch_bytes_need_the_barrier_between():
    x = np.random.default_rng(5).standard_normal((2, 512)).astype(np.float32)
    k = _lowered(_sum_and_max, jnp.asarray(x))
    notes = [s.notes["scratch"] for s in k.body if isinstance(s, ir.Op) and s.kind == "reduce"]
    assert notes == [(("partials", "float", 256, 0),)] * 2
    assert _reasons(k) == ["write after write of reduce partials (shares bytes with smem0)",
                           "write after read of reduce partials"]
    want = np.stack([x.sum(1), x.max(1)])
    out = np.zeros((2, 2), np.float32)
    assert _emulate(k, x, out)["findings"] == []
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(_sum_and_max.reference(jnp.asarray(x))), want,
                               rtol=1e-5, atol=1e-5)
    # Without it the second reduction's partials overwrite the first's, still being read.
    with pytest.raises(EmulatorError, match=r"data race .* on shared array 'partials"):
        _emulate(_drop_barriers(k, "write after read of reduce partials"), x,
                 np.zeros((2, 2), np.float32))


@jt.kernel(threads=128)
def _row_sums_per_step(x):
    """A reduction across warps in a loop: each iteration's partials take the bytes the
    previous iteration's still being read had."""
    steps, n, m = x.shape
    out = jt.empty((steps, n), jnp.float32)
    jt.grid(1)
    t = jt.fragment((n, m), jnp.float32)

    @jt.loop(0, steps)
    def _(k):
        jt.copy(x.at[k, 0, 0], t)
        out[k, :] = jnp.sum(t[...], axis=1)

    return out


def _drop_in_loops(k: ir.Kernel, reason: str) -> ir.Kernel:
    def drop(op: ir.Op) -> list[ir.Op]:
        return [] if op.kind == "barrier" and reason in op.notes["reason"] else [op]
    dropped = dataclasses.replace(k, body=ir.map_ops(k.body, drop))
    assert sum(1 for _ in ir.walk(dropped.body)) < sum(1 for _ in ir.walk(k.body))
    return dropped


@pytest.mark.slow   # two emulator builds; the default run keeps the gemm one above
def test_a_reduction_in_a_loop_waits_for_the_previous_iterations_reads():
    x = np.random.default_rng(6).standard_normal((3, 2, 512)).astype(np.float32)
    k = _lowered(_row_sums_per_step, jnp.asarray(x))
    (loop,) = [s for s in k.body if isinstance(s, ir.For)]
    assert [s.notes["reason"] for s in loop.body if isinstance(s, ir.Op)
            and s.kind == "barrier"] == ["write after read of reduce partials"]
    out = np.zeros((3, 2), np.float32)
    assert _emulate(k, x, out)["findings"] == []
    np.testing.assert_allclose(out, x.sum(2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(_row_sums_per_step.reference(jnp.asarray(x))),
                               x.sum(2), rtol=1e-5, atol=1e-5)
    with pytest.raises(EmulatorError, match=r"data race .* on shared array 'partials"):
        _emulate(_drop_in_loops(k, "reduce partials"), x, np.zeros((3, 2), np.float32))
