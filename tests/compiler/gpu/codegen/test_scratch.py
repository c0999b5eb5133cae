"""The ``scratch`` pass (``gpu/codegen/scratch.py``) records the shared scratch an op's GPU
lowering needs as IR, ``smem_plan`` gives each its byte offset there, and code generation
takes both from the IR (refusing an op whose request or offset is missing): a reduction
whose threads span several warps carries its ``partials`` request (printed, parsed back),
the CUDA declares exactly that array, a reduction folded within one warp carries none; a
scan stages its operand and a sort its keys, positions and values; a fragment read or
written in part by other threads (load, store, atomic, copy, a gemm without a tensor-core
plan) is staged."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

import jaxtile as jt
from jaxtile.compiler import build, ir, parser, pipelines, printer
from jaxtile.compiler.gpu.codegen import lower
from jaxtile.compiler.target import parse_target

F32 = jnp.float32
I32 = jnp.int32
SM80 = parse_target("cuda:sm_80")


def _row_sums(threads):
    @jt.kernel(threads=threads)
    def row_sums(x):
        n, m = x.shape
        out = jt.empty((n,), F32)
        jt.grid(1)
        t = jt.fragment((n, m), F32)
        jt.copy(x.at[0, 0], t)
        s = jt.fragment((n,), F32)
        s[...] = jnp.sum(t[...], axis=1)
        jt.copy(s, out.at[0])
        return out
    return row_sums


def _lowered(threads) -> ir.Kernel:
    spec = jax.ShapeDtypeStruct((4, 512), F32)
    return build.lowered_ir(_row_sums(threads).lower(spec, target="cuda:sm_80").kernel, SM80)


def _reduce(kernel: ir.Kernel) -> ir.Op:
    (op,) = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.kind == "reduce"]
    return op


def test_the_scratch_pass_runs_before_the_shared_memory_plan():
    names = [p.name for p in pipelines.gpu(SM80)]
    assert names.index("layout_inference") < names.index("scratch") < names.index("smem_plan")


def test_a_reduction_across_warps_records_its_partials_and_codegen_declares_them():
    kernel = _lowered(128)
    note = _reduce(kernel).notes["scratch"]
    # 128 threads (4 warps) share each row: one float partial per thread and result slot,
    # at offset 0 (the kernel's fragments take no shared memory).
    ((role, ctype, count, offset),) = note
    assert (role, ctype, offset) == ("partials", "float", 0) and count % 128 == 0
    text = printer.format_kernel(kernel)
    assert f"scratch=(('partials', 'float', {count}, 0),)" in text
    assert _reduce(parser.parse_kernel(text)).notes["scratch"] == note
    source = lower.generate(kernel, SM80).source
    assert re.search(rf"JT_SHARED_AT\(float, partials\d+, {count}, 0\);", source)


def test_a_reduction_within_one_warp_records_no_scratch():
    kernel = _lowered(32)
    assert "scratch" not in _reduce(kernel).notes
    assert "partials" not in lower.generate(kernel, SM80).source


@pytest.mark.parametrize("target, lanes, warps", [("cuda:sm_80", 32, 4), ("hip:gfx942", 64, 2)])
def test_a_thread_digit_spanning_warps_folds_its_lanes_by_shuffles(target, lanes, warps):
    # A row's 512 columns over all 128 threads are one thread digit (stride 1, size 128);
    # its in-warp part folds by shuffles, so one partial per warp and row goes through
    # shared memory, written by lane 0 and read back by each thread, not 128 of them.
    t = parse_target(target)
    spec = jax.ShapeDtypeStruct((4, 512), F32)
    kernel = build.lowered_ir(_row_sums(128).lower(spec, target=target).kernel, t)
    source = lower.generate(kernel, t).source
    offsets = [int(o) for o in re.findall(r"shfl_xor\(kFullMask, \w+\[k\], (\d+)\)", source)]
    assert offsets == [1 << i for i in range(lanes.bit_length() - 1)]
    assert f"// fold {warps} partials across warps" in source
    assert f"if ((tid & {lanes - 1}) == 0)" in source
    assert re.search(rf"for \(int d = 0; d < {warps}; \+\+d\)", source)


def test_code_generation_refuses_a_reduction_without_its_recorded_scratch():
    kernel = _lowered(128)

    def unrecorded(op: ir.Op) -> list[ir.Op]:
        notes = {k: v for k, v in op.notes.items() if k != "scratch"}
        return [dataclasses.replace(op, notes=notes)]

    with pytest.raises(jt.KernelError, match="reduce at .* no recorded 'partials' scratch"):
        lower.generate(dataclasses.replace(kernel, body=ir.map_ops(kernel.body, unrecorded)),
                       SM80)


@jt.kernel(threads=64)
def _sorted_prefix_sums(x):
    n, m = x.shape
    out = jt.empty((n, m), F32)
    jt.grid(1)
    t = jt.fragment((n, m), F32)
    jt.copy(x.at[0, 0], t)
    t[...] = jnp.sort(jnp.cumsum(t[...], axis=1), axis=1)
    jt.copy(t, out.at[0, 0])
    return out


def _sort_ir() -> ir.Kernel:
    spec = jax.ShapeDtypeStruct((4, 32), F32)
    return build.lowered_ir(_sorted_prefix_sums.lower(spec, target="cuda:sm_80").kernel, SM80)


def test_a_scan_and_a_sort_record_their_staging_and_sort_buffers():
    kernel = _sort_ir()
    notes = {s.kind: s.notes.get("scratch") for s in ir.walk(kernel.body)
             if isinstance(s, ir.Op) and s.kind in ("scan", "sort")}
    # Each lives for its own op only: the scan's array and the sort's first share bytes.
    assert notes == {"scan": (("staged", "float", 128, 0),),
                     "sort": (("key", "int", 128, 0), ("pos", "int", 128, 512),
                              ("vals", "float", 128, 1024))}
    source = lower.generate(kernel, SM80).source
    for role in ("staged", "key", "pos", "vals"):
        assert re.search(rf"JT_SHARED_AT\(\w+, {role}\d+, 128, \d+\);", source), role


def test_code_generation_refuses_a_sort_without_its_recorded_scratch():
    kernel = _sort_ir()

    def unrecorded(op: ir.Op) -> list[ir.Op]:
        notes = {k: v for k, v in op.notes.items() if k != "scratch" or op.kind != "sort"}
        return [dataclasses.replace(op, notes=notes)]

    with pytest.raises(jt.KernelError, match="sort at .* no recorded 'key' scratch"):
        lower.generate(dataclasses.replace(kernel, body=ir.map_ops(kernel.body, unrecorded)),
                       SM80)


@jt.kernel(threads=64)
def _fragment_parts(x):
    n, m = x.shape
    out = jt.empty((n, m), F32)
    jt.grid(1)
    t = jt.fragment((n, m), F32)
    jt.copy(x.at[0, 0], t)
    first = t[0, 0]
    top = t[0:2, :]
    t[2:4, :] = top * first
    jt.atomic_add(t.at[4, 0], top)
    loc = jt.local((n, m), F32)
    jt.copy(t, loc)
    out[...] = loc[...] + 1.0
    return out


@jt.kernel(threads=64)
def _fragment_gemm(a, b):
    n, m = a.shape[0], b.shape[1]
    out = jt.empty((n, m), I32)
    jt.grid(1)
    fa, fb = jt.fragment(a.shape, I32), jt.fragment(b.shape, I32)
    acc = jt.fragment((n, m), I32)
    jt.copy(a.at[0, 0], fa)
    jt.copy(b.at[0, 0], fb)
    acc[...] = jnp.zeros((n, m), I32)
    jt.gemm(fa, fb, acc)
    jt.copy(acc, out.at[0, 0])
    return out


def _notes(kernel: ir.Kernel) -> list[tuple[str, tuple]]:
    return [(s.kind, s.notes["scratch"]) for s in ir.walk(kernel.body)
            if isinstance(s, ir.Op) and "scratch" in s.notes]


def test_fragments_read_or_written_by_other_threads_are_staged():
    spec = jax.ShapeDtypeStruct((8, 16), F32)
    kernel = build.lowered_ir(_fragment_parts.lower(spec, target="cuda:sm_80").kernel, SM80)
    whole, rows = ("staged", "float", 128, 0), ("staged", "float", 32, 0)
    assert _notes(kernel) == [("load", (whole,)),     # one element
                              ("load", (whole,)),     # two rows of it
                              ("store", (rows,)),     # the value stored into two rows
                              ("atomic", (rows,)),
                              ("copy", (whole,))]     # into every thread's local copy
    lower.generate(kernel, SM80)      # declares them (the suite checks the round trip too)


def test_a_gemm_without_a_tensor_core_plan_stages_its_fragment_operands():
    a, b = jax.ShapeDtypeStruct((16, 8), I32), jax.ShapeDtypeStruct((8, 16), I32)
    kernel = build.lowered_ir(_fragment_gemm.lower(a, b, target="cuda:sm_80").kernel, SM80)
    assert _notes(kernel) == [("gemm", (("staged", "int", 128, 0), ("staged", "int", 128, 512)))]
    source = lower.generate(kernel, SM80).source
    assert len(re.findall(r"JT_SHARED_AT\(int, staged\d+, 128, \d+\);", source)) == 2


def test_code_generation_refuses_scratch_without_a_planned_offset():
    kernel = _lowered(128)

    def unplaced(op: ir.Op) -> list[ir.Op]:
        if "scratch" not in op.notes:
            return [op]
        return [op.with_notes(scratch=tuple(n[:3] for n in op.notes["scratch"]))]

    with pytest.raises(jt.KernelError, match="'partials' scratch of the reduce at .* no "
                       "planned offset.*smem_plan"):
        lower.generate(dataclasses.replace(kernel, body=ir.map_ops(kernel.body, unplaced)),
                       SM80)
