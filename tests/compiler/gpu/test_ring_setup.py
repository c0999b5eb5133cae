"""A TMA ring's set-up as IR (``compiler/gpu/ring_setup.py``): the pipelining pass writes a
proxy-fence barrier, ``mbarrier_init`` and a barrier before each ring's prologue, code
generation prints ``fence.mbarrier_init`` from that op alone, the verifier refuses a ring
whose set-up is missing or wrong (each rule shown to bite on mutated IR), and the emulator
reports a ring used with no barrier after its initialisation."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from ws_gemm import ws_gemm

from jaxtile import ops
from jaxtile.compiler import build, ir
from jaxtile.compiler.cuda import emulated
from jaxtile.compiler.emulator import EmulatedKernel, EmulatorError
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.ring_setup import INIT, ring_setup
from jaxtile.compiler.gpu.verify import verify_gpu
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")


def _matmul(m=128, k=64, n=64):
    a = jnp.asarray(np.random.default_rng(0).standard_normal((m, k)), jnp.float16)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((k, n)), jnp.float16)
    return a, b


def _plain_ring(a, b):
    return ws_gemm.lower(a, b, bn=64, warp_specialize=False, target=SM90A.name)


def _scheduled():
    """A GEMM's lowered IR on sm_90a, its TMA ring not warp-specialised (a split ring drops
    this set-up and initialises its barriers itself: test_warp_specialise.py)."""
    low = _plain_ring(*_matmul())
    kernel = build.lowered_ir(low.kernel, SM90A)
    return low, kernel


def test_the_pass_writes_the_set_up_and_codegen_prints_it():
    low, kernel = _scheduled()
    top = [s for s in kernel.body if isinstance(s, ir.Op)]
    at = next(i for i, s in enumerate(top) if s.kind == INIT)
    before, init, after = top[at - 1], top[at], top[at + 1]
    assert before.kind == after.kind == "barrier" and before.notes.get("proxy_fence")
    assert not after.notes.get("proxy_fence")
    assert init.attrs == {"stages": 2, "count": 1}
    assert top[at + 2].kind == "tma_issue" and top[at + 2].attrs["prologue"]
    assert "mbarrier_init() {count=1, stages=2}" in low.lowered_ir
    src = low.source
    assert src.count("fence_mbarrier_init();") == 1
    # the ring is a view of the dynamic shared memory at the offset smem_plan gave it
    offset = init.notes["ring_offset"]
    assert "JT_SHARED_AT(uint64_t, ring" in src and f", 2, {offset});" in src
    # the order the IR gives: fence + barrier, init, barrier, the prologue
    order = [src.index(t) for t in ("fence_proxy_async();", "fence_mbarrier_init();",
                                    "the ring is initialised", "mbarrier_arrive_expect_tx(")]
    assert order == sorted(order)


def test_ring_setup_is_the_three_ops():
    ops_ = ring_setup(3, "user.py:1")
    assert [o.kind for o in ops_] == ["barrier", INIT, "barrier"]
    assert ops_[0].notes["proxy_fence"] and ops_[1].attrs == {"stages": 3, "count": 1}


def _without(kernel: ir.Kernel, drop) -> ir.Kernel:
    return dataclasses.replace(kernel, body=tuple(s for s in kernel.body if not drop(s)))


def _mutate_init(kernel: ir.Kernel, **attrs) -> ir.Kernel:
    body = tuple(dataclasses.replace(s, attrs={**s.attrs, **attrs})
                 if isinstance(s, ir.Op) and s.kind == INIT else s for s in kernel.body)
    return dataclasses.replace(kernel, body=body)


@pytest.mark.parametrize("mutate, words", [
    (lambda k: _without(k, lambda s: isinstance(s, ir.Op) and s.kind == INIT),
     "must follow its set-up"),
    (lambda k: _mutate_init(k, stages=3), "for a ring of 2 stages"),
    (lambda k: _mutate_init(k, count=2), "expecting 2 arrivals"),
])
def test_the_verifier_refuses_a_wrong_set_up(mutate, words):
    _, kernel = _scheduled()
    verify_gpu(kernel)          # the pass's own output passes
    with pytest.raises(KernelError, match=words):
        verify_gpu(mutate(kernel))


def test_the_verifier_wants_the_fence_on_the_first_barrier():
    _, kernel = _scheduled()
    body = list(kernel.body)
    at = next(i for i, s in enumerate(body) if isinstance(s, ir.Op) and s.kind == INIT)
    body[at - 1] = dataclasses.replace(body[at - 1], notes={"reason": "no fence"})
    with pytest.raises(KernelError, match="must carry proxy_fence"):
        verify_gpu(dataclasses.replace(kernel, body=tuple(body)))


def test_sm80_has_no_ring_and_no_set_up():
    kernel = build.lowered_ir(ops.matmul.lower(*_matmul(), target="cuda:sm_80").kernel,
                              parse_target("cuda:sm_80"))
    assert not [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.kind == INIT]


def test_a_ring_used_before_the_barrier_after_its_init_is_reported():
    """The generated source with the barrier after the initialisation dropped: another
    thread waits on the ring before thread 0 initialised it (or unordered after it: the
    emulator's schedule decides which of its two reports comes)."""
    a, b = _matmul()
    code = _plain_ring(a, b)._gpu
    line = next(ln for ln in code.source.splitlines() if "the ring is initialised" in ln)
    bad = code.source.replace(line, "")
    params, launch = emulated.emulator_launch(code)
    kernel = EmulatedKernel.build(bad, code.symbol, params, launch, file="ring_no_barrier.cu")
    arrays = [np.asarray(a), np.asarray(b), np.zeros((128, 64), np.float16)]
    with pytest.raises(EmulatorError) as err:
        kernel.run(*arrays)
    text = str(err.value) + str(err.value.report)
    assert ("was never initialised" in text
            or "no barrier after its initialisation" in text), text[:2000]
