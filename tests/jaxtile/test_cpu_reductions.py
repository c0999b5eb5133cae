"""Reductions along a non-contiguous axis vectorise on the CPU (``compiler/cpu/reductions.py``:
the result array is the accumulator, updated by one vector pass over the contiguous axis per
reduced index): checked in the generated TIR and LLVM IR, and against the reference
semantics and numpy on shapes the tiles do and do not divide, in three dtypes."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from language_helpers import BF16, F16, F32, check, data

import jaxtile as jt
from jaxtile.compiler import build
from jaxtile.compiler.cpu import lower, tir_emit
from jaxtile.compiler.target import parse_target

TOL = {F32: {"rtol": 1e-5, "atol": 1e-5}, BF16: {"rtol": 2 ** -7, "atol": 1e-2},
       F16: {"rtol": 2 ** -10, "atol": 1e-3}}


@jt.kernel
def column_reduce(x, *, rows=16, cols=64, fn="sum"):
    """Per tile, the sum (or max) over its rows: one output row per row tile."""
    out = jt.empty((jt.cdiv(x.shape[0], rows), x.shape[1]), jnp.float32)
    j, i = jt.grid(jt.cdiv(x.shape[1], cols), jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, cols), jnp.float32)
    o = jt.fragment((1, cols), jnp.float32)
    jt.copy(x.at[i * rows, j * cols], t, pad=0.0 if fn == "sum" else -jnp.inf)
    reduce = jnp.sum if fn == "sum" else jnp.max
    o[...] = reduce(t[...], axis=0, keepdims=True)
    jt.copy(o, out.at[i, j * cols])
    return out


@jt.kernel
def middle_sum(x, *, rows=4):
    """(rows, k, n) tiles summed over the middle axis."""
    b, k, n = x.shape
    out = jt.empty((b, n), jnp.float32)
    i = jt.grid(jt.cdiv(b, rows))
    t = jt.fragment((rows, k, n), jnp.float32)
    o = jt.fragment((rows, n), jnp.float32)
    jt.copy(x.at[i * rows, 0, 0], t)
    o[...] = jnp.sum(t[...], axis=1)
    jt.copy(o, out.at[i * rows, 0])
    return out


_VECTOR_LOOP = re.compile(r"^(\s*)for (v\d+) in T\.vectorized\((\d+)\):$")
_UPDATE = re.compile(r"^\s*(t\d+)\[([^\]]*)\] = (?:\1\[[^\]]*\] \+ |"
                     r"T\.call_llvm_pure_intrin\(\"float32\", \"llvm\.maximum\", \1\[)")


def _vector_updates(source: str) -> list[int]:
    """The lane counts of vectorised loops that update an array with itself combined with
    another value at the loop's lane (the accumulator update of a reduction that keeps the
    contiguous axis)."""
    found, loop = [], None
    for line in source.splitlines():
        m = _VECTOR_LOOP.match(line)
        if m:
            loop = m
            continue
        if loop is not None and len(line) - len(line.lstrip()) <= len(loop.group(1)):
            loop = None
        u = _UPDATE.match(line) if loop is not None else None
        if u and loop.group(2) in u.group(2):
            found.append(int(loop.group(3)))
    return found


def _llvm_ir(lowered) -> str:
    target = parse_target("cpu")
    func = lower.to_tir(build.lowered_ir(lowered.kernel, target), target)
    return tir_emit.build(func, tir_emit.host_cpu()).inspect_source("ll")


@pytest.mark.parametrize("fn", ["sum", "max"])
def test_column_reduction_is_a_vector_pass_per_row(fn):
    x = jnp.zeros((100, 200), jnp.float32)
    lowered = column_reduce.lower(x, fn=fn)
    found = _vector_updates(lowered.source)
    assert found, "no vectorised accumulator update in the TIR"
    lanes = parse_target("cpu").caps.vector_bits // 32
    assert set(found) == {lanes}
    op = "fadd" if fn == "sum" else "llvm.maximum"
    assert re.search(rf"{op}[^\n]*<{lanes} x float>", _llvm_ir(lowered))


def test_middle_axis_reduction_is_vectorised():
    x = jnp.zeros((10, 6, 48), jnp.float32)
    lowered = middle_sum.lower(x)
    assert _vector_updates(lowered.source)
    assert re.search(r"fadd[^\n]*<\d+ x float>", _llvm_ir(lowered))


def _np_column(x, rows, fn):
    xf = np.asarray(x, np.float64)
    tiles = [xf[s:s + rows] for s in range(0, xf.shape[0], rows)]
    reduce = np.sum if fn == "sum" else np.max
    return np.stack([reduce(t, axis=0) for t in tiles]).astype(np.float32)


@pytest.mark.parametrize("shape", [(100, 200), (64, 128)], ids=["ragged", "even"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("fn", ["sum", "max"])
def test_column_reduction_matches_numpy(rng, shape, dtype, fn):
    x = data(rng, shape, dtype, edges=False)
    check(column_reduce, [x], _np_column(x, 16, fn), {"fn": fn}, **TOL[dtype])


def test_column_max_propagates_nan_and_keeps_inf(rng):
    x = np.array(data(rng, (40, 70), F32, edges=False))
    x[3, 5], x[20, 6], x[21, 7] = np.nan, np.inf, -np.inf
    x = jnp.asarray(x)
    got = check(column_reduce, [x], _np_column(x, 16, "max"), {"fn": "max"}, rtol=0, atol=0)
    assert np.isnan(np.asarray(got)[0, 5]) and np.asarray(got)[1, 6] == np.inf


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_middle_axis_reduction_matches_numpy(rng, dtype):
    x = data(rng, (10, 6, 48), dtype, edges=False)
    want = np.asarray(x, np.float64).sum(axis=1).astype(np.float32)
    check(middle_sum, [x], want, **TOL[dtype])
