"""Findings 5 and 8: the library ops check their operands as jnp would, accept zero-size
inputs, and agree with their reference semantics under float overflow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


@pytest.mark.parametrize("call", [
    lambda: jt.ops.add(jnp.arange(10.0), jnp.ones(5)),
    lambda: jt.ops.add(jnp.arange(5.0), jnp.ones(10)),
    lambda: jt.ops.add(jnp.ones((2, 5)), jnp.ones((2, 5))),
    lambda: jt.ops.rms_norm(jnp.ones((4, 8)), jnp.ones(3)),
    lambda: jt.ops.rms_norm(jnp.ones(8), jnp.ones(8)),
    lambda: jt.ops.layer_norm(jnp.ones((4, 8)), jnp.ones(3), jnp.ones(8)),
    lambda: jt.ops.layer_norm(jnp.ones((4, 8)), jnp.ones(8), jnp.ones(9)),
    lambda: jt.ops.softmax(jnp.ones(8)),
    lambda: jt.ops.softmax_bwd(jnp.ones((4, 8)), jnp.ones((4, 9))),
    lambda: jt.ops.softmax_bwd(jnp.ones((4, 8)), jnp.ones((3, 8))),
    lambda: jt.ops.matmul(jnp.ones((4, 8)), jnp.ones((9, 4))),
    lambda: jt.ops.matmul(jnp.ones(8), jnp.ones((8, 4))),
    lambda: jt.ops.matmul_relu(jnp.ones((4, 8)), jnp.ones((9, 4))),
    lambda: jt.ops.rms_norm_bwd(jnp.ones((4, 8)), jnp.ones(8), jnp.ones(4), jnp.ones((4, 7))),
    lambda: jt.ops.layer_norm_bwd(jnp.ones((4, 8)), jnp.ones(8), jnp.ones(3), jnp.ones(4),
                                  jnp.ones((4, 8))),
], ids=["add-short-y", "add-long-y", "add-2d", "rms-weight", "rms-1d", "ln-weight", "ln-bias",
        "softmax-1d", "softmax-bwd-cols", "softmax-bwd-rows", "matmul-k", "matmul-1d",
        "matmul-relu-k", "rms-bwd-g", "ln-bwd-mean"])
def test_mismatched_operands_are_errors(call):
    with pytest.raises((jt.KernelError, ValueError, TypeError), match="shape|rank|dimension"):
        jax.block_until_ready(call())


@pytest.mark.parametrize("name", ["add", "softmax", "rms_norm", "layer_norm", "matmul"])
def test_zero_size_inputs_give_empty_results(name):
    if name == "add":
        got, want = jt.ops.add(jnp.ones(0), jnp.ones(0)), jnp.ones(0) + jnp.ones(0)
    elif name == "softmax":
        x = jnp.ones((0, 8))
        got, want = jt.ops.softmax(x), jax.nn.softmax(x, axis=-1)
    elif name == "rms_norm":
        got, want = jt.ops.rms_norm(jnp.ones((0, 8)), jnp.ones(8)), jnp.ones((0, 8))
    elif name == "layer_norm":
        got = jt.ops.layer_norm(jnp.ones((0, 8)), jnp.ones(8), jnp.ones(8))
        want = jnp.ones((0, 8))
    else:
        got, want = jt.ops.matmul(jnp.ones((0, 8)), jnp.ones((8, 5))), jnp.ones((0, 5))
    assert got.shape == want.shape and got.dtype == want.dtype


def _layer_norm_formula(x, w, b, eps=1e-5):
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
        xc = x - mean
        var = (xc * xc).mean(axis=-1, keepdims=True, dtype=np.float32)
        return xc / np.sqrt(var + np.float32(eps)) * w + b


def test_layer_norm_agrees_with_its_reference_under_overflow():
    x = jnp.array([[3e38, 3e38, -3e38, 1.0], [1.0, 2.0, 3.0, 4.0]], jnp.float32)
    w, b = jnp.ones(4), jnp.zeros(4)
    got = np.asarray(jt.ops.layer_norm(x, w, b))
    ref = np.asarray(jt.ops.layer_norm.reference(x, w, b))
    formula = _layer_norm_formula(x, w, b)
    assert np.isnan(got[0]).all(), got[0]
    assert np.isnan(ref[0]).all() and np.isnan(formula[0]).all()
    np.testing.assert_allclose(got[1], formula[1], rtol=1e-5)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-6)
