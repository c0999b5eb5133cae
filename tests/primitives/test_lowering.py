"""The custom call a kernel lowers to carries the kernel's name and specialisation, so that
XLA's HLO and ``jax.profiler`` traces show which kernel ran (under ``jit`` no Python runs per
call, and the XLA FFI offers a handler no way to open a trace range of its own)."""

import gzip
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt


@jt.kernel(threads=128)
def scale_rows(x, *, rows=4, factor=2.0):
    out = jt.empty(x.shape, x.dtype)
    r = jt.grid(jt.cdiv(x.shape[0], rows))
    tile = jt.fragment((rows, x.shape[1]), jnp.float32)
    jt.copy(x.at[r * rows, 0], tile)
    tile[...] = tile[...] * factor
    jt.copy(tile, out.at[r * rows, 0])
    return out


def _timeline(tmp_path: pathlib.Path, fn, *args) -> list[dict]:
    """The events of a ``jax.profiler`` trace of one call of ``fn`` (after a warm-up call,
    so that the trace holds the run, not the compile)."""
    jax.block_until_ready(fn(*args))
    with jax.profiler.trace(str(tmp_path)):
        jax.block_until_ready(fn(*args))
    traces = list(tmp_path.rglob("*.trace.json.gz"))
    assert len(traces) == 1, traces
    return json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]


def test_a_jitted_kernel_call_is_a_named_range_in_the_profiler_trace(tmp_path):
    x = jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128)
    f = jax.jit(lambda x: scale_rows(x, factor=3.0) + 1)
    np.testing.assert_allclose(f(x), x * 3 + 1)
    events = _timeline(tmp_path, f, x)
    # The timeline names the HLO instruction (sanitised by XLA: "scale_rows(f32[64,128],
    # factor=3.0, rows=4)" -> "scale_rows_f32_64_128___factor_3_0__rows_4_.1").
    names = [e["name"] for e in events if e.get("ph") == "X"
             and e["name"].startswith("scale_rows_f32_64_128_")]
    assert names, sorted({e.get("name") for e in events})
    assert all("factor_3_0" in n and "rows_4" in n for n in names), names
    assert not [e for e in events if "jaxtile_kernel_call" in str(e.get("name"))]


def test_the_hlo_op_carries_the_exact_specialisation():
    x = jnp.ones((64, 128), jnp.float32)
    y = jnp.ones((32, 128), jnp.bfloat16)
    # Two calls of one kernel and a second specialisation in one program: each op its own.
    hlo = jax.jit(lambda x, y: (scale_rows(scale_rows(x), rows=8), scale_rows(y))).lower(
        x, y).compile().as_text()
    calls = [line for line in hlo.splitlines() if "custom-call(" in line]
    assert len(calls) == 3, calls
    types = sorted(line.split('op_type="')[1].split('"')[0] for line in calls)
    assert types == ["scale_rows(bf16[32,128], factor=2.0, rows=4)",
                     "scale_rows(f32[64,128], factor=2.0, rows=4)",
                     "scale_rows(f32[64,128], factor=2.0, rows=8)"], calls
    # op_name keeps the enclosing jit's scope, as for any JAX op.
    assert all('op_name="jit(<lambda>)/scale_rows(' in line for line in calls), calls


def test_an_eager_call_is_named_too(tmp_path):
    x = jnp.ones((64, 128), jnp.float32)
    events = _timeline(tmp_path, scale_rows, x)
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert any(n.startswith("scale_rows_f32_64_128_") for n in names), sorted(names)
    # The program of an eager call is named after the kernel, not after a lambda.
    assert any("jit_scale_rows" in n or "PjitFunction(scale_rows)" in n for n in names), \
        sorted(names)
