"""Under ``jax.profiler`` the CPU thread pool's work shows as ranges named after the kernel
(``ffi/cpu/trace.cc``): one per chunk of blocks, on the thread that ran it, inside the
kernel call's own range (the HLO op, ``tests/primitives/test_lowering.py``)."""

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt


@jt.kernel(threads=128)
def shift_rows(x, *, rows=4):
    out = jt.empty(x.shape, x.dtype)
    r = jt.grid(jt.cdiv(x.shape[0], rows))
    tile = jt.fragment((rows, x.shape[1]), jnp.float32)
    jt.copy(x.at[r * rows, 0], tile)
    tile[...] = tile[...] + 5.0
    jt.copy(tile, out.at[r * rows, 0])
    return out


def _events(tmp_path, fn, *args):
    jax.block_until_ready(fn(*args))  # compile and load outside the trace
    with jax.profiler.trace(str(tmp_path)):
        jax.block_until_ready(fn(*args))
    (trace,) = tmp_path.rglob("*.trace.json.gz")
    return json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]


def test_pool_chunks_are_named_ranges_in_the_trace(tmp_path):
    x = jnp.arange(256 * 128, dtype=jnp.float32).reshape(256, 128)
    f = jax.jit(lambda x: shift_rows(x) * 2)
    np.testing.assert_array_equal(f(x), (np.asarray(x) + 5) * 2)
    np.testing.assert_array_equal(shift_rows(x), shift_rows.reference(x))
    events = _events(tmp_path, f, x)
    pool = {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
            and e["args"]["name"] == "/device:CUSTOM:jaxtile CPU pool"}
    assert len(pool) == 1, sorted({str(e.get("args")) for e in events if e.get("ph") == "M"})
    chunks = [e for e in events if e.get("ph") == "X" and e["pid"] in pool]
    assert chunks and all(e["name"] == "shift_rows" for e in chunks), chunks
    # The chunks cover the grid's 64 blocks once each.
    covered = sorted((int(e["args"]["first block"]), int(e["args"]["blocks"])) for e in chunks)
    blocks = [b for first, n in covered for b in range(first, first + n)]
    assert blocks == list(range(64)), covered
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"
               and e.get("pid") in pool and e["name"] == "thread_name"}
    assert {e["tid"] for e in chunks} <= set(threads), threads
    # Every chunk lies within the kernel call's range on XLA's timeline (same clock).
    (call,) = [e for e in events if e.get("ph") == "X"
               and e["name"].startswith("shift_rows_f32_256_128_")]
    slack = 50.0  # microseconds: the two recorders take their clocks separately
    for e in chunks:
        assert call["ts"] - slack <= e["ts"] and e["ts"] + e["dur"] <= \
            call["ts"] + call["dur"] + slack, (call, e)


def test_calls_before_a_trace_do_not_show_in_it(tmp_path):
    x = jnp.ones((64, 128), jnp.float32)
    jax.block_until_ready(shift_rows(x))
    events = _events(tmp_path, jax.jit(lambda x: x + 1), x)
    assert not [e for e in events if e.get("name") == "shift_rows"]
