"""The GPU passes that write decisions into the IR (gemm_plan, pipelining, smem_plan, and
barriers on their output), as golden before/after texts in the style of test_passes.py: IR
text in, one pass, the printed result compared; the GPU rules hold on every result."""

import textwrap

from jaxtile.compiler import parser, printer, verify
from jaxtile.compiler.gpu.barriers import insert_barriers
from jaxtile.compiler.gpu.copy_mapping import map_copies
from jaxtile.compiler.gpu.copy_schedule import schedule_async_copies
from jaxtile.compiler.gpu.gemm_plan import plan_gemms
from jaxtile.compiler.gpu.smem_plan import place_shared_buffers
from jaxtile.compiler.gpu.verify import verify_gpu, verify_scratch_barriers
from jaxtile.compiler.target import parse_target

SM80 = parse_target("cuda:sm_80")


def _text(s: str) -> str:
    return "\n".join(ln for ln in textwrap.dedent(s).splitlines() if ln.strip())


def _check(pass_fn, before: str, after: str) -> None:
    kernel = parser.parse_kernel(_text(before))
    verify.verify(kernel)
    result = pass_fn(kernel)
    assert printer.format_kernel(result) == _text(after)
    verify.verify(result)
    verify_gpu(result)
    verify_scratch_barriers(result)
    assert printer.format_kernel(kernel) == _text(before)    # the input is unchanged


_GEMM_HEAD = """
    kernel k(grid=[1], threads=128) blocks(%0):
      input a: global float16[32, 16]
      input b: global float16[16, 32]
      output c: global float32[32, 32]
      scratch sa: shared float16[32, 16]SA
      scratch sb: shared float16[16, 32]SB
      scratch acc: fragment float32[32, 32]
      scratch small: fragment float32[4, 4]
      copy() {dst=sa[0:+32, 0:+16], pad=None, src=a[0:+32, 0:+16]}
      copy() {dst=sb[0:+16, 0:+32], pad=None, src=b[0:+16, 0:+32]}
"""
_GEMM_TAIL = """
      copy() {dst=c[0:+32, 0:+32], pad=None, src=acc[0:+32, 0:+32]}
      copy() {dst=c[0:+4, 0:+4], pad=None, src=small[0:+4, 0:+4]}
"""
_GEMMS = """
      gemm() {a=sa[0:+32, 0:+16], b=sb[0:+16, 0:+32], c=acc[0:+32, 0:+32], transpose_a=False, transpose_b=False}NOTE1  # user.py:9
      gemm() {a=sa[0:+4, 0:+4], b=sb[0:+4, 0:+4], c=small[0:+4, 0:+4], transpose_a=False, transpose_b=False}NOTE2  # user.py:10
"""  # noqa: E501


def test_gemm_plan_records_instruction_warps_policy_and_swizzles():
    """The 32x32x16 f16 gemm takes mma m16n8k16 over 2x2 warps, its operands the swizzled
    tiles of step 1; the 4x4 one does not split into atoms: scalar multiply-adds, and the
    shared buffers keep the first gemm's swizzle."""
    before = (_GEMM_HEAD.replace("SA", "").replace("SB", "")
              + _GEMMS.replace("NOTE1", "").replace("NOTE2", "") + _GEMM_TAIL)
    after = (_GEMM_HEAD.replace("SA", " {swizzle=1}").replace("SB", " {swizzle=1}")
             + _GEMMS.replace("NOTE1", " !{instr='m16n8k16', policy='square', warps=(2, 2)}")
             .replace("NOTE2", " !{instr='scalar'}") + _GEMM_TAIL)
    _check(lambda k: plan_gemms(k, SM80), before, after)


def test_copy_mapping_records_each_memory_copys_vector_run():
    """16 bytes of f16 make runs of 8; f32 rows of 6 take runs of 2 (4 does not divide 6);
    a column (a single element of the last dimension) takes 1; copies to or from a
    fragment follow its layout and get no note."""
    head = """
        kernel k(grid=[1], threads=64) blocks(%0):
          input a: global float16[32, 64]
          input b: global float32[8, 6]
          output c: global float32[8, 6]
          scratch sa: shared float16[32, 64]
          scratch sb: shared float32[8, 6]
          scratch f: fragment float32[8, 6]
    """
    body = """
          copy() {dst=sa[0:+32, 0:+64], pad=None, src=a[0:+32, 0:+64]}A  # user.py:3
          copy() {dst=sb[0:+8, 0:+6], pad=None, src=b[0:+8, 0:+6]}B
          copy() {dst=c[0:+8, 0], pad=None, src=sb[0:+8, 5]}C
          copy() {dst=f[0:+8, 0:+6], pad=None, src=sb[0:+8, 0:+6]}
          copy() {dst=c[0:+8, 0:+6], pad=None, src=f[0:+8, 0:+6]}
    """
    before = head + body.replace("A", "").replace("B", "").replace("C", "")
    after = head + (body.replace("}A", "} !{vec=8}").replace("}B", "} !{vec=2}")
                    .replace("}C", "} !{vec=1}"))
    _check(map_copies, before, after)


def test_pipelining_writes_the_cp_async_schedule_as_statements():
    """Two stages over 3 iterations: the prologue issues tile 0 unguarded (the trip count is
    known); each iteration waits for its tile, publishes it with a barrier, issues the next
    one (guarded) and commits; the staged copy and its origin's scalars are noted issued."""
    _check(lambda k: schedule_async_copies(k, SM80.caps), """
        kernel k(grid=[2], threads=128) blocks(%0):
          input x: global float32[2, 96]
          output y: global float32[2, 32]
          scratch s: shared float32[32]
          for %1 in pipelined(0, +3, stages=2):  # user.py:5
            %2: int32[] = const() {value=32}
            %3: int32[] = elementwise(%1, %2) {fn='mul'}
            copy() {dst=s[0:+32], pad=None, src=x[%0, %3:+32]}  # user.py:7
            %4: float32[32] = load() {src=s[0:+32]}
            %5: float32[32] = load() {src=y[%0, 0:+32]}
            %6: float32[32] = elementwise(%4, %5) {fn='add'}
            store(%6) {dst=y[%0, 0:+32]}
    """, """
        kernel k(grid=[2], threads=128) blocks(%0):
          input x: global float32[2, 96]
          output y: global float32[2, 32]
          scratch s: shared float32[32]
          async_issue() {guard=False, prologue=True, tile=0}  # user.py:5
          async_commit()  # user.py:5
          for %1 in pipelined(0, +3, stages=2):  # user.py:5
            async_wait() {count=0}  # user.py:5
            barrier() !{reason='tile it is visible; the buffer refilled next is free'}  # user.py:5
            async_issue() {guard=True, prologue=False, tile=1}  # user.py:5
            async_commit()  # user.py:5
            %2: int32[] = const() {value=32} !{issued=True}
            %3: int32[] = elementwise(%1, %2) {fn='mul'} !{issued=True}
            copy() {dst=s[0:+32], pad=None, src=x[%0, %3:+32]} !{issued=True}  # user.py:7
            %4: float32[32] = load() {src=s[0:+32]}
            %5: float32[32] = load() {src=y[%0, 0:+32]}
            %6: float32[32] = elementwise(%4, %5) {fn='add'}
            store(%6) {dst=y[%0, 0:+32]}
          async_wait() {count=0}  # user.py:5
    """)


_SCHEDULED = """
    kernel k(grid=[2], threads=128) blocks(%0):
      input x: global float32[2, 96]
      output y: global float32[2, 32]
      scratch t: shared float32[32]T
      scratch s: shared float32[32]S
      copy() {dst=t[0:+32], pad=None, src=x[%0, 0:+32]} !{vec=4}  # user.py:4
      BARRIER1copy() {dst=y[%0, 0:+32], pad=None, src=t[0:+32]} !{vec=4}  # user.py:5
      BARRIER2async_issue() {guard=False, prologue=True, tile=0}
      async_commit()
      for %1 in pipelined(0, +3, stages=2):  # user.py:6
        async_wait() {count=0}
        barrier() !{reason='tile it is visible; the buffer refilled next is free'}
        async_issue() {guard=True, prologue=False, tile=1}
        async_commit()
        %2: int32[] = const() {value=32} !{issued=True}
        %3: int32[] = elementwise(%1, %2) {fn='mul'} !{issued=True}
        copy() {dst=s[0:+32], pad=None, src=x[%0, %3:+32]} !{issued=True, vec=4}
        %4: float32[32] = load() {src=s[0:+32]}
        %5: float32[32] = load() {src=y[%0, 0:+32]}
        %6: float32[32] = elementwise(%4, %5) {fn='add'}
        BARRIER3store(%6) {dst=y[%0, 0:+32]}
      async_wait() {count=0}
"""


def _scheduled(t: str = "", s: str = "", barriers: tuple[str, str, str] = ("", "", "")) -> str:
    text = _SCHEDULED.replace("]T\n", f"]{t}\n").replace("]S\n", f"]{s}\n")
    for i, b in enumerate(barriers, 1):
        text = text.replace(f"BARRIER{i}", b)
    return text


def test_smem_plan_places_stages_and_reuses_a_dead_buffers_bytes():
    """s (2 stages of 128 bytes) is live in the loop, t only before it: both at 0."""
    _check(lambda k: place_shared_buffers(k, SM80.caps), _scheduled(),
           _scheduled(" {offset=0}", " {offset=0, stages=2}"))


def test_barriers_go_before_the_prologue_that_refills_shared_bytes():
    """The prologue's cp.async writes s, whose bytes t had: a barrier before the prologue,
    none between its issues or before the loop, and the schedule's own barrier kept."""
    pad = "\n      "
    placed = _scheduled(" {offset=0}", " {offset=0, stages=2}")
    _check(insert_barriers, placed, _scheduled(
        " {offset=0}", " {offset=0, stages=2}", (
            "barrier() !{reason='read after write of t'}  # user.py:5" + pad,
            "barrier() !{reason=\"write after read of s (shares bytes with t), before the "
            "pipeline's prologue\"}" + pad,
            # y's 32 elements have 4 replicas each among 128 threads
            "barrier() !{reason='write after read of y'}" + pad + "  ")))


_REDUCTIONS = """
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global float32[2, 512]
      output y: global float32[2, 2]
      scratch s: shared float32[2, 512] {offset=0}
      copy() {dst=s[0:+2, 0:+512], pad=None, src=x[0:+2, 0:+512]} !{vec=4}  # user.py:3
      %1: float32[2, 512]#blocked(vec 4, threads 1x128) = load() {src=s[0:+2, 0:+512]}  # user.py:4
      B1%2: float32[2]#slice(blocked(vec 4, threads 1x128), [2, 512], dims (1,)) = reduce(%1) {axes=(1,), fn='sum'} !{scratch=(('partials', 'float', 256, 0),)}  # user.py:5
      store(%2) {dst=y[0, 0:+2]}  # user.py:5
      B2%3: float32[2]#slice(blocked(vec 4, threads 1x128), [2, 512], dims (1,)) = reduce(%1) {axes=(1,), fn='max'} !{scratch=(('partials', 'float', 256, 0),)}  # user.py:6
      store(%3) {dst=y[1, 0:+2]}  # user.py:6
"""  # noqa: E501


def test_barriers_order_two_reductions_sharing_scratch_bytes():
    """The smem_plan pass put both reductions' partials on s's bytes (each lives for its
    op only; s is dead after the load): the first reduction's scratch writes wait for the
    copy and load of s (same thread per element, so no barrier between those two), the
    second's for the first's reads of its partials. Nothing after the second: its own
    barrier ordered the rest."""
    pad = "\n      "
    _check(insert_barriers, _REDUCTIONS.replace("B1", "").replace("B2", ""),
           _REDUCTIONS.replace("B1", "barrier() !{reason='write after write of reduce partials "
                               "(shares bytes with s)'}  # user.py:5" + pad)
           .replace("B2", "barrier() !{reason='write after read of reduce partials'}  "
                    "# user.py:6" + pad))


_LOOP = """
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global float32[2, 512]
      output y: global float32[4, 2]
      scratch f: fragment float32[2, 512]#blocked(vec 4, threads 1x128)
      copy() {dst=f[0:+2, 0:+512], pad=None, src=x[0:+2, 0:+512]}
      for %1 in serial(0, +4):  # user.py:4
        %2: float32[2, 512]#blocked(vec 4, threads 1x128) = load() {src=f[0:+2, 0:+512]}
        B1%3: float32[2]#slice(blocked(vec 4, threads 1x128), [2, 512], dims (1,)) = reduce(%2) {axes=(1,), fn='sum'} !{scratch=(('partials', 'float', 256, 0),)}  # user.py:6
        B2%4: float32[2]#slice(blocked(vec 4, threads 1x128), [2, 512], dims (1,)) = reduce(%2) {axes=(1,), fn='max'} !{scratch=(('partials', 'float', 256, AT),)}  # user.py:7
        %5: float32[2]#slice(blocked(vec 4, threads 1x128), [2, 512], dims (1,)) = elementwise(%3, %4) {fn='add'}
        store(%5) {dst=y[%1, 0:+2]}
"""  # noqa: E501


def test_scratch_reused_across_loop_iterations_waits_only_where_no_op_barrier_did():
    """Two reductions in a loop. On bytes of their own, each one's internal barrier orders
    the other's reads of the previous iteration: no barrier. On the same bytes, each waits
    for the other's reads (the first for those of the previous iteration)."""
    apart = _LOOP.replace("AT", "1024")
    _check(insert_barriers, apart.replace("B1", "").replace("B2", ""),
           apart.replace("B1", "").replace("B2", ""))
    shared = _LOOP.replace("AT", "0")
    pad = "\n        "
    _check(insert_barriers, shared.replace("B1", "").replace("B2", ""), shared.replace(
        "B1", "barrier() !{reason='write after read of reduce partials'}  # user.py:6" + pad)
        .replace("B2", "barrier() !{reason='write after read of reduce partials'}  # user.py:7"
                 + pad))
