"""The buffer-loads pass (compiler/gpu/copy_mapping.py, ``note_buffer_loads``) on AMD targets:
global reads masked only at a buffer's end become buffer loads without the mask (the note
``buffer_load`` in the lowered IR, ``buffer_load`` through one resource per buffer in the
HIP text, ``buffer_load_dword*`` in clang's assembly); reads with an interior edge, a pad
other than +0, no aligned vectors, or on CUDA keep their masks. The emulator runs are in
tests/emulator/test_hip_emulator_buffer_loads.py."""

import dataclasses
import re

import jax.numpy as jnp
import numpy as np
import pytest
from hip_buffer_kernels import last_rows, ragged_row_sums, tail_affine

from jaxtile.compiler import build, ir
from jaxtile.compiler.gpu import copy_mapping
from jaxtile.compiler.gpu.codegen.lower import generate
from jaxtile.compiler.hip import lower as hip_lower
from jaxtile.compiler.hip import toolchain
from jaxtile.compiler.target import parse_target

needs_clang = pytest.mark.skipif(toolchain.clang_path() is None,
                                 reason=f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}")


def _copies(lowered):
    """The lowered IR's copy lines that read a global input (named x)."""
    return [ln for ln in lowered.lowered_ir.splitlines() if "copy(" in ln and "src=x[" in ln]


def _noted(lowered):
    (line,) = _copies(lowered)
    return "buffer_load=True" in line


ROWS = jnp.ones((100, 128), jnp.float32)


@pytest.mark.parametrize("gfx", ["gfx942", "gfx90a"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_last_rows_read_through_a_buffer_resource(gfx, dtype):
    x = ROWS.astype(dtype)
    lowered = last_rows.lower(x, target=f"hip:{gfx}")
    assert _noted(lowered)
    src = lowered.source
    size = 100 * 128 * np.dtype(dtype).itemsize
    # One resource for x, sized by its bytes, and the load with no condition around it.
    assert src.count("buffer_resource(") == 1
    assert f"const buffer_rsrc jt_rsrc_x = buffer_resource(x, {size});" in src
    (load,) = [ln for ln in src.splitlines() if "buffer_load<" in ln]
    assert not load.strip().startswith("if") and "jt_rsrc_x" in load
    assert "< 12800u ?" in src  # the flat index clamped to the element count
    # The kept-mask report no longer lists the read (CUDA's does).
    assert not [m for m in lowered.masks if "src=x" in m]
    assert [m for m in last_rows.lower(x, target="cuda:sm_80").masks if "src=x" in m]
    # The unmasked x read is gone: x is only read through the resource.
    assert "ptr_cast" not in "".join(ln for ln in src.splitlines() if "(x +" in ln)


def test_one_dimensional_tail_reads_through_a_buffer_resource():
    lowered = tail_affine.lower(jnp.ones((1000,), jnp.float32), target="hip:gfx942")
    assert _noted(lowered)
    assert "buffer_load<f32x4>(jt_rsrc_x" in lowered.source


@pytest.mark.parametrize("case", ["cuda", "pad", "interior", "unaligned", "no-mask",
                                  "negative-zero-pad", "one-row"])
def test_masks_stay_where_a_buffer_load_would_be_wrong_or_not_possible(case):
    kernel, args, kw, target = last_rows, (ROWS,), {}, "hip:gfx942"
    if case == "cuda":
        target = "cuda:sm_80"        # no buffer loads on the target
    elif case == "pad":
        kw = dict(pad=1.0)           # a buffer load reads zero, not 1
    elif case == "negative-zero-pad":
        kw = dict(pad=-0.0)          # nor -0.0
    elif case == "interior":
        # A column edge: elements past it are the next row's, inside the buffer.
        kernel, args = ragged_row_sums, (jnp.ones((50, 100), jnp.float32),)
    elif case == "unaligned":
        kernel, args = tail_affine, (jnp.ones((1003,), jnp.float32),)  # scalar reads
    elif case == "one-row":
        # The flat index leaves out a dimension of extent 1: rows past it are not past
        # the end in the index (the emulator test caught this as a wrong answer).
        args = (jnp.ones((1, 128), jnp.float32),)
    elif case == "no-mask":
        args = (jnp.ones((96, 128), jnp.float32),)  # the tiles divide: nothing to mask
    lowered = kernel.lower(*args, **kw, target=target)
    assert not _noted(lowered)
    assert "buffer_load" not in lowered.source and "buffer_resource" not in lowered.source
    if case not in ("cuda", "no-mask"):
        # The read keeps its mask.
        (line,) = _copies(lowered)
        assert re.search(r"\('src', \(\d", line)


def test_code_generation_prints_the_note():
    """The decision is the pass's: the same IR without the note prints the masked read on
    gfx942, and no resource."""
    target = parse_target("hip:gfx942")
    final = build.lowered_ir(last_rows.lower(ROWS, target=target.name).kernel, target)

    def strip(op):
        notes = {k: v for k, v in op.notes.items() if k != copy_mapping.BUFFER_LOAD}
        return [dataclasses.replace(op, notes=notes)]

    noted = generate(final, target).source
    plain = generate(dataclasses.replace(final, body=ir.map_ops(final.body, strip)),
                     target).source
    assert "buffer_load<" in noted and "buffer_load" not in plain
    assert "buffer_resource" not in plain
    assert re.search(r"if \(unsigned\(.*\) < 100u\) vec\d+ = ptr_cast<f32x4>\(x \+", plain)


def test_pad_check_reads_negative_zero_as_non_zero():
    assert copy_mapping.zero_pad(None) and copy_mapping.zero_pad(0) and copy_mapping.zero_pad(0.0)
    assert copy_mapping.zero_pad(False)
    assert not copy_mapping.zero_pad(-0.0) and not copy_mapping.zero_pad(1.0)


@needs_clang
@pytest.mark.parametrize("gfx", ["gfx90a", "gfx942"])
@pytest.mark.parametrize("kernel,arg", [
    (last_rows, ROWS.astype(jnp.bfloat16)), (tail_affine, jnp.ones((1000,), jnp.float32))],
    ids=["last-rows-bf16", "tail-f32"])
def test_clang_emits_buffer_loads(gfx, kernel, arg):
    target = parse_target(f"hip:{gfx}")
    lowered = kernel.lower(arg, target=target.name)
    co = hip_lower.compile_code_object(build.lowered_ir(lowered.kernel, target), target)
    loads = re.findall(r"\b(buffer_load_dword\w*|global_load_dword\w*)", co.assembly)
    # The input's 16-byte vectors are buffer loads (no global loads of x remain).
    assert loads and set(loads) == {"buffer_load_dwordx4"}
    assert co.kernels[f"jt_{kernel.name}"].scratch_bytes == 0
