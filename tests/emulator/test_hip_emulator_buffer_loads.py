"""Buffer loads in generated HIP code, run in the emulator's wave64 mode (whose
``buffer_load`` reads zero at or past the resource's size and reports a load straddling it):
ragged 1-D tails and 2-D last rows read through buffer resources, a non-zero pad and an
interior edge keep their masks, all against the kernels' reference semantics and jnp, with
no finding; and two mutations (a resource one element too large, the mask dropped at an
interior edge) are caught. The lowering side is tests/compiler/hip/test_hip_buffer_loads.py."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtile.compiler import build
from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig
from jaxtile.compiler.emulator.shim import grid_of
from jaxtile.compiler.gpu import copy_mapping
from jaxtile.compiler.gpu.codegen.lower import generate
from jaxtile.compiler.target import parse_target

sys.path.insert(0, str(Path(__file__).parents[1] / "compiler" / "hip"))
from hip_buffer_kernels import (  # noqa: E402
    last_rows,
    last_rows_ref,
    ragged_row_sums,
    tail_affine,
)

TARGET = parse_target("hip:gfx942")


def _data(shape, dtype, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _close(got, want, tol):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=tol, atol=tol)


def _tail(n):
    x = _data((n,), jnp.float32, n)
    if n > 1:  # non-finite values pass through the loads bit for bit
        x = x.at[0].set(jnp.inf).at[-1].set(jnp.nan)
    got = jax.jit(tail_affine)(x)
    _close(got, tail_affine.reference(x), 0)
    _close(got, x * 2 + 1, 0)


def _rows(shape, dtype):
    x = _data(shape, dtype, 1)
    got = jax.jit(last_rows)(x)
    _close(got, last_rows.reference(x), 1e-5)
    _close(got, last_rows_ref(x), 1e-5)


def test_tails_and_last_rows_read_zero_past_the_end(hip_emulator):
    _tail(1000)  # a 1-D tail
    # 2-D: the last block's rows past the end read zero, in float32 and bfloat16 (16-byte
    # vectors of 4 and 8 elements).
    _rows((100, 128), jnp.float32)
    _rows((37, 64), jnp.bfloat16)


@pytest.mark.slow
def test_more_tails_and_rows(hip_emulator):
    # A whole number of blocks; one element and a length not a multiple of 4 (read as
    # masked scalars); a single row (masked: the flat index leaves a dimension of 1 out).
    for n in (512, 1, 1003):
        _tail(n)
    _rows((1, 64), jnp.float32)
    _rows((33, 128), jnp.float16)


def test_masks_kept_for_a_pad_and_an_interior_edge(hip_emulator):
    x = _data((100, 128), jnp.float32, 2)
    got = jax.jit(lambda a: last_rows(a, pad=1.5))(x)
    _close(got, last_rows_ref(x, pad=1.5), 1e-5)
    y = _data((50, 100), jnp.float32, 3)
    got = jax.jit(ragged_row_sums)(y)
    _close(got, ragged_row_sums.reference(y), 1e-4)
    _close(got, y.sum(axis=1), 1e-4)


def _emulated(kernel, args, source_edit=None):
    """``kernel`` lowered for gfx942 and built for the wave64 emulator from its generated
    text (after ``source_edit``), bypassing the kernel cache so that a mutation is built."""
    ir_kernel = build.lowered_ir(kernel.lower(*args, target=TARGET.name).kernel, TARGET)
    code = generate(ir_kernel, TARGET)
    text = code.source if source_edit is None else source_edit(code.source)
    launch = LaunchConfig((max(code.num_blocks, 1), 1, 1), (code.threads, 1, 1),
                          code.shared_bytes, grid_of=grid_of(code), warp_size=64)
    params = [Buffer(name, dtype) for name, dtype in code.params]
    return EmulatedKernel.build(text, code.symbol, params, launch, file=f"{kernel.name}.hip"), \
        code.source


def _run(k, x, out_shape):
    out = np.zeros(out_shape, np.float32)
    report = k.run(np.asarray(x), out)
    return out, report


def test_generated_text_runs_clean_and_a_resource_too_large_is_caught():
    x = _data((100, 128), jnp.float32, 4)
    want = np.asarray(last_rows_ref(x))
    k, source = _emulated(last_rows, (x,))
    out, report = _run(k, x, want.shape)
    assert report["findings"] == []
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # Mutation: the resource one element larger than x. The vectors past the end then start
    # inside the resource and run past the buffer: a read out of bounds (on a GPU, 12 bytes
    # of whatever follows x).
    good = "buffer_resource(x, 51200)"
    assert good in source

    def grow(text):
        return text.replace(good, "buffer_resource(x, 51204)")

    bad, _ = _emulated(last_rows, (x,), grow)
    with pytest.raises(EmulatorError, match="out of bounds|out-of-bounds"):
        _run(bad, x, want.shape)


def test_dropping_the_mask_at_an_interior_edge_gives_a_wrong_answer(monkeypatch):
    """Mutation of the pass: a column edge taken for the buffer's end. The tile's columns
    past each row then read the next row's elements instead of zero, and the row sums are
    wrong (the emulator sees no fault: the reads are inside the buffer)."""
    y = _data((50, 100), jnp.float32, 5)
    want = np.asarray(y.sum(axis=1))
    k, source = _emulated(ragged_row_sums, (y,))
    assert "buffer_load" not in source
    out, report = _run(k, y, want.shape)
    assert report["findings"] == []
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(copy_mapping, "_end_of_buffer_only",
                        lambda op, buf: bool(dict(op.notes.get("masks", ())).get("src")))
    bad, mutated = _emulated(ragged_row_sums, (y,))
    assert "buffer_load<" in mutated
    out, _ = _run(bad, y, want.shape)
    assert not np.allclose(out, want, rtol=1e-4, atol=1e-4)
