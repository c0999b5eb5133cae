"""Which copies a pipelined loop stages (``copy_schedule.pipeline_shape``, decided on the
Tile IR), and a loop mixing staged copies (issued at the top, one placed after computation)
with copies that stay synchronous in the body (an origin read from memory; a buffer read
before its copy, i.e. the previous iteration's tile), run in the emulator against the
reference and numpy."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt
from jaxtile.compiler import ir
from jaxtile.compiler.gpu.copy_schedule import pipeline_shape, staged_buffers


@jt.kernel(threads=128)
def _staging(x, idx, *, stages=2):
    n = x.shape[0] // 32
    out = jt.empty((32, 32), jnp.float32)
    early = jt.shared((32, 32), jnp.float32)     # copied first: staged
    late = jt.shared((32, 32), jnp.float32)      # copied after computation: staged
    gathered = jt.shared((32, 32), jnp.float32)  # origin read from memory: not staged
    reused = jt.shared((32, 32), jnp.float32)    # read before its copy: not staged
    acc = jt.fragment((32, 32), jnp.float32)
    acc[...] = jnp.zeros((32, 32), jnp.float32)
    jt.copy(x.at[0, 0], reused)

    @jt.pipelined(n, stages=stages)
    def _(k):
        jt.copy(x.at[k * 32, 0], early)
        acc[...] = acc[...] + early[...] + reused[...]
        jt.copy(x.at[(k + 1) % n * 32, 0], late)
        jt.copy(x.at[idx[k] * 32, 0], gathered)
        jt.copy(x.at[k * 32, 0], reused)
        acc[...] = acc[...] + late[...] * gathered[...]

    jt.copy(acc, out.at[0, 0])
    return out


def _numpy(x, idx):
    tiles = x.reshape(-1, 32, 32).astype(np.float64)
    n = len(tiles)
    acc, reused = np.zeros((32, 32)), tiles[0]
    for k in range(n):
        acc += tiles[k] + reused
        reused = tiles[k]
        acc += tiles[(k + 1) % n] * tiles[idx[k]]
    return acc


def test_pipeline_shape_stages_copies_wherever_their_origin_is_known():
    x, idx = jnp.zeros((128, 32), jnp.float32), jnp.zeros((4,), jnp.int32)
    k = _staging.lower(x, idx, stages=3).kernel
    loop = next(s for s in ir.walk(k.body) if isinstance(s, ir.For))
    shape = pipeline_shape(k, loop)
    early, late = [b.name for b in k.buffers if b.scope == "shared"][:2]
    assert shape.staged == (early, late) and shape.stages == 3
    assert staged_buffers(k) == {early: 3, late: 3}
    # The late copy's origin ((k + 1) % n) * 32 is recomputed at the top of an iteration.
    assert {op.attrs["fn"] for op in shape.scalars if op.kind == "elementwise"} >= {"rem", "mul"}
    assert pipeline_shape(k, dataclasses.replace(loop, stages=1)) is None


def test_mixed_staged_and_synchronous_copies_in_the_emulator():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((160, 32)).astype(np.float32)     # 5 tiles, 3 stages
    idx = np.asarray([3, 0, 4, 4, 1], np.int32)
    before = jt.backend()
    jt.set_backend("cuda-emulator")
    jax.clear_caches()
    try:
        got = jax.jit(lambda x, i: _staging(x, i, stages=3))(jnp.asarray(x), jnp.asarray(idx))
    finally:
        jt.set_backend(before)
        jax.clear_caches()
    want = _numpy(x, idx)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
    ref = _staging.reference(jnp.asarray(x), jnp.asarray(idx), stages=3)
    np.testing.assert_allclose(np.asarray(ref), want, rtol=1e-5, atol=1e-4)


@jt.kernel(threads=128)
def _two_tiles_per_block(a, b, *, bm=32, bn=64, bk=32, stages=3):
    """Each block computes two row tiles of ``a @ b`` one after the other, a pipelined K
    loop inside a serial loop: the second prologue refills stages the first loop's last
    iterations read."""
    m, kk = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, 2 * bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)

    @jt.loop(2)
    def _(t):
        row = (by * 2 + t) * bm
        acc[...] = jnp.zeros((bm, bn), jnp.float32)

        @jt.pipelined(jt.cdiv(kk, bk), stages=stages)
        def _(k):
            jt.copy(a.at[row, k * bk], a_s)
            jt.copy(b.at[k * bk, bx * bn], b_s)
            jt.gemm(a_s, b_s, acc)

        jt.copy(acc, c.at[row, bx * bn])

    return c


def test_a_pipeline_inside_a_loop_refills_its_stages_safely():
    rng = np.random.default_rng(6)
    a = jnp.asarray(rng.standard_normal((100, 80)), jnp.float16)   # ragged M and K
    b = jnp.asarray(rng.standard_normal((80, 64)), jnp.float16)
    k = _two_tiles_per_block.lower(a, b, target="cuda:sm_80")
    assert "// pipelined loop: 3 stages" in k.source
    before = jt.backend()
    jt.set_backend("cuda-emulator")
    jax.clear_caches()
    try:
        got = jax.jit(_two_tiles_per_block)(a, b)
    finally:
        jt.set_backend(before)
        jax.clear_caches()
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(np.asarray(_two_tiles_per_block.reference(a, b), np.float64),
                               want, rtol=2e-3, atol=2e-3)
