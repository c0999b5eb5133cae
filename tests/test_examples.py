"""The examples run: the training examples at a small size, succeed, and would fail on a
mismatch; the kernel examples (issue 19, point 19) match their reference semantics and jnp."""

import importlib
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.mark.parametrize("script, framework", [("flax_train.py", "flax"),
                                               ("equinox_train.py", "equinox")])
def test_example_trains_and_matches_jnp(script, framework):
    pytest.importorskip("optax")
    pytest.importorskip(framework)
    # The child inherits the test session's JAXTILE_CACHE_DIR (see conftest.py).
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--small",
                           "--steps", "10"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("OK: losses decreased"), proc.stdout
    assert sum(line.startswith(f"{framework}: ") for line in lines) == 1 + 10 + 1


@pytest.mark.parametrize("ours, status", [
    ([2.0, 1.5, 1.0], 0),
    ([2.0, 1.5, 1.001], 1),        # off by 1e-3 at the last step
    ([2.0, 2.5, 3.0], 1),          # matches, but the loss rose
])
def test_compare_decides_the_exit_status(capsys, monkeypatch, ours, status):
    monkeypatch.syspath_prepend(EXAMPLES)
    tb = importlib.import_module("_transformer")
    theirs = [2.0, 2.5, 3.0] if ours[-1] == 3.0 else [2.0, 1.5, 1.0]
    seconds = [1.0, 0.01, 0.01]
    assert tb.compare("x", {"jaxtile": (ours, seconds), "jnp": (theirs, seconds)}, 1e-4) == status
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("OK:" if status == 0 else "FAILED:")


# ---- The kernel examples: each kernel against its reference semantics and a jnp formula ----
# One specialisation of each kernel runs by default (compiles dominate: the four together take
# a few seconds on an idle 2-core machine); the other variants and the scripts' own main()
# are marked slow.

def _example(name):
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return importlib.import_module(name)


def _close(got, want, tol):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("act", ["silu", pytest.param("gelu", marks=pytest.mark.slow)])
def test_gemm_epilogue_example(act):
    ex = _example("gemm_epilogue")
    kx, kw, kb = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (70, 40))          # ragged against 64 x 64 x 32 blocks
    w = jax.random.normal(kw, (40, 72)) / 6
    bias = jax.random.normal(kb, (72,))
    got = jax.jit(lambda *a: ex.linear_act(*a, act=act))(x, w, bias)
    _close(got, ex.linear_act.reference(x, w, bias, act=act), 1e-5)
    # An independent formula: the activation written out, not the example's jnp twin.
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(bias, np.float64)
    want = (z / (1 + np.exp(-z)) if act == "silu" else
            0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))))
    _close(got, want, 1e-4)


def test_gemm_epilogue_example_rejects_an_unknown_activation():
    ex = _example("gemm_epilogue")
    x = jnp.ones((8, 8))
    with pytest.raises(Exception, match="act must be"):
        ex.linear_act(x, x, jnp.ones((8,)), act="relu6")


@pytest.mark.parametrize("kind", ["rms", pytest.param("layer", marks=pytest.mark.slow)])
def test_residual_norm_example(kind):
    ex = _example("residual_norm")
    kx, kr, kw = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(kx, (13, 96))          # 13 rows: a ragged last block of 4
    res = jax.random.normal(kr, (13, 96))
    w = 1 + jax.random.normal(kw, (96,)) / 4
    h, y = jax.jit(lambda *a: ex.add_norm(*a, kind=kind))(x, res, w)
    h_ref, y_ref = ex.add_norm.reference(x, res, w, kind=kind)
    _close(h, h_ref, 1e-6)
    _close(y, y_ref, 1e-5)
    norm = jax.nn.standardize if kind == "layer" else (
        lambda v, axis, epsilon: v * jax.lax.rsqrt(jnp.mean(v * v, axis, keepdims=True)
                                                   + epsilon))
    _close(h, x + res, 1e-6)
    _close(y, norm(x + res, axis=-1, epsilon=1e-6) * w, 1e-4)


def test_moe_dispatch_example():
    ex = _example("moe_dispatch")
    kx, kr, kh = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(kx, (24, 16))
    w_router = jax.random.normal(kr, (16, 4))
    token_of, slot_of, weight, _ = ex.route(x, w_router, 2, 8)
    assert int(jnp.sum(slot_of < 0)) > 0         # capacity 8 drops choices: -1 rows are read
    buf = jax.jit(ex.dispatch)(x, token_of)
    _close(buf, ex.dispatch.reference(x, token_of), 0)
    _close(buf, jnp.where((token_of >= 0)[..., None], x[jnp.maximum(token_of, 0)], 0), 0)
    h = jax.random.normal(kh, (4 * 8, 24))
    out = jax.jit(ex.combine)(h, slot_of, weight)
    _close(out, ex.combine.reference(h, slot_of, weight), 1e-6)
    picked = jnp.where((slot_of >= 0)[..., None], h[jnp.maximum(slot_of, 0)], 0)
    _close(out, jnp.einsum("tk,tkf->tf", weight, picked), 1e-5)


@pytest.mark.slow
def test_moe_example_layer_matches_jnp():
    ex = _example("moe_dispatch")
    kx, kr, ke = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(kx, (24, 16))
    w_router = jax.random.normal(kr, (16, 4))
    w_experts = jax.random.normal(ke, (4, 16, 24)) / 4
    _close(jax.jit(lambda *a: ex.moe(*a, capacity=8))(x, w_router, w_experts),
           ex.moe_jnp(x, w_router, w_experts, capacity=8), 1e-4)


def _paged_inputs(ex):
    return ex.example_inputs(jax.random.key(4), batch=3, heads=4, kv_heads=2, d=16, page=8,
                             max_pages=3)


def test_paged_decode_example():
    ex = _example("paged_decode")
    args = _paged_inputs(ex)
    got = jax.jit(ex.paged_decode)(*args)
    _close(got, ex.paged_decode.reference(*args), 1e-5)
    _close(got, ex.paged_decode_jnp(*args), 1e-4)
    assert int(args[4][1]) == 0
    np.testing.assert_array_equal(np.asarray(got[1]), 0)   # no key: zeros


@pytest.mark.slow
def test_paged_decode_example_agrees_with_the_library():
    # Another kernel, another split of the work: jt.ops.attention_decode.
    ex = _example("paged_decode")
    args = _paged_inputs(ex)
    _close(ex.paged_decode(*args), jt.ops.attention_decode(*args), 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemm_epilogue", "residual_norm", "moe_dispatch",
                                  "paged_decode"])
def test_kernel_example_main_checks_itself(capsys, name):
    # Each example's main() compares itself with jnp and ends with OK (SystemExit if not).
    _example(name).main()
    assert capsys.readouterr().out.strip().splitlines()[-1] == "OK"
