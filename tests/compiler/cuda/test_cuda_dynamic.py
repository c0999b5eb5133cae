"""Dynamic sizes on CUDA without a GPU: one cubin serves every size; the sizes are int
parameters the handler reads from the shapes XLA passes, and the grid is computed there
from a size expression over those shapes."""

import re

import jax
import jax.numpy as jnp
import pytest
from cuda_kernels import needs_compiler

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import build, cache
from jaxtile.compiler.gpu.launch import Launch
from jaxtile.compiler.target import parse_target
from jaxtile.primitives import payload

pytestmark = needs_compiler


@jt.kernel(dynamic={"x": (0, 1)})
def pool_rows(x, *, rows=4, cols=8):
    n, m = x.shape
    out = jt.empty((jt.cdiv(n, rows), m), jnp.float32)
    c, r = jt.grid(jt.cdiv(m, cols), jt.cdiv(n, rows))
    t = jt.fragment((rows, cols), jnp.float32)
    jt.copy(x.at[r * rows, c * cols], t, pad=-jnp.inf)
    o = jt.fragment((1, cols), jnp.float32)
    o[...] = jnp.max(t[...], axis=0, keepdims=True) + n     # n: a size used as a value
    jt.copy(o, out.at[r, c * cols])
    return out


def _launch_of_export(shape):
    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
    exported = jax.export.export(jax.jit(pool_rows), platforms=["cuda"],
                                 disabled_checks=jt.export_checks())(spec)
    (line,) = [ln for ln in exported.mlir_module().splitlines() if "jaxtile_cuda_call" in ln]
    key = re.search(r'key = "([^"]+)"', line).group(1)
    text = re.search(r'payload = "((?:[^"\\]|\\.)*)"', line).group(1)
    text = re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
    fields, artifact = payload.unpack(text)
    assert artifact[:4] == b"\x7fELF" and fields["key"] == key
    return fields["launch"], artifact, key


def test_one_cubin_for_every_size_with_the_grid_from_the_shapes():
    launches, cubins, keys = set(), set(), set()
    for shape in ((13, 37), (4, 8), (30, 3)):
        launch, cubin, key = _launch_of_export(shape)
        launches.add(launch)
        cubins.add(cubin)
        keys.add(key)
    # one payload for every size: the handler loads one module
    assert len(launches) == 1 and len(cubins) == 1 and len(keys) == 1
    (launch,) = launches
    decoded = Launch.decode(launch)
    assert decoded.params == ("b0", "b1", "dim0_0", "dim0_1")   # x, out, then sz_x_0, sz_x_1
    assert not isinstance(decoded.grid[0], int) and decoded.grid[1:] == (1, 1)
    for n, m in ((13, 37), (4, 8), (30, 3), (1, 1), (1000, 9)):
        got = _ffi.cuda_launch_geometry(launch, [[n, m], [-(-n // 4), m]])
        assert got["grid"] == (-(-m // 8) * -(-n // 4), 1, 1)
        assert got["params"] == [0, 1, n, m]
    with pytest.raises(ValueError, match="dimension 1 of buffer 0"):
        _ffi.cuda_launch_geometry(launch, [[13]])


def test_the_source_takes_the_sizes_as_parameters():
    lowered = pool_rows.lower(jnp.ones((13, 37)), target="cuda:sm_80")
    src = lowered.source
    assert "int sz_x_0, int sz_x_1)" in src
    assert "unsigned(sz_x_0)" in src                  # the row mask uses the size
    # block indices decoded from a grid of size expressions
    assert "% size_floordiv((sz_x_1 + 7), 8)" in src
    entry = build.build(lowered.kernel, parse_target("cuda:sm_80"))
    assert entry.kind == cache.CUDA_CUBIN


@pytest.mark.parametrize("text,why", [
    ("grid=floordiv(dim0_0,0),1,1;block=1,1,1;smem=0;params=", "divides by a zero size"),
    ("grid=dim0_0-5,1,1;block=1,1,1;smem=0;params=", "comes out as -4"),
    ("grid=foo(dim0_0),1,1;block=1,1,1;smem=0;params=", "bad size expression"),
])
def test_bad_grids_are_refused_with_the_reason(text, why):
    with pytest.raises(ValueError, match=why):
        _ffi.cuda_launch_geometry(text, [[1]])


@jt.kernel(dynamic={"x": (1,)})
def _double_rows(x, *, rows=4, cols=64):
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    c, r = jt.grid(jt.cdiv(m, cols), jt.cdiv(n, rows))
    t = jt.fragment((rows, cols), jnp.float32)
    jt.copy(x.at[r * rows, c * cols], t)
    t[...] = t[...] * 2
    jt.copy(t, out.at[r * rows, c * cols])
    return out


@jt.kernel
def _double_rows_static(x, *, rows=4, cols=64):
    return _double_rows.fn(x, rows=rows, cols=cols)


def test_rows_of_a_dynamic_length_are_not_assumed_aligned():
    # The handler checks only the buffers' base addresses at launch (16 bytes): a row whose
    # length is a launch-time size may start anywhere (13 floats: 52 bytes), so the code
    # generator reads and writes such rows element by element, never in 16-byte vectors.
    spec = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    static = _double_rows_static.lower(spec, target="cuda:sm_80").source
    assert "ptr_cast<f32x4>" in static      # rows of 128 floats: vectors
    dynamic = _double_rows.lower(spec, target="cuda:sm_80").source
    assert "ptr_cast<" not in dynamic and "cp_async" not in dynamic
