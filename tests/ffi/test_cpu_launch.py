"""How a CPU kernel call splits its grid blocks over threads (``ffi/cpu/launch.cc``): chunks
that shrink as they are handed out (guided scheduling), so the threads finish close together
whatever their speeds, while the first chunks stay long."""

import functools
import gzip
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_kernels import matmul

import jaxtile as jt
from jaxtile import _ffi

BLOCK_COUNTS = [1, 2, 3, 4, 5, 7, 8, 37, 64, 256, 1000, 4099, 1_000_003]


@pytest.mark.parametrize("threads", [2, 3, 4, 16])
@pytest.mark.parametrize("num_blocks", BLOCK_COUNTS)
def test_chunks_cover_the_blocks_once_and_shrink(num_blocks, threads):
    bounds = _ffi.chunk_bounds(num_blocks, threads)
    assert bounds[0] == 0 and bounds[-1] == num_blocks
    sizes = np.diff(bounds)
    assert (sizes >= 1).all(), bounds
    assert (np.diff(sizes) <= 0).all(), sizes  # never a longer chunk after a shorter one
    # Each chunk is at most 1 / (2 * threads) of what was left when it was handed out
    # (rounded up): while one thread runs it, the others have at least that much again.
    left = num_blocks - np.asarray(bounds[:-1])
    assert (sizes <= -(-left // (2 * threads))).all(), sizes
    # ... and no shorter than that: few chunks, so few chunk starts.
    assert (sizes >= left // (2 * threads)).all(), sizes
    # The last chunks are single blocks; the number of chunks grows with the log of the
    # blocks (2 * threads per factor e of them), not with the blocks.
    assert sizes[-1] == 1
    assert len(sizes) <= 2 * threads * (math.log(num_blocks) + 2), len(sizes)


def test_one_thread_or_no_blocks():
    assert _ffi.chunk_bounds(256, 1) == [0, 256]
    assert _ffi.chunk_bounds(1, 4) == [0, 1]
    assert _ffi.chunk_bounds(0, 4) == [0]


def test_the_1024_cubed_gemm_split():
    # The AVX2 GEMM of benchmarks/plain_kernels.py: 256 blocks on 2 threads. Written out,
    # as a check of the rule independent of it: a quarter of what is left, rounded up.
    assert _ffi.chunk_bounds(256, 2) == [0, 64, 112, 148, 175, 196, 211, 223, 232, 238,
                                         243, 247, 250, 252, 253, 254, 255, 256]


@jt.kernel(threads=128)
def add_block_index(x, *, rows=4):
    out = jt.empty(x.shape, x.dtype)
    r = jt.grid(jt.cdiv(x.shape[0], rows))
    tile = jt.fragment((rows, x.shape[1]), jnp.float32)
    jt.copy(x.at[r * rows, 0], tile)
    tile[...] = tile[...] + r.astype(jnp.float32)
    jt.copy(tile, out.at[r * rows, 0])
    return out


@pytest.mark.skipif(_ffi.num_threads() < 2, reason="needs 2 threads to split a call")
@pytest.mark.parametrize("num_blocks", [3, 37, 256])
def test_a_call_runs_the_planned_chunks(tmp_path, num_blocks):
    """Under jax.profiler each chunk a thread runs is a range (ffi/cpu/trace.cc): a jitted
    call runs exactly the chunks of chunk_bounds, and the result is every block's."""
    rows = 4
    x = jnp.arange(num_blocks * rows * 8, dtype=jnp.float32).reshape(num_blocks * rows, 8)
    f = jax.jit(add_block_index)
    want = np.asarray(x) + (np.arange(num_blocks * rows) // rows)[:, None]
    np.testing.assert_array_equal(f(x), want)
    with jax.profiler.trace(str(tmp_path)):
        np.testing.assert_array_equal(f(x), want)
    (trace,) = tmp_path.rglob("*.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    chunks = sorted((int(e["args"]["first block"]), int(e["args"]["blocks"]))
                    for e in events if e.get("ph") == "X" and e["name"] == "add_block_index")
    # XLA's pool lends at most num_threads() - 1 helpers (thread_pool.h, plan_threads).
    bounds = _ffi.chunk_bounds(num_blocks, _ffi.num_threads())
    assert chunks == list(zip(bounds[:-1], np.diff(bounds).tolist())), chunks


def _isa_levels():
    from jaxtile.compiler import target
    from jaxtile.compiler.target import ISA_LEVELS
    avx2 = set(ISA_LEVELS["x86-64-v3"]) <= set(target.host_isa())
    return [pytest.param("x86-64-v3", marks=pytest.mark.skipif(
        not avx2, reason="this CPU cannot run x86-64-v3 code")), "host"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("level", _isa_levels())
def test_a_gemm_split_into_shrinking_chunks(monkeypatch, level, dtype):
    """A GEMM whose blocks reuse one copied panel of B down a column of blocks
    (compiler/cpu/copy_reuse.py) must copy it again at every chunk's start: the guided split
    starts chunks in the middle of columns and ends in single blocks. 37 x 5 blocks, ragged
    on both edges and along K, NaN and infinities, each ISA; against a float64 product of
    the same (bfloat16-rounded) operands."""
    monkeypatch.setenv("JAXTILE_CPU_ISA", level)
    m, k, n = 587, 45, 77
    rng = np.random.default_rng(7)
    a = jnp.asarray(rng.standard_normal((m, k)), dtype)
    b = jnp.asarray(rng.standard_normal((k, n)), dtype)
    a = a.at[0, 3].set(jnp.nan)             # row 0 of the output: NaN
    b = b.at[2, 7].set(jnp.inf)             # column 7: +-inf (no zero in A's column 2)
    b = b.at[2, 70].set(-jnp.inf)           # column 70, in the ragged last column of blocks
    got = np.asarray(jax.jit(functools.partial(matmul, bm=16, bn=16, bk=16))(a, b))
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        want = a64 @ b64
    assert np.count_nonzero(np.isinf(want)) > 1000
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) & (got > 0), np.isinf(want) & (want > 0))
    np.testing.assert_array_equal(np.isinf(got) & (got < 0), np.isinf(want) & (want < 0))
    finite = np.isfinite(want)
    with np.errstate(invalid="ignore"):
        bound = k * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
    assert (np.abs(got[finite] - want[finite]) <= bound[finite] + 1e-30).all()
    # More chunks than columns of blocks, so some start mid-column (on two threads or more).
    if _ffi.num_threads() > 1:
        assert len(_ffi.chunk_bounds(37 * 5, _ffi.num_threads())) - 1 > 5
