"""The CUDA passes' decisions are IR, and code generation only prints them: the lowered IR of
a pipelined GEMM and of flash attention (``jt.ops.attention``'s kernel) for ``cuda:sm_80``
shows the gemm plans, shared-memory offsets, stages and swizzles, the cp.async schedule
(issues per stage, commits, waits with their counts) and its barriers, parses back to the same
text, and the CUDA generated from the parsed text is byte-identical to the CUDA generated
directly. (Every other kernel the CUDA tests generate is checked the same way by
``gpu.codegen.lower.generate``, since the suite sets ``JAXTILE_VERIFY_IR``.)"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from gemm_kernels import pipelined_gemm

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler import build, ir, parser, printer
from jaxtile.compiler.gpu.codegen import lower
from jaxtile.compiler.target import parse_target

SM80 = parse_target("cuda:sm_80")


def _gemm_ir() -> ir.Kernel:
    spec = jax.ShapeDtypeStruct((256, 256), jnp.float16)
    low = pipelined_gemm.lower(spec, spec, bm=64, bn=64, target="cuda:sm_80")
    return build.lowered_ir(low.kernel, SM80)


def _attention_ir() -> ir.Kernel:
    q = jnp.zeros((2, 4, 256, 64), jnp.bfloat16)
    low = ops.attention_fwd.lower(q, q, q, jnp.zeros((2,), jnp.int32), causal=True,
                                  target="cuda:sm_80")
    return build.lowered_ir(low.kernel, SM80)


@pytest.fixture(scope="module")
def lowered():
    return {"gemm": _gemm_ir(), "attention": _attention_ir()}


def _buffer_lines(text: str) -> dict[str, str]:
    return {line.split(":")[0].split()[-1]: line for line in text.splitlines()
            if line.startswith("  scratch ")}


def test_the_pipelined_gemm_shows_its_plan_offsets_stages_and_swizzles(lowered):
    text = printer.format_kernel(lowered["gemm"], with_lines=False)
    lines = _buffer_lines(text)
    # A is 64 x 32 halves (4 KiB a stage), three stages, at 0; B after it.
    assert lines["smem0"].endswith("shared float16[64, 32] {offset=0, stages=3, swizzle=1}")
    assert lines["smem1"].endswith("shared float16[32, 64] {offset=12288, stages=3, "
                                   "swizzle=1}")
    assert "!{instr='m16n8k16', policy='square', warps=(2, 2)}" in text
    # The cp.async schedule of 3 stages: a prologue of two guarded issues (the trip count,
    # 8, is known, so no guard), each committed; per iteration a wait for all but the newest
    # group, the barrier publishing it, the issue two tiles ahead and its commit.
    body = [line.strip() for line in text.splitlines()]
    loop = next(i for i, line in enumerate(body) if line.startswith("for "))
    assert body[loop - 4:loop] == [
        "async_issue() {guard=False, prologue=True, tile=0}", "async_commit()",
        "async_issue() {guard=False, prologue=True, tile=1}", "async_commit()"]
    assert body[loop + 1:loop + 5] == [
        "async_wait() {count=1}",
        "barrier() !{reason='tile it is visible; the buffer refilled next is free'}",
        "async_issue() {guard=True, prologue=False, tile=2}", "async_commit()"]
    assert sum("issued=True" in line and line.startswith("copy(") for line in body) == 2
    assert "async_wait() {count=0}" in body[loop + 5:]


def test_flash_attention_shows_its_plans_and_offsets(lowered):
    text = printer.format_kernel(lowered["attention"], with_lines=False)
    lines = _buffer_lines(text)
    offsets = {n: line for n, line in lines.items() if "offset=" in line}
    assert len(offsets) == 3, lines                # Q, and the staged K and V
    assert sum("stages=2" in line for line in offsets.values()) == 2
    assert text.count("instr='m16n8k16', policy='rows', warps=(4, 1)") == 2
    # 2 stages of K and V: one issue ahead, waits for none in flight but the newest.
    for line in ("async_issue() {guard=True, prologue=True, tile=0}", "async_wait() {count=0}",
                 "async_issue() {guard=True, prologue=False, tile=1}", "async_commit()",
                 "barrier() !{reason='tile it is visible; the buffer refilled next is free'}"):
        assert line in text, line


@pytest.mark.parametrize("name", ["gemm", "attention"])
def test_the_lowered_ir_round_trips_and_prints_the_same_cuda(lowered, name):
    kernel = lowered[name]
    text = printer.format_kernel(kernel)
    again = parser.parse_kernel(text)
    assert printer.format_kernel(again) == text
    direct, reparsed = lower.generate(kernel, SM80), lower.generate(again, SM80)
    assert reparsed.source == direct.source
    assert reparsed == direct


def _strip_buffer_attrs(kernel: ir.Kernel, attr: str) -> ir.Kernel:
    buffers = tuple(dataclasses.replace(b, attrs={k: v for k, v in b.attrs.items() if k != attr})
                    for b in kernel.buffers)
    return dataclasses.replace(kernel, buffers=buffers)


def test_code_generation_refuses_ir_without_a_shared_memory_plan(lowered):
    with pytest.raises(jt.KernelError, match="no planned offset.*smem_plan"):
        lower.generate(_strip_buffer_attrs(lowered["gemm"], "offset"), SM80)


def test_code_generation_refuses_a_gemm_without_a_plan(lowered):
    kernel = lowered["gemm"]

    def unplanned(op: ir.Op) -> list[ir.Op]:
        return [dataclasses.replace(op, notes={}) if op.kind == "gemm" else op]

    with pytest.raises(jt.KernelError, match="gemm at .* has no plan"):
        lower.generate(dataclasses.replace(kernel, body=ir.map_ops(kernel.body, unplanned)),
                       SM80)


def test_the_gemm_copies_show_their_thread_mapping(lowered):
    """The staged copies of the f16 A and B tiles move 16-byte runs of 8 halves; the copy
    of the accumulator out follows its fragment layout and has no mapping of its own."""
    text = printer.format_kernel(lowered["gemm"], with_lines=False)
    copies = [line.strip() for line in text.splitlines() if line.strip().startswith("copy(")]
    assert [line.endswith("vec=8}") for line in copies if "issued=True" in line] == [True] * 2
    assert [line for line in copies if "vec=" not in line] == [
        line for line in copies if "src=frag0" in line] != []


def test_code_generation_refuses_a_copy_without_a_thread_mapping(lowered):
    kernel = lowered["gemm"]

    def unmapped(op: ir.Op) -> list[ir.Op]:
        notes = {k: v for k, v in op.notes.items() if k != "vec"}
        return [dataclasses.replace(op, notes=notes)]

    with pytest.raises(jt.KernelError, match="no recorded thread mapping.*copy_mapping"):
        lower.generate(dataclasses.replace(kernel, body=ir.map_ops(kernel.body, unmapped)),
                       SM80)


def test_the_round_trip_check_catches_a_decision_the_text_does_not_show(lowered, monkeypatch):
    """If the printer left the swizzles out, the re-parsed IR would give other CUDA: the check
    in ``generate`` (on under JAXTILE_VERIFY_IR, as in the suite) names the first
    difference."""
    real = printer.format_kernel
    monkeypatch.setattr(printer, "format_kernel",
                        lambda k, **kw: real(_strip_buffer_attrs(k, "swizzle"), **kw))
    with pytest.raises(jt.KernelError, match="re-parsed lowered IR differs .*PlainTile|"
                       "re-parsed lowered IR differs .*SwizzledTile"):
        lower.generate(lowered["gemm"], SM80)


def test_the_round_trip_check_catches_text_that_does_not_parse_back(lowered, monkeypatch):
    real = parser.parse_kernel
    monkeypatch.setattr(parser, "parse_kernel",
                        lambda text: _strip_buffer_attrs(real(text), "swizzle"))
    with pytest.raises(jt.KernelError, match="does not print back"):
        lower.generate(lowered["gemm"], SM80)
