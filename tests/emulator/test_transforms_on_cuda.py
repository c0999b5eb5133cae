"""JAX's transformations of kernels compiled to CUDA: vmap, grad, jvp and sharding re-specialise
or re-use kernels before any backend sees them, so the CUDA lowering must take what they make
(a vmap adds grid axes: three nested vmaps of a 1-D grid give four, more than CUDA's three).
Run in the SIMT emulator, with its race and bounds checks on, against plain jnp."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt


def _data(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _softmax(x):
    return jax.nn.softmax(x, axis=-1)


def test_vmap_adds_grid_axes_beyond_cudas_three(emulator):
    x = _data((2, 3, 2, 10, 70))
    y = jax.jit(jax.vmap(jax.vmap(jax.vmap(jt.ops.softmax))))(x)
    np.testing.assert_allclose(y, _softmax(x), rtol=1e-5, atol=1e-7)
    # An unbatched operand is passed as it is.
    a, b = _data((3, 20, 24), 1), _data((24, 40), 2)
    c = jax.jit(jax.vmap(lambda a: jt.ops.matmul_relu(a, b, bm=16, bn=32, bk=8)))(a)
    want = jnp.maximum(jnp.einsum("bmk,kn->bmn", a, b, precision="highest"), 0)
    np.testing.assert_allclose(c, want, rtol=2e-2, atol=2e-2)   # tf32 tensor cores


def test_grad_and_jvp_run_the_library_rules(emulator):
    x, t = _data((20, 130), 3), _data((20, 130), 4)

    def loss(f):
        return lambda x: jnp.sum(f(x) ** 2 * jnp.arange(130.0))

    g = jax.jit(jax.grad(loss(jt.ops.softmax)))(x)
    np.testing.assert_allclose(g, jax.grad(loss(_softmax))(x), rtol=1e-4, atol=1e-6)
    y, ty = jax.jvp(jt.ops.softmax, (x,), (t,))
    y_ref, ty_ref = jax.jvp(_softmax, (x,), (t,))
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ty, ty_ref, rtol=1e-4, atol=1e-6)


_SHARDING = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jaxtile as jt

    assert jt.backend() == "cuda-emulator" and jax.device_count() == 2
    mesh = jax.make_mesh((2,), ("x",))
    x = jax.device_put(jax.random.normal(jax.random.key(0), (16, 70)),
                       NamedSharding(mesh, P("x", None)))
    f = jax.jit(jt.ops.softmax)
    y = f(x)
    np.testing.assert_allclose(y, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-7)
    assert y.sharding.spec[0] == "x", y.sharding
    hlo = f.lower(x).compile().as_text()
    assert "all-gather" not in hlo and "jaxtile" in hlo
    print("sharding ok")
""")


def test_sharded_inputs_run_per_shard():
    env = {**os.environ, "JAXTILE_BACKEND": "cuda-emulator", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run([sys.executable, "-c", _SHARDING], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "sharding ok" in proc.stdout, proc.stderr[-3000:]
