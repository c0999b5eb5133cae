"""Bad arguments to kernels and ops are refused with a clear error naming the argument,
never a silent zero output or a raw error from deep inside JAX or a lowering."""

import jax.numpy as jnp
import pytest

import jaxtile as jt


@pytest.mark.parametrize("splits", [0, -1, 1.5, True])
def test_decode_splits_must_be_a_positive_int(splits):
    """splits=0 launched no block and returned zeros."""
    q = jnp.ones((1, 2, 16))
    pages = jnp.ones((1, 2, 4, 16))
    with pytest.raises(jt.KernelError, match=r"splits must be a positive int, got "):
        jt.ops.attention_decode(q, pages, pages, jnp.zeros((1, 2), jnp.int32),
                                jnp.asarray([5], jnp.int32), splits=splits)
