"""The warp-specialisation pass (compiler/gpu/warp_specialise.py): which loops it splits, the
IR it writes (the split with each role's registers, the producer's issues, the consumers'
release and named barriers), the code printed from it, its register arithmetic against
numbers worked out by hand, and its rules biting on broken IR."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from ws_gemm import ws_gemm

import jaxtile as jt
from jaxtile.compiler import build, ir, parser, printer
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu import warp_specialise as ws
from jaxtile.compiler.target import parse_target


def _ab(m, k, n, dtype=jnp.float16):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((m, k)), dtype),
            jnp.asarray(rng.standard_normal((k, n)), dtype))


def _lower(m=128, k=256, n=256, target="cuda:sm_90a", **kw):
    a, b = _ab(m, k, n)
    return ws_gemm.lower(a, b, target=target, **kw)


# -- registers --------------------------------------------------------------------------------

def test_register_budget_arithmetic():
    """By hand: a 384-thread block starts at 65536 / 384 = 170 -> 168 per thread, a pool of
    64512 (PTX: setmaxnreg moves registers within the CTA's); the producer warpgroup keeps 40
    per thread (5120); two consumer warpgroups share 59392: 232 per thread. One consumer
    warpgroup: a 256-thread block starts at 256, a pool of 65536, and the consumers could
    have 472, capped at setmaxnreg's 256. Four: 640 threads start at 102 -> 96, a pool of
    61440, 56320 for 512 consumers: 110 -> 104."""
    assert ws.plan_registers(256) == (40, 232)
    assert ws.plan_registers(128) == (40, 256)
    assert ws.plan_registers(512) == (40, 104)
    assert ws.launch_regs(384) == 168 and ws.launch_regs(256) == 256
    assert ws.launch_regs(640) == 96
    assert 128 * 40 + 256 * 232 == 64512 == 384 * 168
    assert ws.check_budget(256, 128, 40, 232) is None
    assert ws.check_budget(128, 128, 40, 256) is None
    assert ws.check_budget(512, 128, 40, 104) is None


@pytest.mark.parametrize("regs, why", [
    ((40, 240), "exceed the block's 384 x 168 = 64512"),   # 5120 + 61440 = 66560
    ((48, 232), "= 65536 registers exceed the block's"),    # within 64K, not the pool
    ((40, 236), "not a multiple of 8"),
    ((16, 232), "not a multiple of 8 in [24, 256]"),
    ((176, 232), "would raise the producer's 168"),
    ((40, 160), "would lower the consumers' 168"),
])
def test_register_budget_rejects(regs, why):
    assert why in ws.check_budget(256, 128, *regs)


# -- the split in the IR and the code ---------------------------------------------------------

def test_the_gemm_splits_on_sm90a_with_each_roles_budget():
    low = _lower()
    text = low.lowered_ir
    assert ("warp_specialise() {barrier=1, consumer_regs=232, consumers=256, "
            "producer_regs=40, producers=128}") in text
    assert "tma_release() !{role='consumer'}" in text
    assert text.count("tma_issue() {") == text.count("role='producer'}") - text.count(
        "const() {value=0} !{role='producer'}")
    src = low._gpu.source
    assert "JT_LAUNCH_BOUNDS(384, 1)" in src and low._gpu.threads == 384
    assert "setmaxnreg_dec<40>();" in src and "setmaxnreg_inc<232>();" in src
    assert "mbarrier_init(empty2 + s, 8);" in src      # one arrival per consumer warp
    # the consumers' code follows the producer's return; only the ring's initialisation
    # synchronises the whole block
    consumer = src.split("setmaxnreg_inc<232>();")[1]
    assert "sync_threads" not in consumer and "tma_load" not in consumer
    assert src.count("sync_threads();") == 1
    producer = src.split("setmaxnreg_dec<40>();")[1].split("return;")[0]
    assert "mbarrier_wait_parity(empty2" in producer and "tma_load_2d(" in producer
    assert "wgmma" not in producer


def test_plain_sm90_and_sm80_are_unchanged():
    for target in ("cuda:sm_90", "cuda:sm_80"):
        low = _lower(target=target)
        assert "warp_specialise() {" not in low.lowered_ir
        assert "setmaxnreg" not in low._gpu.source
        assert low._gpu.threads == 256


def test_a_cp_async_fallback_is_unchanged_under_every_flag():
    """K = 999: A's rows are 1998 bytes, not a multiple of 16, so TMA cannot make the copy."""
    a, b = _ab(128, 999, 256)
    for flag in (None, True, False):
        low = ws_gemm.lower(a, b, target="cuda:sm_90a", warp_specialize=flag)
        assert "async_issue" in low.lowered_ir and "warp_specialise() {" not in low.lowered_ir


def test_the_flag_false_keeps_the_plain_ring():
    low = _lower(warp_specialize=False)
    assert "tma_wait" in low.lowered_ir and "warp_specialise() {" not in low.lowered_ir
    assert low._gpu.threads == 256 and "setmaxnreg" not in low._gpu.source


@jt.kernel(threads=128)
def _column_sums(x, *, bk=32, warp_specialize=None):
    """A TMA ring whose compute reduces across warps (scratch: synchronises the block)."""
    n, m = x.shape
    out = jt.empty((1, m), jnp.float32)
    s = jt.shared((bk, m), x.dtype)
    acc = jt.fragment((1, m), jnp.float32)
    acc[...] = jnp.zeros((1, m), jnp.float32)

    @jt.pipelined(jt.cdiv(n, bk), stages=2, warp_specialize=warp_specialize)
    def _(k):
        jt.copy(x.at[k * bk, 0], s, pad=0)
        acc[...] = acc[...] + jnp.sum(s[...].astype(jnp.float32), axis=0, keepdims=True)

    jt.copy(acc, out.at[0, 0])
    return out


def test_a_ring_that_cannot_split_is_left_alone_or_refused_when_asked():
    x = jnp.zeros((256, 64), jnp.float16)
    low = _column_sums.lower(x, target="cuda:sm_90a")
    assert "tma_wait" in low.lowered_ir and "warp_specialise() {" not in low.lowered_ir
    with pytest.raises(KernelError, match="cannot warp-specialise this loop: the reduce at "):
        _ = _column_sums.lower(x, target="cuda:sm_90a", warp_specialize=True).lowered_ir


def test_the_flag_is_checked():
    a, b = _ab(128, 128, 256)
    with pytest.raises(Exception, match="warp_specialize must be True, False or None"):
        _ = ws_gemm.lower(a, b, target="cuda:sm_90a", warp_specialize="yes").lowered_ir


def test_the_flag_prints_and_parses_back():
    var = ir.Value((), np.int32)
    loop = ir.For(var, 0, 4, "pipelined", 3, (), None, False)
    kernel = ir.Kernel("k", (1,), 128, (), (), (loop,))
    text = printer.format_kernel(kernel)
    assert "pipelined(0, +4, stages=3, warp_specialize=False)" in text
    back = parser.parse_kernel(text)
    assert back.body[0].warp_specialize is False and back.body[0].stages == 3


# -- the rules --------------------------------------------------------------------------------

def _split_kernel():
    return build.lowered_ir(_lower().kernel, parse_target("cuda:sm_90a"))


def _replace(kernel, fn):
    return dataclasses.replace(kernel, body=tuple(ir.map_ops(kernel.body, fn)))


@pytest.mark.parametrize("break_it, why", [
    (lambda op: [dataclasses.replace(op, attrs={**op.attrs, "consumer_regs": 240})]
     if op.kind == ws.KIND else [op],
     "exceed the block's 384 x 168 = 64512"),
    (lambda op: [] if op.kind == "tma_release" else [op], "must end with the consumers'"),
    (lambda op: [dataclasses.replace(op, notes={})] if op.kind == "tma_issue" else [op],
     "is not the producer's"),
    (lambda op: [op, ir.Op("barrier", (), None, {}, None)] if op.kind == "tma_wait" else [op],
     "is not the consumers' named barrier 1 over 256"),
])
def test_the_rules_bite(break_it, why):
    kernel = _split_kernel()
    assert ws.check_split(kernel) is kernel
    with pytest.raises(KernelError, match=why):
        ws.check_split(_replace(kernel, break_it))


# -- ptxas ------------------------------------------------------------------------------------

def test_the_split_compiles_with_the_launch_register_count_and_no_spills():
    """NVRTC (here without a GPU): ptxas gives the 384-thread block the 168 registers per
    thread setmaxnreg then moves between the roles, and does not ignore setmaxnreg (it would
    where it cannot tell the count at entry)."""
    from jaxtile.compiler.cuda import compile as cuda_compile
    from jaxtile.compiler.cuda import nvrtc

    if not nvrtc.available():
        pytest.skip("NVRTC is not installed (jaxtile[cuda])")
    target = parse_target("cuda:sm_90a")
    low = _lower(m=512, k=512, n=512)
    compiled = cuda_compile.compile_to_library(build.lowered_ir(low.kernel, target), target)
    assert compiled.launch.threads == 384
    assert compiled.ptxas.registers == 168, compiled.log
    assert compiled.ptxas.spill_stores == compiled.ptxas.spill_loads == 0, compiled.log
    assert "ignored" not in compiled.log


@jt.kernel(threads=256)
def _bounded_gemm(a, b, tiles, *, bm=128, bn=128, bk=64):
    """``a[:, :K'] @ b[:K']`` for ``K' = tiles[0] * bk`` with A's first K tile loaded before
    the ring and read in it (as attention's Q)."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a0 = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)
    jt.copy(a.at[by * bm, 0], a0)
    count = jnp.minimum(jt.cdiv(k, bk), tiles[0])

    @jt.pipelined(count, stages=2)
    def _(kk):
        jt.copy(b.at[kk * bk, bx * bn], b_s)
        jt.gemm(a0, b_s, acc)

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


def test_the_producer_reads_an_input_scalar_that_bounds_the_ring():
    a, b = _ab(128, 256, 128)
    text = _bounded_gemm.lower(a, b, jnp.asarray([3], jnp.int32),
                               target="cuda:sm_90a").lowered_ir
    assert "warp_specialise() {" in text
    load = next(line for line in text.splitlines() if "src=tiles[" in line)
    assert "role='producer'" in load
    # its bound reaches the producer's loop: the producer's code reads tiles[0] too
    src = _bounded_gemm.lower(a, b, jnp.asarray([3], jnp.int32), target="cuda:sm_90a").source
    producer = src[src.index("setmaxnreg_dec"):src.index("setmaxnreg_inc")]
    assert "tiles[0]" in producer
