"""The proxy fence before a wgmma gemm is the barrier pass's decision, as IR: a ``barrier``
noted ``proxy_fence`` (printed as ``fence_proxy_async(); sync_threads();``) only where
generic-proxy writes of shared memory precede an async-proxy (wgmma) read. The pipelined GEMM
gets one barrier per iteration, not one more per gemm; the verifier refuses an IR without the
fence, and the emulator's proxy check reports generated code without it."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from test_hopper_wgmma_gemm import _gemm_two_warpgroups, _run_source
from ws_gemm import ws_gemm

from jaxtile import ops
from jaxtile.compiler import parser, printer
from jaxtile.compiler.emulator import EmulatorError
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.barriers import PROXY_FENCE
from jaxtile.compiler.gpu.verify import verify_barrier_pass


def _loop_ops(text: str) -> list[str]:
    """The op kinds of the first pipelined loop's body, barriers with their fence note."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if "in pipelined(" in ln)
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    out = []
    for ln in lines[start + 1:]:
        if len(ln) - len(ln.lstrip()) < indent:
            break
        kind = ln.strip().split("(")[0].split("= ")[-1]
        out.append(kind + ("+fence" if f"{PROXY_FENCE}=True" in ln else ""))
    return out


# A row of 100 halves (200 bytes) is no 16-byte multiple: the pipelined loop stays on
# cp.async, whose writes go through the generic proxy and need the fence before wgmma.
CP_ASYNC_SHAPES = ((128, 100), (100, 64))


def test_pipelined_wgmma_gemm_has_one_fenced_barrier_per_iteration():
    a, b = (jnp.ones(s, jnp.float16) for s in CP_ASYNC_SHAPES)
    low = ops.matmul.lower(a, b, target="cuda:sm_90a")
    assert "async_wait(" in low.lowered_ir and "tma_wait(" not in low.lowered_ir
    body = _loop_ops(low.lowered_ir)
    # the schedule's barrier after the wait carries the fence; no barrier of its own
    assert [k for k in body if k.startswith("barrier")] == ["barrier+fence"], body
    assert body.index("barrier+fence") < body.index("gemm")
    src = low.source
    loop = src[src.index("for ("):]
    assert loop.index("fence_proxy_async();") < loop.index("sync_threads();") \
        < loop.index("jaxtile::gemm_wgmma<")
    # sm_80 has no async proxy: no fence anywhere
    assert PROXY_FENCE not in ops.matmul.lower(a, b, target="cuda:sm_80").lowered_ir


def test_tma_filled_tiles_need_no_fence():
    # TMA writes through the async proxy itself: the ring's barrier (the refilled stage must
    # be free) carries no fence. (The plain ring: warp specialisation would replace that
    # barrier by the consumers' release, test_warp_split_has_no_fence.)
    a, b = jnp.ones((128, 96), jnp.float16), jnp.ones((96, 256), jnp.float16)
    low = ws_gemm.lower(a, b, warp_specialize=False, target="cuda:sm_90a")
    body = _loop_ops(low.lowered_ir)
    assert "tma_wait" in body and [k for k in body if k.startswith("barrier")] == ["barrier"]
    # the one fence left is the ring's set-up (ring_setup.py), before its first TMA write
    # (not a gemm's): the barrier before mbarrier_init
    fenced = [ln for ln in low.lowered_ir.splitlines() if PROXY_FENCE in ln]
    assert len(fenced) == 1 and "earlier run of the ring" in fenced[0], fenced
    assert low.source.count("fence_proxy_async();") == 1


def test_warp_split_has_no_fence():
    # the ring split on sm_90a: no barrier in the consumers' loop, no fence at all (no
    # generic write of shared memory precedes the TMA loads or the wgmma)
    a, b = jnp.ones((128, 96), jnp.float16), jnp.ones((96, 64), jnp.float16)
    low = ops.matmul.lower(a, b, target="cuda:sm_90a")
    assert "warp_specialise() {" not in low.lowered_ir   # one warpgroup: not inferred
    low = ws_gemm.lower(a, b, bn=64, target="cuda:sm_90a")
    assert "warp_specialise() {" in low.lowered_ir
    body = _loop_ops(low.lowered_ir)
    assert "tma_wait" in body and "tma_release" in body
    assert not [k for k in body if k.startswith("barrier")], body
    assert PROXY_FENCE not in low.lowered_ir and "fence_proxy_async" not in low.source


def test_copies_then_a_gemm_fence_the_barrier_the_hazard_needs():
    # an unrolled K loop of copies and gemms: each gemm's read-after-write barrier carries the
    # fence; the write-after-read barrier before the next copies does not
    a, b = jnp.ones((130, 70), jnp.bfloat16), jnp.ones((70, 120), jnp.bfloat16)
    text = _gemm_two_warpgroups.lower(a, b, target="cuda:sm_90a").lowered_ir
    kinds = [ln.strip().split("(")[0] + ("+fence" if f"{PROXY_FENCE}=True" in ln else "")
             for ln in text.splitlines() if re.match(r"\s*(barrier|copy|gemm)\(", ln)]
    step = ["copy", "copy", "barrier+fence", "gemm"]
    assert kinds == step + ["barrier"] + step + ["barrier"] + step + ["copy"], kinds


def test_no_fence_without_an_async_read():
    # mma.sync reads shared memory through the generic proxy: no fence on sm_90 (no "a")
    a, b = jnp.ones((130, 70), jnp.float16), jnp.ones((70, 120), jnp.float16)
    text = _gemm_two_warpgroups.lower(a, b, target="cuda:sm_90").lowered_ir
    assert "barrier(" in text and PROXY_FENCE not in text


def test_verifier_refuses_a_wgmma_read_without_the_fence():
    a, b = (jnp.ones(s, jnp.float16) for s in CP_ASYNC_SHAPES)
    kernel = ops.matmul.lower(a, b, target="cuda:sm_90a")._gpu_ir
    assert verify_barrier_pass(kernel) is kernel
    text = printer.format_kernel(kernel)
    assert text.count(f"{PROXY_FENCE}=True") == 1
    mutant = parser.parse_kernel(text.replace(f"{PROXY_FENCE}=True, ", ""))
    with pytest.raises(KernelError, match="proxy fence: the wgmma reads shared buffer"):
        verify_barrier_pass(mutant)


@pytest.mark.slow   # two emulator builds
def test_emulator_reports_generated_code_without_the_fence():
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in ((64, 36), (36, 64)))  # cp.async
    low = ops.matmul.lower(jnp.asarray(a), jnp.asarray(b), target="cuda:sm_90a")
    assert low.source.count("fence_proxy_async();") == 1
    with pytest.raises(EmulatorError, match="fence.proxy.async"):
        _run_source(low, lambda s: s.replace("fence_proxy_async();", ""), a, b)
    # the unmutated code runs clean and right (the harness itself)
    c, report = _run_source(low, lambda s: s + "\n", a, b)
    assert report["findings"] == []
    np.testing.assert_allclose(c.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=2e-2, atol=5e-2)
