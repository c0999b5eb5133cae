"""The GPU passes' IR rules (``compiler/gpu/verify.py``): one bad IR text per rule, and the
error that names it; a well-formed pipelined loop passes; scratch that reuses bytes with and
without the barrier between."""

import textwrap

import pytest

from jaxtile.compiler import parser
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.verify import verify_gpu, verify_scratch_barriers

_PIPELINE = """
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global float16[64, 32]
      output y: global float16[16, 32]
      scratch s: shared float16[16, 32] {offset=0, stages=3}
      async_issue() {guard=False, prologue=True, tile=0}
      async_commit()
      async_issue() {guard=False, prologue=True, tile=1}
      async_commit()
      for %1 in pipelined(0, +4, stages=3):
        async_wait() {count=1}
        barrier() !{reason='tile it is visible; the buffer refilled next is free'}
        async_issue() {guard=True, prologue=False, tile=2}
        async_commit()
        %2: int32[] = const() {value=16} !{issued=True}
        %3: int32[] = elementwise(%1, %2) {fn='mul'} !{issued=True}
        copy() {dst=s[0:+16, 0:+32], pad=None, src=x[%3:+16, 0:+32]} !{issued=True}
        copy() {dst=y[0:+16, 0:+32], pad=None, src=s[0:+16, 0:+32]}
      async_wait() {count=0}
"""


def _kernel(text: str):
    return parser.parse_kernel("\n".join(ln for ln in textwrap.dedent(text).splitlines()
                                         if ln.strip()))


def _fails(text: str, match: str) -> None:
    with pytest.raises(KernelError, match=match):
        verify_gpu(_kernel(text))


def test_a_well_formed_pipeline_passes():
    kernel = _kernel(_PIPELINE)
    assert verify_gpu(kernel) is kernel


def test_a_pipeline_inside_a_serial_loop_passes():
    """The outer loop holds the prologue's commits but is no schedule of its own."""
    head, _, body = _PIPELINE.partition("      async_issue() {guard=False, prologue=True, tile=0}")
    body = "      async_issue() {guard=False, prologue=True, tile=0}" + body
    nested = head + "      for %9 in serial(0, +2):\n" + "".join(
        "  " + line + "\n" for line in body.splitlines() if line.strip())
    verify_gpu(_kernel(nested))


def test_a_wait_inside_the_loop_must_leave_the_iterations_tile_complete():
    _fails(_PIPELINE.replace("async_wait() {count=1}", "async_wait() {count=2}"),
           r"async_wait \{count=2\} in a loop of 3 stages: at most 1 groups")


def test_the_wait_after_the_loop_must_retire_every_group():
    _fails(_PIPELINE.replace("  async_wait() {count=0}", "  async_wait() {count=1}"),
           r"async_wait \{count=1\} outside a pipelined loop: at most 0")


def test_an_issue_may_not_run_a_whole_ring_of_stages_ahead():
    _fails(_PIPELINE.replace("prologue=False, tile=2", "prologue=False, tile=3"),
           r"tile k \+ 3 in a loop of 3 stages would refill a stage still in use")


def test_a_prologue_issue_stands_right_before_its_loop():
    moved = _PIPELINE.replace(
        "  async_commit()\n      for %1", "  async_commit()\n"
        "      %9: int32[] = const() {value=1}\n      for %1")
    _fails(moved, "a prologue async_issue must stand right before its pipelined loop")


_BRANCH = """
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global int32[4]
      output y: global int32[4]
      %1: int32[] = load() {src=FLAG[0]}
      %2: int32[] = const() {value=0}
      %3: bool[] = elementwise(%1, %2) {fn='gt'}
      if %3:  # user.py:7
        barrier() !{reason='read after write of s'}
      copy() {dst=y[0:+4], pad=None, src=x[0:+4]}
"""


def test_a_barrier_only_in_control_flow_every_thread_takes():
    verify_gpu(_kernel(_BRANCH.replace("FLAG", "x")))       # an input: the same everywhere
    _fails(_BRANCH.replace("FLAG", "y"),                      # written by the kernel
           r"the condition of the branch at user.py:7 reads global memory the kernel writes, "
           r"so threads may not all reach the block-wide barrier: read after write of s")


_SHARED = """
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global float32[64]
      output y: global float32[64]
      scratch a: shared float32[64] {offset=A}
      scratch b: shared float32[64] {offset=B}  # user.py:5
      copy() {dst=a[0:+64], pad=None, src=x[0:+64]}
      copy() {dst=b[0:+64], pad=None, src=a[0:+64]}
      copy() {dst=y[0:+64], pad=None, src=b[0:+64]}
"""


def test_offsets_are_aligned():
    verify_gpu(_kernel(_SHARED.replace("=A", "=0").replace("=B", "=256")))
    _fails(_SHARED.replace("=A", "=0").replace("=B", "=260"),
           r"shared buffer 'b' has offset 260: not a non-negative multiple of 128 bytes "
           r"\(at user.py:5\)")


def test_buffers_live_together_do_not_share_bytes():
    _fails(_SHARED.replace("=A", "=0").replace("=B", "=128"),
           r"shared buffers 'a' \(bytes 0..256\) and 'b' \(bytes 128..384\) overlap while "
           "both are live")


def test_buffers_live_at_different_times_may_share_bytes():
    verify_gpu(_kernel("""
        kernel k(grid=[1], threads=128) blocks(%0):
          input x: global float32[64]
          output y: global float32[64]
          scratch a: shared float32[64] {offset=0}
          scratch b: shared float32[64] {offset=0}
          copy() {dst=a[0:+64], pad=None, src=x[0:+64]}
          copy() {dst=y[0:+64], pad=None, src=a[0:+64]}
          copy() {dst=b[0:+64], pad=None, src=x[0:+64]}
          copy() {dst=y[0:+64], pad=None, src=b[0:+64]}
    """))


_OUT = "copy() {dst=y[0:+16, 0:+32], pad=None, src=s[0:+16, 0:+32]}"


@pytest.mark.parametrize("vec", [3, 16, 0])
def test_a_copys_thread_mapping_divides_its_row_in_at_most_16_bytes(vec):
    """f16 rows of 32: runs of 8 halves (16 bytes) or any divisor of 8; 3 does not divide the
    row, 16 halves would be a 32-byte access, 0 is no run."""
    _fails(_PIPELINE.replace(_OUT, _OUT + f" !{{vec={vec}}}"),
           rf"copy with vec={vec}: a thread's run must be a positive divisor of 8")


def test_a_narrower_mapping_than_the_widest_passes():
    verify_gpu(_kernel(_PIPELINE.replace(_OUT, _OUT + " !{vec=4}")))


_LAYOUT = "blocked(vec 4, threads 1x128)"
_SUM = f"slice({_LAYOUT}, [2, 512], dims (1,))"
_REDUCTIONS = f"""
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global float32[2, 512]
      output y: global float32[2, 2]
      scratch s: shared float32[2, 512] {{offset=0}}
      copy() {{dst=s[0:+2, 0:+512], pad=None, src=x[0:+2, 0:+512]}} !{{vec=4}}  # user.py:3
      %1: float32[2, 512]#{_LAYOUT} = load() {{src=s[0:+2, 0:+512]}}  # user.py:4
      B1%2: float32[2]#{_SUM} = reduce(%1) {{axes=(1,), fn='sum'}} !{{scratch=(('partials', 'float', 256, 0),)}}  # user.py:5
      store(%2) {{dst=y[0, 0:+2]}}  # user.py:5
      B2%3: float32[2]#{_SUM} = reduce(%1) {{axes=(1,), fn='max'}} !{{scratch=(('partials', 'float', 256, AT),)}}  # user.py:6
      store(%3) {{dst=y[1, 0:+2]}}  # user.py:6
"""  # noqa: E501
_BARRIER = "barrier() !{reason='scratch'}\n      "


def _reductions(b1: bool, b2: bool, at: int = 0) -> str:
    return (_REDUCTIONS.replace("B1", _BARRIER if b1 else "")
            .replace("B2", _BARRIER if b2 else "").replace("AT", str(at)))


def test_scratch_reusing_bytes_after_a_barrier_passes():
    kernel = _kernel(_reductions(True, True))
    assert verify_scratch_barriers(kernel) is kernel
    # On bytes of its own the second needs none: the first's lowering synchronised inside.
    verify_scratch_barriers(_kernel(_reductions(True, False, 1024)))


def test_scratch_reusing_a_dead_buffers_bytes_needs_a_barrier():
    with pytest.raises(KernelError, match=r"the partials scratch of the reduce \(bytes 0..1024\) "
                       r"reuses bytes of buffer 's' \(bytes 0..4096, at user.py:3\) with no "
                       r"barrier between them \(at user.py:5\)"):
        verify_scratch_barriers(_kernel(_reductions(False, True)))


def test_scratch_reusing_another_ops_scratch_needs_a_barrier():
    with pytest.raises(KernelError, match=r"the partials scratch of the reduce \(bytes 0..1024\) "
                       r"reuses bytes of the partials scratch of the reduce \(bytes 0..1024, "
                       r"at user.py:5\) with no barrier"):
        verify_scratch_barriers(_kernel(_reductions(True, False)))


_LOOP = f"""
    kernel k(grid=[1], threads=128) blocks(%0):
      input x: global float32[2, 512]
      output y: global float32[4, 2]
      scratch f: fragment float32[2, 512]#{_LAYOUT}
      copy() {{dst=f[0:+2, 0:+512], pad=None, src=x[0:+2, 0:+512]}}
      for %1 in serial(0, +EXTENT):  # user.py:4
        %2: float32[2, 512]#{_LAYOUT} = load() {{src=f[0:+2, 0:+512]}}
        BARRIER%3: float32[2]#{_SUM} = reduce(%2) {{axes=(1,), fn='sum'}} !{{scratch=(('partials', 'float', 256, 0),)}}  # user.py:6
        store(%3) {{dst=y[%1, 0:+2]}}
"""  # noqa: E501


def test_scratch_reused_by_the_next_iteration_needs_a_barrier():
    verify_scratch_barriers(_kernel(_LOOP.replace("EXTENT", "4").replace(
        "BARRIER", "barrier() !{reason='scratch'}\n        ")))
    verify_scratch_barriers(_kernel(_LOOP.replace("EXTENT", "1").replace("BARRIER", "")))
    with pytest.raises(KernelError, match=r"reuses bytes of the partials scratch of the reduce "
                       r"\(bytes 0..1024, at user.py:6\) with no barrier"):
        verify_scratch_barriers(_kernel(_LOOP.replace("EXTENT", "4").replace("BARRIER", "")))
