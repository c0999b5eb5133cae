"""Kernels under jax.jit with sharded inputs run per shard (no all-gather), and inside
shard_map. Runs in a subprocess with 4 host devices (XLA_FLAGS must be set before JAX
starts)."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxtile.primitives.sharding import ShardRule

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jaxtile as jt

    assert jax.device_count() == 4
    mesh = jax.make_mesh((4,), ("x",))
    COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute")

    def check_hlo(f, *args):
        hlo = f.lower(*args).compile().as_text()
        found = [c for c in COLLECTIVES if c in hlo]
        assert not found, found
        assert "jaxtile_cpu_call" in hlo

    # a row-wise kernel, rows sharded
    x = jax.device_put(jax.random.normal(jax.random.key(0), (64, 300)),
                       NamedSharding(mesh, P("x", None)))
    f = jax.jit(jt.ops.softmax)
    y = f(x)
    np.testing.assert_allclose(y, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-7)
    assert y.sharding.spec[0] == "x", y.sharding
    check_hlo(f, x)

    # a batched matmul, batch sharded, weights replicated
    a = jax.device_put(jax.random.normal(jax.random.key(1), (8, 40, 30)),
                       NamedSharding(mesh, P("x")))
    b = jax.random.normal(jax.random.key(2), (30, 50))
    mm = lambda a, b: jt.ops.matmul_relu(a, b, bm=32, bn=32, bk=16)
    g = jax.jit(jax.vmap(mm, in_axes=(0, None)))
    c = g(a, b)
    want = jnp.maximum(jnp.einsum("bmk,kn->bmn", a, b, precision="highest"), 0)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    check_hlo(g, a, b)

    # a plain matmul sharded along m
    a2 = jax.device_put(jax.random.normal(jax.random.key(3), (128, 30)),
                        NamedSharding(mesh, P("x", None)))
    h = jax.jit(mm)
    np.testing.assert_allclose(h(a2, b), jnp.maximum(jnp.matmul(a2, b, precision="highest"),
                               0), rtol=1e-5, atol=1e-5)
    check_hlo(h, a2, b)

    # inside shard_map each device calls the kernel on its shard
    sm = jax.jit(jax.shard_map(jt.ops.softmax, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    np.testing.assert_allclose(sm(x), jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-7)
    print("sharding ok")
""")


def test_sharded_kernels_run_per_shard(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAXTILE_CACHE_DIR": os.environ.get("JAXTILE_CACHE_DIR", str(tmp_path))}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "sharding ok" in out.stdout


def test_shard_rule_parsing_and_batching():
    rule = ShardRule("m k, k n -> m n", parallel="m n")
    assert rule.mappings() == ([["m", "k"], ["k", "n"]], [["m", "n"]])
    assert rule.replicated == ("k",)
    batched = rule.with_batch([(True, False)])
    assert batched.mappings() == ([["jtbatch0", "m", "k"], ["k", "n"]],
                                  [["jtbatch0", "m", "n"]])
    assert "jtbatch0" in batched.parallel
    with pytest.raises(ValueError, match="do not appear"):
        ShardRule("r c -> r c", parallel="q")
