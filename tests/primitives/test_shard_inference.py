"""Sharding inferred from the kernel: a kernel without a ShardRule gets one from how its grid
indexes its arguments and outputs (``compiler/passes/shard_inference.py``), runs per shard
under jax.jit with sharded inputs, and where inference declines, ``kernel.lower`` says why and
the kernel runs unsharded. The multi-device part runs in a subprocess with 4 host devices
(XLA_FLAGS must be set before JAX starts)."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import jaxtile as jt
from jaxtile.compiler.passes.shard_inference import infer_parallel_dims

S = jax.ShapeDtypeStruct
F32 = jnp.float32

KERNELS = textwrap.dedent("""
    import jax.numpy as jnp
    import jaxtile as jt

    @jt.kernel
    def row_softmax(x, *, rows=4):
        n_rows, n_cols = x.shape
        cols = jt.cdiv(n_cols, 128) * 128
        out = jt.empty(x.shape, x.dtype)
        r = jt.grid(jt.cdiv(n_rows, rows))
        tile = jt.fragment((rows, cols), jnp.float32)
        jt.copy(x.at[r * rows, 0], tile, pad=-jnp.inf)
        v = tile[...]
        e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
        tile[...] = e / jnp.sum(e, axis=1, keepdims=True)
        jt.copy(tile, out.at[r * rows, 0])
        return out

    @jt.kernel
    def add_row_number(x, *, rows=4):
        # The block index reaches the values written: each shard would number from 0.
        n_rows, n_cols = x.shape
        out = jt.empty(x.shape, x.dtype)
        r = jt.grid(jt.cdiv(n_rows, rows))
        tile = jt.fragment((rows, n_cols), x.dtype)
        jt.copy(x.at[r * rows, 0], tile)
        row = jax.lax.broadcasted_iota(jnp.int32, (rows, n_cols), 0) + r * rows
        tile[...] = tile[...] + row.astype(x.dtype)
        jt.copy(tile, out.at[r * rows, 0])
        return out

    @jt.kernel(sharding=jt.ShardRule("r c -> r c"))
    def replicated_softmax(x, *, rows=4):
        return row_softmax.fn(x, rows=rows)
""").replace("import jax.numpy as jnp", "import jax, jax.numpy as jnp")

exec(KERNELS)  # the same kernels in this process, for the single-device checks

SCRIPT = KERNELS + textwrap.dedent("""
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    assert jax.device_count() == 4
    mesh = jax.make_mesh((4,), ("x",))
    rows_sharded = NamedSharding(mesh, P("x", None))
    COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute")

    def collectives(f, *args):
        hlo = f.lower(*args).compile().as_text()
        assert "jaxtile_cpu_call" in hlo
        return [c for c in COLLECTIVES if c in hlo]

    def softmax(x):
        return np.asarray(jax.nn.softmax(np.asarray(x), axis=-1))

    x = jax.device_put(jax.random.normal(jax.random.key(0), (64, 300)), rows_sharded)

    # Unannotated: inferred rows-parallel, runs per shard, no collective.
    f = jax.jit(row_softmax)
    y = f(x)
    np.testing.assert_allclose(y, softmax(x), rtol=1e-5, atol=1e-7)
    assert y.sharding.spec[0] == "x", y.sharding
    assert collectives(f, x) == [], collectives(f, x)

    # vmap adds a grid axis, found parallel too: the batch stays sharded.
    xb = jax.device_put(jax.random.normal(jax.random.key(1), (8, 12, 200)),
                        NamedSharding(mesh, P("x")))
    g = jax.jit(jax.vmap(row_softmax))
    np.testing.assert_allclose(g(xb), softmax(xb), rtol=1e-5, atol=1e-7)
    assert collectives(g, xb) == [], collectives(g, xb)

    # Shards of 12 rows are not whole blocks of 8: the rows are gathered, still correct.
    x48 = jax.device_put(jax.random.normal(jax.random.key(2), (48, 300)), rows_sharded)
    h = jax.jit(lambda x: row_softmax(x, rows=8))
    np.testing.assert_allclose(h(x48), softmax(x48), rtol=1e-5, atol=1e-7)
    assert "all-gather" in collectives(h, x48)

    # Declined (the block index reaches the output): runs unsharded, and is right.
    k = jax.jit(add_row_number)
    want = np.asarray(x) + np.arange(64, dtype=np.float32)[:, None]
    np.testing.assert_allclose(k(x), want, rtol=1e-6)
    assert "all-gather" in collectives(k, x)

    # An explicit rule wins over inference: nothing parallel, so the rows are gathered.
    r = jax.jit(replicated_softmax)
    np.testing.assert_allclose(r(x), softmax(x), rtol=1e-5, atol=1e-7)
    assert "all-gather" in collectives(r, x)
    print("inferred sharding ok")
""")


def test_inferred_sharding_runs_per_shard_on_4_devices(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAXTILE_CACHE_DIR": os.environ.get("JAXTILE_CACHE_DIR", str(tmp_path))}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "inferred sharding ok" in out.stdout


def test_lower_says_what_was_inferred():
    x = S((64, 300), F32)
    said = row_softmax.lower(x).sharding  # noqa: F821 (defined by exec above)
    assert said.startswith("inferred ShardRule(rule='grid0 d_x_1 -> grid0 d_out0_1'"), said
    assert "('grid0', 4)" in said, said
    assert replicated_softmax.lower(x).sharding.startswith("explicit"), (  # noqa: F821
        replicated_softmax.lower(x).sharding)  # noqa: F821


def test_lower_says_why_inference_declined():
    said = add_row_number.lower(S((64, 32), F32)).sharding  # noqa: F821
    assert said.startswith("not inferred, the kernel runs unsharded"), said
    assert "grid axis 0" in said and "written to 'out0'" in said, said


def test_matmul_is_parallel_in_m_and_n_not_k():
    a, b = S((128, 30), F32), S((30, 50), F32)
    kernel = jt.ops.matmul_relu.lower(a, b, bm=32, bn=32, bk=16).kernel
    found = infer_parallel_dims(kernel)
    assert found.parallel == {0: 32, 1: 32}
    assert found.dims == ((1, None), (None, 0), (1, 0))


def _analysis(body, *shapes):
    kernel = jt.kernel(body).lower(*(S(s, F32) for s in shapes)).kernel
    return infer_parallel_dims(kernel)


def test_blocks_writing_the_same_elements_are_not_parallel():
    def every_block_writes_row_0(x):
        out = jt.empty((4, 8), x.dtype)
        r = jt.grid(x.shape[0] // 4)
        t = jt.fragment((4, 8), x.dtype)
        jt.copy(x.at[r * 4, 0], t)
        jt.copy(t, out.at[0, 0])
        return out

    found = _analysis(every_block_writes_row_0, (16, 8))
    assert found.parallel == {}
    assert any("does not split every output" in d for d in found.declined), found.declined


def test_block_index_in_a_condition_or_another_dimension_declines():
    def conditional(x):
        out = jt.empty(x.shape, x.dtype)
        r = jt.grid(x.shape[0] // 4)
        t = jt.fragment((4, 8), x.dtype)
        jt.copy(x.at[r * 4, 0], t)

        @jt.when(r == 0)
        def _():
            t[...] = t[...] * 2

        jt.copy(t, out.at[r * 4, 0])
        return out

    def diagonal(x):
        out = jt.empty(x.shape, x.dtype)
        r = jt.grid(x.shape[0] // 4)
        t = jt.fragment((4, 4), x.dtype)
        jt.copy(x.at[r * 4, r * 4], t)
        jt.copy(t, out.at[r * 4, r * 4])
        return out

    found = _analysis(conditional, (16, 8))
    assert found.parallel == {} and any("condition" in d for d in found.declined), found
    found = _analysis(diagonal, (16, 16))
    assert found.parallel == {}
    assert any("splits two dimensions" in d for d in found.declined), found.declined


def test_scratch_carries_the_block_index():
    def through_scratch(x):
        out = jt.empty(x.shape, x.dtype)
        r = jt.grid(x.shape[0] // 4)
        s = jt.fragment((4, 8), x.dtype)
        s[...] = jnp.zeros((4, 8), x.dtype) + r.astype(x.dtype)
        t = jt.fragment((4, 8), x.dtype)
        jt.copy(x.at[r * 4, 0], t)
        t[...] = t[...] + s[...]
        jt.copy(t, out.at[r * 4, 0])
        return out

    found = _analysis(through_scratch, (16, 8))
    assert found.parallel == {}, found


def test_multiple_of_names_parallel_factors():
    rule = jt.ShardRule("r c -> r c", parallel="r", multiple_of=(("r", 4),))
    assert rule.with_batch([(True,)]).multiple_of == (("r", 4),)
    with pytest.raises(ValueError, match="multiple_of"):
        jt.ShardRule("r c -> r c", parallel="r", multiple_of=(("c", 4),))
