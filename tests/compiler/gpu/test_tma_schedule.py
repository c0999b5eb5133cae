"""The pipelining pass on a target with TMA (``gpu/copy_schedule.py``, ``gpu/tma.py``): golden
before/after texts of a loop whose staged copy becomes a TMA load in an mbarrier ring and of
one whose source rows are not 16-byte multiples (cp.async); the ring's verifier rules, each
shown to bite on a mutated schedule; the tensor maps a kernel takes."""

import textwrap

import pytest

from jaxtile.compiler import parser, printer, verify
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu import tma
from jaxtile.compiler.gpu.copy_schedule import schedule_async_copies
from jaxtile.compiler.gpu.verify import verify_gpu
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")
SM80 = parse_target("cuda:sm_80")


def _text(s: str) -> str:
    return "\n".join(ln for ln in textwrap.dedent(s).splitlines() if ln.strip())


def _run(before: str, caps=SM90A.caps):
    kernel = parser.parse_kernel(_text(before))
    verify.verify(kernel)
    result = schedule_async_copies(kernel, caps)
    verify_gpu(result)
    text = printer.format_kernel(result)
    assert printer.format_kernel(parser.parse_kernel(text)) == text   # prints and parses back
    return result, text


_LOOP = """
    kernel k(grid=[2], threads=128) blocks(%0):
      input x: global DTYPE[2, COLS]
      output y: global DTYPE[2, 64]
      scratch s: shared DTYPE[64]
      for %1 in pipelined(0, +3, stages=3):  # user.py:5
        %2: int32[] = const() {value=64}
        %3: int32[] = elementwise(%1, %2) {fn='mul'}
        copy() {dst=s[0:+64], pad=None, src=x[%0, %3:+64]}  # user.py:7
        %4: DTYPE[64] = load() {src=s[0:+64]}
        store(%4) {dst=y[%0, 0:+64]}
"""


def _loop(dtype: str, cols: int) -> str:
    return _LOOP.replace("DTYPE", dtype).replace("COLS", str(cols))


def test_a_staged_copy_with_aligned_rows_becomes_a_tma_ring():
    """Three stages over 3 iterations: after the ring's set-up (barrier, mbarrier_init,
    barrier) the prologue issues tiles 0 and 1 (128 bytes each: one f16 row of 64), each
    iteration waits for its tile's phase, frees the stage to refill with the block barrier
    and issues tile k + 2; the copy carries its TMA box (64 x 1,
    innermost first) and no swizzle; no wait follows the loop."""
    _, text = _run(_loop("float16", 192))
    assert text == _text("""
        kernel k(grid=[2], threads=128) blocks(%0):
          input x: global float16[2, 192]
          output y: global float16[2, 64]
          scratch s: shared float16[64]
          barrier() !{proxy_fence=True, reason='every thread is past its waits on an earlier run of the ring'}  # user.py:5
          mbarrier_init() {count=1, stages=3}  # user.py:5
          barrier() !{reason='the ring is initialised before any thread uses it'}  # user.py:5
          tma_issue() {bytes=128, guard=False, prologue=True, tile=0}  # user.py:5
          tma_issue() {bytes=128, guard=False, prologue=True, tile=1}  # user.py:5
          for %1 in pipelined(0, +3, stages=3):  # user.py:5
            tma_wait()  # user.py:5
            barrier() !{reason='tile it is visible; the buffer refilled next is free'}  # user.py:5
            tma_issue() {bytes=128, guard=True, prologue=False, tile=2}  # user.py:5
            %2: int32[] = const() {value=64} !{issued=True}
            %3: int32[] = elementwise(%1, %2) {fn='mul'} !{issued=True}
            copy() {dst=s[0:+64], pad=None, src=x[%0, %3:+64]} !{issued=True, tma_box=(64, 1), tma_swizzle=0}  # user.py:7
            %4: float16[64] = load() {src=s[0:+64]}
            store(%4) {dst=y[%0, 0:+64]}
    """)  # noqa: E501


def test_rows_that_are_not_16_byte_multiples_keep_cp_async():
    """An f16 row of 999 elements (1998 bytes) breaks TMA's 16-byte stride rule: the same
    loop gets the cp.async schedule on sm_90a, as on sm_80."""
    _, on_hopper = _run(_loop("float16", 999))
    _, on_ampere = _run(_loop("float16", 999), SM80.caps)
    assert on_hopper == on_ampere
    assert "async_wait() {count=1}" in on_hopper and "tma" not in on_hopper
    # sm_80 has no TMA at all, whatever the shape
    _, aligned = _run(_loop("float16", 192), SM80.caps)
    assert "tma" not in aligned and "async_issue" in aligned


def test_a_converting_or_padded_copy_keeps_cp_async():
    convert = _loop("float16", 192).replace("scratch s: shared float16[64]",
                                           "scratch s: shared float32[64]").replace(
        "%4: float16[64] = load() {src=s[0:+64]}\n        store(%4)",
        "%4: float32[64] = load() {src=s[0:+64]}\n        %5: float16[64] = convert(%4)\n"
        "        store(%5)")
    assert "tma" not in _run(convert)[1]
    padded = _loop("float16", 192).replace("pad=None, src=x", "pad=1.0, src=x")
    assert "tma" not in _run(padded)[1]


def _mutated(old: str, new: str) -> str:
    """The scheduled IR of the aligned loop with ``old`` replaced by ``new`` once."""
    _, text = _run(_loop("float16", 192))
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize("old, new, message", [
    # a wrong expect_tx count: the phase completes early or never
    ("{bytes=128, guard=True", "{bytes=256, guard=True", "announces 256 bytes but its loads"),
    ("{bytes=128, guard=False, prologue=True, tile=0}",
     "{bytes=64, guard=False, prologue=True, tile=0}", "complete early"),
    # a prologue that leaves tile 1's wait with no arrival
    ("  tma_issue() {bytes=128, guard=False, prologue=True, tile=1}  # user.py:5\n", "",
     "prologue issues of tiles [0], not [0, 1]"),
    # the iteration's issue of the wrong tile: a stage gets two arrivals in one phase
    ("guard=True, prologue=False, tile=2}", "guard=True, prologue=False, tile=1}",
     "issue tile k + 2"),
    # a box that does not tile the destination
    ("tma_box=(64, 1)", "tma_box=(32, 1)", "its source and destination need"),
    # a ring's wait in a cp.async loop's place
    ("tma_wait()", "async_wait() {count=1}", "tma_issue in the schedule of a cp.async"),
])
def test_the_ring_rules_bite(old, new, message):
    kernel = parser.parse_kernel(_mutated(old, new))
    with pytest.raises(KernelError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("+", r"\+")):
        verify_gpu(kernel)


def test_tensor_maps_one_per_buffer_box_and_swizzle():
    kernel, _ = _run(_loop("float16", 192))
    (m,) = tma.tensor_maps(kernel)
    assert m == tma.TensorMap("tmap_x", 0, (64, 1), 0)


def test_a_tile_of_less_than_128_bytes_keeps_cp_async():
    """Stages of a 64-byte tile would start at 64-byte offsets, where TMA may not write."""
    small = _loop("float16", 192).replace("[64]", "[32]").replace(":+64", ":+32")
    assert "tma" not in _run(small)[1] and "async_issue" in _run(small)[1]
