"""The differentiable library kernels (matmul, softmax, rms_norm, layer_norm) and their
backward rules.

Each kernel is checked against its reference semantics and an independent jnp formula,
forward and backward, on shapes that do and do not divide the tiles, in float32 and
bfloat16; then under the transformations (jit, grad, jvp, jacfwd, jacrev, vmap inside and
around grad, second order, finite differences) against the same transformation of the formula.

Every side of a comparison runs under ``jax.jit`` unless the test is about eager mode: eager
transformations of jnp compile each primitive on first use, which would dominate the runtime.
The reference semantics (a loop over blocks) is the expensive side to compile, so it is used on
a chosen subset of the cases.
"""

import dataclasses
import functools
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxtile as jt

F32 = np.float32
BF16 = ml_dtypes.bfloat16
HI = jax.lax.Precision.HIGHEST
TILES = {"bm": 16, "bn": 16, "bk": 8}
EPS = 1e-6
LN_EPS = 1e-5


def assert_close(got, want, tol):
    """Normwise closeness: each element within ``tol`` times the largest ``|want|``."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(scale, 1e-30))


def assert_tree_close(got, want, tol):
    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        assert_close(g, w, tol)


def _arrays(rng, shapes, dtype=F32):
    return tuple(jnp.asarray(rng.standard_normal(s).astype(dtype)) for s in shapes)


# --- independent formulas ------------------------------------------------------------------

def matmul_formula(ta, tb):
    def f(a, b):
        out = jnp.matmul((a.T if ta else a).astype(F32), (b.T if tb else b).astype(F32),
                         precision=HI)
        return out.astype(a.dtype)
    return f


def softmax_formula(x):
    return jax.nn.softmax(x.astype(F32), axis=-1).astype(x.dtype)


def rms_norm_formula(x, w):
    xf = x.astype(F32)
    y = xf / jnp.sqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + EPS) * w.astype(F32)
    return y.astype(x.dtype)


def layer_norm_formula(x, w, b):
    xf = x.astype(F32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean((xf - mean) ** 2, axis=-1, keepdims=True)
    y = (xf - mean) / jnp.sqrt(var + LN_EPS) * w.astype(F32) + b.astype(F32)
    return y.astype(x.dtype)


# --- the cases -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    op: Callable
    """The compiled kernel (differentiated with its rule)."""
    ref: Callable
    """The kernel's reference semantics (differentiated as plain JAX)."""
    formula: Callable
    ragged: tuple
    """Argument shapes that do not divide the tiles."""
    even: tuple
    """Argument shapes that do."""
    tiny: tuple
    """Argument shapes for Hessians."""

    def __str__(self):
        return self.name


def _matmul_case(ta, tb):
    kw = {"transpose_a": ta, "transpose_b": tb, **TILES}

    def shapes(m, k, n):
        return ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))

    return Case(f"matmul_{'nt'[ta]}{'nt'[tb]}", lambda a, b: jt.ops.matmul(a, b, **kw),
                lambda a, b: jt.ops.matmul.reference(a, b, **kw), matmul_formula(ta, tb),
                shapes(7, 20, 12), shapes(32, 16, 48), shapes(2, 3, 2))


MATMUL_NN, MATMUL_NT, MATMUL_TN, MATMUL_TT = (
    _matmul_case(ta, tb) for ta, tb in itertools.product([False, True], repeat=2))
SOFTMAX = Case("softmax", jt.ops.softmax, jt.ops.softmax.reference, softmax_formula,
               ((6, 20),), ((8, 128),), ((2, 3),))
RMS_NORM = Case("rms_norm", jt.ops.rms_norm, jt.ops.rms_norm.reference, rms_norm_formula,
                ((6, 20), (20,)), ((8, 128), (128,)), ((2, 3), (3,)))
LAYER_NORM = Case("layer_norm", jt.ops.layer_norm, jt.ops.layer_norm.reference,
                  layer_norm_formula, ((6, 20), (20,), (20,)), ((8, 128), (128,), (128,)),
                  ((2, 3), (3,), (3,)))
CASES = [MATMUL_NN, MATMUL_NT, MATMUL_TN, MATMUL_TT, SOFTMAX, RMS_NORM, LAYER_NORM]
# The transformation tests take the matmul with both operands transposed: the rule must
# undo both transposes, and the plain case is covered by the others.
TRANSFORM_CASES = [MATMUL_TT, SOFTMAX, RMS_NORM, LAYER_NORM]


def _weights(case, args):
    shape = jax.eval_shape(case.formula, *args).shape
    return jnp.asarray(np.random.default_rng(1).standard_normal(shape).astype(F32))


def _loss(fn, weights):
    """A smooth, well-conditioned scalar of ``fn``'s output (an O(0.1) mean)."""
    return lambda *args: jnp.mean(jnp.sin(fn(*args).astype(F32)) * weights)


def _argnums(args):
    return tuple(range(len(args)))


def _value_and_grads(fn, weights):
    """``fn``'s output and the gradient of ``_loss`` for every argument, in one program."""
    def both(*args):
        return fn(*args), jax.grad(_loss(fn, weights), _argnums(args))(*args)
    return jax.jit(both)


# --- forward and gradient against the reference semantics and the formula ------------------

# Differentiating the reference semantics (a loop over blocks) takes seconds to compile, so
# the gradients are compared with it on these (case, even) pairs; outputs on all of them.
REF_GRADS = {(MATMUL_NN, False), (SOFTMAX, False), (RMS_NORM, False), (LAYER_NORM, False)}


@pytest.mark.parametrize("even", [False, True], ids=["ragged", "even"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference_and_formula(rng, case, even):
    args = _arrays(rng, case.even if even else case.ragged)
    w = _weights(case, args)
    got = _value_and_grads(case.op, w)(*args)
    assert got[0].dtype == F32
    assert_tree_close(got, _value_and_grads(case.formula, w)(*args), 1e-5)
    if (case, even) in REF_GRADS:
        assert_tree_close(got, _value_and_grads(case.ref, w)(*args), 1e-5)
    else:
        assert_close(got[0], jax.jit(case.ref)(*args), 1e-5)


@pytest.mark.parametrize("case", [MATMUL_TT, SOFTMAX, RMS_NORM, LAYER_NORM], ids=str)
def test_bfloat16(rng, case):
    args = _arrays(rng, case.ragged, BF16)
    w = _weights(case, args)
    out, grads = _value_and_grads(case.op, w)(*args)
    assert out.dtype == BF16 and all(g.dtype == BF16 for g in grads)
    assert_close(out, jax.jit(case.ref)(*args), 2 ** -8)
    # The formula on the same bfloat16 inputs, computed in float32 and rounded to bfloat16
    # where the kernels round (outputs, cotangents, gradients): within one bfloat16 ulp.
    want_out, want_grads = _value_and_grads(case.formula, w)(*args)
    assert_close(out, want_out, 2 ** -8)
    assert_tree_close(grads, want_grads, 2 ** -7)


def test_softmax_bwd_kernel(rng):
    for shape in [(6, 20), (8, 128), (5, 130)]:
        x, g = _arrays(rng, (shape, shape))
        y = jax.nn.softmax(x, axis=-1)
        got = jax.jit(jt.ops.softmax_bwd)(y, g)
        assert_close(got, y * (g - jnp.sum(g * y, axis=-1, keepdims=True)), 1e-5)
    assert_close(got, jax.jit(jt.ops.softmax_bwd.reference)(y, g), 1e-5)


@pytest.mark.parametrize("n_rows, groups, blocks", [(6, 1, 2), (26, 2, 4), (6, 8, 1)],
                         ids=["one-tile-per-block", "ragged-last-group", "one-block"])
def test_rms_norm_fwd_and_bwd_kernels(rng, n_rows, groups, blocks):
    """The rule's kernels on their own, in tiles of 4 rows, ``groups`` tiles per block of
    the backward kernel (the last tile, and with 26 rows the last group, are ragged)."""
    x, w, g = _arrays(rng, ((n_rows, 20), (20,), (n_rows, 20)))
    y, rstd = jax.jit(jt.ops.rms_norm_fwd)(x, w)
    assert_close(y, rms_norm_formula(x, w), 1e-5)
    assert_close(rstd, 1 / jnp.sqrt(jnp.mean(x * x, axis=-1) + EPS), 1e-5)
    bwd = functools.partial(jt.ops.rms_norm_bwd, groups=groups)
    dx, dw_part = jax.jit(bwd)(x, w, rstd, g)
    assert dw_part.shape == (blocks, 20)
    want_dx, want_dw = jax.vjp(rms_norm_formula, x, w)[1](g)
    assert_close(dx, want_dx, 1e-5)
    assert_close(jnp.sum(dw_part, axis=0), want_dw, 1e-5)
    reference = jax.jit(functools.partial(jt.ops.rms_norm_bwd.reference, groups=groups))
    assert_tree_close((dx, dw_part), reference(x, w, rstd, g), 1e-5)


@pytest.mark.parametrize("groups, blocks", [(1, 7), (2, 4)])
def test_layer_norm_bwd_kernel_partial_sums(rng, groups, blocks):
    x, w, b, g = _arrays(rng, ((26, 20), (20,), (20,), (26, 20)))
    _, mean, rstd = jax.jit(jt.ops.layer_norm_fwd)(x, w, b)
    bwd = functools.partial(jt.ops.layer_norm_bwd, groups=groups)
    dx, dw_part, db_part = jax.jit(bwd)(x, w, mean, rstd, g)
    assert dw_part.shape == db_part.shape == (blocks, 20)
    want_dx, want_dw, want_db = jax.vjp(layer_norm_formula, x, w, b)[1](g)
    assert_close(dx, want_dx, 1e-5)
    assert_close(jnp.sum(dw_part, axis=0), want_dw, 1e-5)
    assert_close(jnp.sum(db_part, axis=0), want_db, 1e-5)


def test_matmul_rejects_mismatched_contraction():
    with pytest.raises(jt.KernelError, match=r"contraction dimensions differ.*\(3, 4\)"):
        jt.ops.matmul(jnp.ones((3, 4)), jnp.ones((5, 6)))


@pytest.mark.parametrize("case, kernels", [
    (MATMUL_NT, ["matmul"] * 3), (SOFTMAX, ["softmax", "softmax_bwd"]),
    (RMS_NORM, ["rms_norm_bwd", "rms_norm_fwd"]),
    (LAYER_NORM, ["layer_norm_bwd", "layer_norm_fwd"])],
    ids=["matmul_nt", "softmax", "rms_norm", "layer_norm"])
def test_grad_runs_the_backward_kernels(rng, case, kernels):
    """jax.grad runs the rules' compiled kernels, not the reference semantics (a loop)."""
    args = _arrays(rng, case.ragged)
    jaxpr = jax.make_jaxpr(jax.grad(_loss(case.op, _weights(case, args)), _argnums(args)))(
        *args)
    calls = [e for e in jaxpr.eqns if e.primitive.name == "jaxtile_kernel_call"]
    assert sorted(str(e.params["kernel"]).split("@")[0] for e in calls) == kernels
    assert not {"while", "scan"} & {e.primitive.name for e in jaxpr.eqns}


@pytest.mark.parametrize("case, kernels", [
    (MATMUL_NT, 3), (SOFTMAX, 2), (RMS_NORM, 1), (LAYER_NORM, 1)],
    ids=["matmul_nt", "softmax", "rms_norm", "layer_norm"])
def test_jvp_runs_the_forward_rules(rng, case, kernels):
    """jax.jvp runs the rules of ``defjvp`` (kernels, or a jnp formula for the norms), not
    the reference semantics (a loop): the compiled program has no while loop."""
    args = _arrays(rng, case.ragged)
    text = jax.jit(lambda *a: _jvp(case.op, None, *a)).lower(*args).as_text()
    assert text.count("jaxtile_cpu_call") == kernels
    assert "stablehlo.while" not in text


# --- transformations -----------------------------------------------------------------------

def _tangents(args):
    rng = np.random.default_rng(2)
    return tuple(jnp.asarray(rng.standard_normal(a.shape).astype(F32)) for a in args)


def _batched(args):
    """A batch of 3 first arguments; the others (b of a matmul, w of rms_norm) are shared."""
    return (jnp.stack([args[0], 2 * args[0], -0.5 * args[0]]),) + args[1:], \
        (0,) + (None,) * (len(args) - 1)


def _jvp(fn, w, *args):
    return jax.jvp(fn, args, _tangents(args))


def _jacfwd(fn, w, *args):
    return jax.jacfwd(fn, _argnums(args))(*args)


def _jacrev(fn, w, *args):
    return jax.jacrev(fn, _argnums(args))(*args)


def _vmap_grad(fn, w, *args):
    batch, axes = _batched(args)
    return jax.vmap(jax.grad(_loss(fn, w), _argnums(args)), axes)(*batch)


def _grad_vmap(fn, w, *args):
    batch, axes = _batched(args)
    return jax.grad(lambda *a: jnp.sum(jax.vmap(_loss(fn, w), axes)(*a)),
                    _argnums(args))(*batch)


def _grad_of_grad(fn, w, *args):
    def norm2(*a):
        return sum(jnp.sum(g * g) for g in jax.grad(_loss(fn, w), _argnums(a))(*a))
    return jax.grad(norm2, _argnums(args))(*args)


def _hessian(fn, w, *args):
    return jax.hessian(_loss(fn, w), _argnums(args))(*args)


TRANSFORMS = {"jvp": _jvp, "jacfwd": _jacfwd, "jacrev": _jacrev, "vmap_grad": _vmap_grad,
              "grad_vmap": _grad_vmap, "grad_of_grad": _grad_of_grad, "hessian": _hessian}


@pytest.mark.parametrize("case, name", [
    (case, name) for case in TRANSFORM_CASES for name in TRANSFORMS
    # Second order takes seconds to compile (it differentiates the backward kernels through
    # their reference semantics): a Hessian (forward over reverse) or grad_of_grad (reverse
    # over reverse) per kernel, both for softmax. matmul is bilinear, its Hessian a
    # permutation of ones. layer_norm's forward mode takes rms_norm's path (the reference).
    if (case, name) not in {(MATMUL_TT, "hessian"), (RMS_NORM, "hessian"),
                            (LAYER_NORM, "grad_of_grad"), (LAYER_NORM, "jvp"),
                            (LAYER_NORM, "jacfwd")}], ids=str)
def test_transforms_under_jit(rng, case, name):
    args = _arrays(rng, case.tiny if name == "hessian" else case.ragged)
    w = _weights(case, args)
    run = TRANSFORMS[name]
    got = jax.jit(functools.partial(run, case.op, w))(*args)
    want = jax.jit(functools.partial(run, case.formula, w))(*args)
    assert_tree_close(got, want, 1e-4)


def test_eager_grad_and_vmap_grad(rng):
    """Outside jit: grad and vmap(grad) with a shared argument (w)."""
    args = _arrays(rng, RMS_NORM.ragged)
    w = _weights(RMS_NORM, args)
    for run in (lambda fn, *a: jax.grad(_loss(fn, w), (0, 1))(*a),
                lambda fn, *a: _vmap_grad(fn, w, *a)):
        want = jax.jit(functools.partial(run, RMS_NORM.formula))(*args)
        assert_tree_close(run(RMS_NORM.op, *args), want, 1e-5)


@pytest.mark.parametrize("case", [MATMUL_TN, SOFTMAX, RMS_NORM, LAYER_NORM], ids=str)
def test_check_grads_against_finite_differences(rng, case):
    # float32 central differences: eps=1e-3 keeps the rounding noise (~ulp(f)/eps) and the
    # truncation error (~eps**2) near 1e-5 relative to the O(0.1) directional derivatives,
    # so a tolerance of 1e-3 is tight enough to catch a wrong rule.
    args = _arrays(rng, case.ragged)
    loss = jax.jit(_loss(case.op, _weights(case, args)))
    check_grads(loss, args, order=1, modes=("fwd", "rev"), eps=1e-3, atol=1e-3, rtol=1e-3)
