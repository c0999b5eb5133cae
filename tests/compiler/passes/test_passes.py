"""Tile IR passes, as golden before/after texts, and the pass pipelines."""

import textwrap

import pytest

from jaxtile.compiler import parser, pipelines, printer, verify
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.passes.coverage import check_output_coverage
from jaxtile.compiler.passes.dce import eliminate_dead_code
from jaxtile.compiler.passes.fusion import fuse_elementwise
from jaxtile.compiler.passes.scratch_init import zero_uninitialised_scratch
from jaxtile.compiler.target import parse_target


def _text(s: str) -> str:
    return "\n".join(ln for ln in textwrap.dedent(s).splitlines() if ln.strip())


def _check(pass_fn, before: str, after: str) -> None:
    kernel = parser.parse_kernel(_text(before))
    verify.verify(kernel)
    result = pass_fn(kernel)
    assert printer.format_kernel(result) == _text(after)
    verify.verify(result)
    # passes return new IR: what they were given is unchanged
    assert printer.format_kernel(kernel) == _text(before)


_HEAD = """
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global float32[8]
      output y: global float32[8]
"""


def test_dce_drops_unused_pure_ops_and_empty_loops():
    _check(eliminate_dead_code, _HEAD + """
      %1: float32[8] = load() {src=x[0:+8]}
      %2: float32[8] = elementwise(%1) {fn='exp'}
      %3: float32[8] = load() {src=y[0:+8]}
      store(%1) {dst=y[0:+8]}  # user.py:4
      for %4 in serial(0, +2):
        %5: float32[8] = load() {src=x[0:+8]}
    """, _HEAD + """
      %1: float32[8] = load() {src=x[0:+8]}
      store(%1) {dst=y[0:+8]}  # user.py:4
    """)


def test_scratch_init_fills_only_buffers_read_before_written():
    head = """
    kernel k(grid=[1], threads=128) blocks(%0):
      output y: global float32[4]
      scratch a: fragment float32[4]
      scratch b: fragment float32[4]
    """
    _check(zero_uninitialised_scratch, head + """
      copy() {dst=b[0:+4], pad=None, src=a[0:+4]}
      %1: float32[4] = load() {src=b[0:+4]}
      store(%1) {dst=y[0:+4]}
    """, head + """
      %1: float32[] = const() {value=0.0}
      %2: float32[4] = broadcast(%1) {dims=()}
      store(%2) {dst=a[0:+4]}
      copy() {dst=b[0:+4], pad=None, src=a[0:+4]}
      %3: float32[4] = load() {src=b[0:+4]}
      store(%3) {dst=y[0:+4]}
    """)


def test_scratch_init_counts_a_write_in_both_branches_of_an_if():
    head = """
    kernel k(grid=[1], threads=128) blocks(%0):
      output y: global float32[4]
      scratch a: fragment float32[4]
      scratch b: fragment float32[4]
    """
    _check(zero_uninitialised_scratch, head + """
      %1: bool[] = const() {value=True}
      %2: float32[] = const() {value=1.0}
      %3: float32[4] = broadcast(%2) {dims=()}
      if %1:
        store(%3) {dst=a[0:+4]}
        store(%3) {dst=b[0:+4]}
      else:
        store(%3) {dst=a[0:+4]}
      %4: float32[4] = load() {src=a[0:+4]}
      %5: float32[4] = load() {src=b[0:+4]}
      %6: float32[4] = elementwise(%4, %5) {fn='add'}
      store(%6) {dst=y[0:+4]}
    """, head + """
      %1: float32[] = const() {value=0.0}
      %2: float32[4] = broadcast(%1) {dims=()}
      store(%2) {dst=b[0:+4]}
      %3: bool[] = const() {value=True}
      %4: float32[] = const() {value=1.0}
      %5: float32[4] = broadcast(%4) {dims=()}
      if %3:
        store(%5) {dst=a[0:+4]}
        store(%5) {dst=b[0:+4]}
      else:
        store(%5) {dst=a[0:+4]}
      %6: float32[4] = load() {src=a[0:+4]}
      %7: float32[4] = load() {src=b[0:+4]}
      %8: float32[4] = elementwise(%6, %7) {fn='add'}
      store(%8) {dst=y[0:+4]}
    """)


def test_fusion_inlines_single_use_chains_but_not_shared_expensive_values():
    _check(fuse_elementwise, _HEAD + """
      %1: float32[8] = load() {src=x[0:+8]}
      %2: float32[8] = elementwise(%1) {fn='exp'}
      %3: float32[] = reduce(%2) {axes=(0,), fn='sum'}
      %4: float32[8] = broadcast(%3) {dims=()}
      %5: float32[8] = elementwise(%2, %4) {fn='div'}
      store(%5) {dst=y[0:+8]}
    """, _HEAD + """
      %1: float32[8] = load() {src=x[0:+8]} !{inline=True}
      %2: float32[8] = elementwise(%1) {fn='exp'}
      %3: float32[] = reduce(%2) {axes=(0,), fn='sum'}
      %4: float32[8] = broadcast(%3) {dims=()} !{inline=True}
      %5: float32[8] = elementwise(%2, %4) {fn='div'} !{inline=True}
      store(%5) {dst=y[0:+8]}
    """)


def test_fusion_does_not_move_a_load_past_a_write_of_its_buffer():
    head = _HEAD + "      scratch t: fragment float32[8]\n"
    _check(fuse_elementwise, head + """
      %1: float32[8] = load() {src=t[0:+8]}
      copy() {dst=t[0:+8], pad=None, src=x[0:+8]}
      %2: float32[8] = elementwise(%1) {fn='neg'}
      store(%2) {dst=y[0:+8]}
    """, head + """
      %1: float32[8] = load() {src=t[0:+8]}
      copy() {dst=t[0:+8], pad=None, src=x[0:+8]}
      %2: float32[8] = elementwise(%1) {fn='neg'} !{inline=True}
      store(%2) {dst=y[0:+8]}
    """)



def test_fusion_updates_a_tile_in_place_with_a_broadcast_of_another_buffer():
    """``t[...] = t[...] + b[...][None, :]`` is computed in place (each element of ``t`` is
    read where it is written); broadcasting ``t`` itself into ``t`` is not."""
    head = """
    kernel k(grid=[1], threads=128) blocks(%0):
      output y: global float32[2, 4]
      scratch t: fragment float32[2, 4]
      scratch b: fragment float32[4]
    """
    _check(fuse_elementwise, head + """
      %1: float32[2, 4] = load() {src=t[0:+2, 0:+4]}
      %2: float32[4] = load() {src=b[0:+4]}
      %3: float32[1, 4] = broadcast(%2) {dims=(1,)}
      %4: float32[2, 4] = elementwise(%1, %3) {fn='add'}
      store(%4) {dst=t[0:+2, 0:+4]}
      %5: float32[4] = load() {src=t[0, 0:+4]}
      %6: float32[2, 4] = broadcast(%5) {dims=(1,)}
      store(%6) {dst=t[0:+2, 0:+4]}
    """, head + """
      %1: float32[2, 4] = load() {src=t[0:+2, 0:+4]} !{inline=True}
      %2: float32[4] = load() {src=b[0:+4]} !{inline=True}
      %3: float32[1, 4] = broadcast(%2) {dims=(1,)} !{inline=True}
      %4: float32[2, 4] = elementwise(%1, %3) {fn='add'} !{inline=True}
      store(%4) {dst=t[0:+2, 0:+4]}
      %5: float32[4] = load() {src=t[0, 0:+4]} !{inline=True}
      %6: float32[2, 4] = broadcast(%5) {dims=(1,)}
      store(%6) {dst=t[0:+2, 0:+4]}
    """)

_STRIPED = """
    kernel k(grid=[2], threads=128) blocks(%0):
      input x: global float32[10]
      output y: global float32[10]
      %1: int32[] = const() {value=4}
      %2: int32[] = elementwise(%0, %1) {fn='mul'}
      %3: float32[4] = load() {src=x[%2:+4]}
      store(%3) {dst=y[%2:+4]}  # user.py:9
"""


def test_coverage_rejects_a_grid_that_misses_part_of_an_output():
    with pytest.raises(KernelError, match=r"no write reaches index 8.*user.py:9"):
        check_output_coverage(parser.parse_kernel(_text(_STRIPED)))
    covered = _text(_STRIPED).replace("grid=[2]", "grid=[3]")
    _check(check_output_coverage, covered, covered)


def test_coverage_folds_constants_through_the_op_definitions():
    # the block stride is 8 - 4, which only op_defs.evaluate knows to be 4
    striped = _text("""
        kernel k(grid=[2], threads=128) blocks(%0):
          input x: global float32[10]
          output y: global float32[10]
          %1: int32[] = const() {value=8}
          %2: int32[] = const() {value=4}
          %3: int32[] = elementwise(%1, %2) {fn='sub'}
          %4: int32[] = elementwise(%0, %3) {fn='mul'}
          %5: float32[4] = load() {src=x[%4:+4]}
          store(%5) {dst=y[%4:+4]}  # user.py:9
    """)
    with pytest.raises(KernelError, match=r"no write reaches index 8.*user.py:9"):
        check_output_coverage(parser.parse_kernel(striped))


def test_coverage_follows_a_start_that_subtracts_a_constant():
    # 4 * block - 2 is affine (compiler/analysis/affine.py, shared with shard inference):
    # the two blocks reach index 6 at most
    striped = _text(_STRIPED.replace("""      %3: float32[4] = load() {src=x[%2:+4]}
      store(%3) {dst=y[%2:+4]}  # user.py:9""", """      %3: int32[] = const() {value=2}
      %4: int32[] = elementwise(%2, %3) {fn='sub'}
      %5: float32[4] = load() {src=x[%4:+4]}
      copy() {dst=y[%4:+4], pad=None, src=x[%4:+4]}  # user.py:9"""))
    with pytest.raises(KernelError, match=r"no write reaches index 6.*user.py:9"):
        check_output_coverage(parser.parse_kernel(striped))


def test_pipelines_name_their_passes_in_order():
    assert [p.name for p in pipelines.NEUTRAL] == ["verify", "canonicalize",
                                                  "contiguous_gathers", "coverage", "dce",
                                                  "clamp_check", "scratch_init", "output_init",
                                                  "wide_accumulation"]
    assert [p.name for p in pipelines.for_target(parse_target("cpu"))] == [
        "gemm_panels", "gemm_edges", "fusion"]
    assert [p.name for p in pipelines.for_target(parse_target("cuda:sm_80"))] == [
        "gemm_plan", "layout_inference", "copy_mapping", "bounds", "pipelining", "buffer_loads",
        "scratch", "smem_plan", "tma_store", "barriers", "warp_specialise", "pingpong"]
    # AMD GPUs run the same GPU passes (their differences are capabilities).
    assert [p.name for p in pipelines.for_target(parse_target("hip:gfx90a"))] == [
        "gemm_plan", "layout_inference", "copy_mapping", "bounds", "pipelining", "buffer_loads",
        "scratch", "smem_plan", "tma_store", "barriers", "warp_specialise", "pingpong"]


def test_dump_prints_the_ir_after_the_named_pass(monkeypatch, capsys):
    kernel = parser.parse_kernel(_text(_STRIPED).replace("grid=[2]", "grid=[3]"))
    monkeypatch.setenv("JAXTILE_DUMP_IR", "fusion")
    pipelines.run(kernel, pipelines.NEUTRAL + pipelines.for_target(parse_target("cpu")))
    err = capsys.readouterr().err
    assert err.count("// Tile IR after") == 1 and "// Tile IR after fusion" in err
    assert "!{inline=True}" in err


def test_verify_after_every_pass_catches_a_broken_pass(monkeypatch):
    kernel = parser.parse_kernel(_text(_STRIPED).replace("grid=[2]", "grid=[3]"))

    def breaks(k):  # drops the definition of a value that is still used
        return type(k)(k.name, k.grid, k.threads, k.buffers, k.block_indices, k.body[1:])

    bad = pipelines.Pass("breaks", breaks)
    monkeypatch.setenv("JAXTILE_VERIFY_IR", "1")
    with pytest.raises(KernelError, match="outside its scope"):
        pipelines.run(kernel, (bad,))
    monkeypatch.setenv("JAXTILE_VERIFY_IR", "0")
    pipelines.run(kernel, (bad,))
