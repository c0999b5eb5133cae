"""The ping-pong pass (compiler/gpu/pingpong.py) on the 2-D flash-attention forward of
tests/pingpong_kernels.py: the IR it writes and the code printed from it, when it applies and
its flag, its rule biting on broken IR; the kernel run as sm_90a code in the emulator against
a float64 formula (f16 and bf16, ragged and dividing shapes, trip counts 0, 1 and many) with
no finding; the order in which the warpgroups issue their wgmmas, shown by a log line the
test adds to the generated source; seeded protocol mistakes reported by the emulator."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pingpong_kernels import flash_formula, flash_fwd, flash_fwd_3wg
from ws_gemm import ws_gemm

import jaxtile as jt
from jaxtile.compiler import build, ir, parser, printer
from jaxtile.compiler.cuda import emulated
from jaxtile.compiler.emulator import EmulatedKernel, EmulatorError
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu import pingpong as pp
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")


def _qkv(t, s, d, dtype=jnp.float16, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape), dtype)
                 for shape in ((t, d), (s, d), (s, d)))


def _lower(t=256, s=192, d=64, target="cuda:sm_90a", **kw):
    return flash_fwd.lower(*_qkv(t, s, d), target=target, **kw)


# -- the IR and the code ----------------------------------------------------------------------

def test_the_pass_writes_the_protocol_into_the_ir():
    text = _lower().lowered_ir
    head = text.index("warp_specialise() {")
    assert text.index("pingpong() {barrier=2, count=256, warpgroups=2}") > head
    loop = text[text.index("for %"):]
    # each gemm stands between its turn's wait and pass: S = Q K^T first, then P V
    waits = [m.start() for m in re.finditer(r"turn_wait\(%\d+\)", loop)]
    passes = [m.start() for m in re.finditer(r"turn_pass\(%\d+, %\d+\)", loop)]
    gemms = [m.start() for m in re.finditer(r"gemm\(\)", loop)]
    assert len(waits) == len(passes) == len(gemms) == 2
    assert waits[0] < gemms[0] < passes[0] < waits[1] < gemms[1] < passes[1]
    assert "first=True" in loop[waits[0]:gemms[0]] and "first=False" in loop[waits[1]:]
    assert "last=False" in loop[passes[0]:waits[1]] and "last=True" in loop[passes[1]:]
    # the loop's top barrier moved before it (the body only reads Q's shared tile)
    before = text[:text.index("for %")]
    assert "tile it is visible" in before and "barrier()" not in loop


def test_the_code_prints_the_barriers():
    src = _lower()._gpu.source
    assert re.search(r"if \(!\(\(tid / 128\) == 0 && \w+ == 0\)\) barrier_sync\(2 \+ "
                     r"\(tid / 128\), 256\);", src)
    assert re.search(r"if \(!\(\(tid / 128\) == 1 && (\w+) == \w+ - 1\)\) barrier_arrive\(2 \+ "
                     r"\(\(tid / 128\) \+ 1\) % 2, 256\);", src)
    assert src.count("barrier_sync(2 + (tid / 128), 256);") == 2
    assert src.count("barrier_arrive(2 + ((tid / 128) + 1) % 2, 256);") == 2
    producer = src.split("setmaxnreg_dec<40>();")[1].split("return;")[0]
    assert "barrier_sync" not in producer and "barrier_arrive(" not in producer


def test_the_ir_prints_and_parses_back():
    kernel = build.lowered_ir(_lower().kernel, SM90A)
    back = parser.parse_kernel(printer.format_kernel(kernel))
    assert printer.format_kernel(back) == printer.format_kernel(kernel)
    assert pp.check_pingpong(back) is back
    var = ir.Value((), np.int32)
    loop = ir.For(var, 0, 4, "pipelined", 2, (), None, None, False)
    text = printer.format_kernel(ir.Kernel("k", (1,), 128, (), (), (loop,)))
    assert "pipelined(0, +4, stages=2, pingpong=False)" in text
    assert parser.parse_kernel(text).body[0].pingpong is False


# -- when -------------------------------------------------------------------------------------

def test_the_split_keeps_the_fence_for_q():
    """The ws pass drops the ring's set-up, but not its proxy-fence barrier when shared
    memory (Q's tile) is written before the loop: the loop's wgmmas read it through the async
    proxy (without it the emulator reports the missing fence.proxy.async)."""
    for flag in (None, False):
        low = _lower(pingpong=flag)
        assert "warp_specialise() {" in low.lowered_ir
        src = low._gpu.source
        consumers = src.split("setmaxnreg_inc<232>();")[1]
        loop = consumers.index("mbarrier_wait_parity(")
        assert consumers.index("fence_proxy_async();") < consumers.index("barrier_sync(1, 256)")\
            < loop


def test_the_flag_false_and_other_targets_leave_it_off():
    for target, kw in (("cuda:sm_90a", {"pingpong": False}), ("cuda:sm_90", {}),
                       ("cuda:sm_80", {})):
        low = _lower(target=target, **kw)
        assert "pingpong()" not in low.lowered_ir and "turn_wait" not in low.lowered_ir


@pytest.mark.parametrize("kw, why", [
    ({"warp_specialize": False}, "the kernel is not warp-specialised"),
])
def test_asking_where_it_cannot_apply_names_why(kw, why):
    with pytest.raises(KernelError, match=f"pingpong=True\\): cannot schedule .*{why}"):
        _ = _lower(pingpong=True, **kw).lowered_ir


def test_a_gemm_loop_without_work_between_gemms_is_left_alone_or_refused():
    a = jnp.zeros((128, 256), jnp.float16)
    b = jnp.zeros((256, 256), jnp.float16)
    low = ws_gemm.lower(a, b, target="cuda:sm_90a")
    assert "warp_specialise() {" in low.lowered_ir and "pingpong()" not in low.lowered_ir
    kernel = build.lowered_ir(low.kernel, SM90A)
    loop = next(s for s in kernel.body if isinstance(s, ir.For))
    asked = dataclasses.replace(kernel, body=tuple(
        dataclasses.replace(s, pingpong=True) if s is loop else s for s in kernel.body))
    with pytest.raises(KernelError, match="no work between two GEMMs"):
        pp.pingpong(asked)


def test_the_flag_is_checked():
    with pytest.raises(Exception, match="pingpong must be True, False or None"):
        _ = _lower(pingpong="yes").lowered_ir


# -- the rule ---------------------------------------------------------------------------------

def _kernel():
    return build.lowered_ir(_lower().kernel, SM90A)


def _map(kernel, fn):
    return dataclasses.replace(kernel, body=tuple(ir.map_ops(kernel.body, fn)))


def _attr(kind, **attrs):
    return lambda op: ([dataclasses.replace(op, attrs={**op.attrs, **attrs})]
                       if op.kind == kind else [op])


def _drop_first(kind):
    seen = []

    def fn(op):
        if op.kind == kind and not seen:
            seen.append(op)
            return []
        return [op]
    return fn


@pytest.mark.parametrize("break_it, why", [
    (_drop_first(pp.PASS), "stands inside a turn"),
    (lambda op: [] if op.kind == pp.WAIT else [op], "is outside a turn"),
    (_attr(pp.KIND, count=128), "counts 128 threads, not the 256"),
    (_attr(pp.KIND, barrier=1), "must lie above the block's"),
    (_attr(pp.KIND, barrier=15), "below 16"),
    (_attr(pp.WAIT, count=192), "not the pingpong op's"),
    (_attr(pp.WAIT, first=True), "only the body's first may have first=True"),
    (_attr(pp.PASS, last=True), "last turn_pass alone has last=True"),
    (lambda op: [op, ir.Op("barrier", (), None, {}, None, {"named": (1, 256)})]
     if op.kind == pp.WAIT else [op], "stands inside a turn"),
])
def test_the_rule_bites(break_it, why):
    kernel = _kernel()
    assert pp.check_pingpong(kernel) is kernel
    with pytest.raises(KernelError, match=why):
        pp.check_pingpong(_map(kernel, break_it))


def test_the_kernel_compiles_with_no_spills():
    """NVRTC (no GPU needed), D = 128: the split's launch count (65536 / 384 -> 168, which
    setmaxnreg then moves: 232 a consumer thread) and no spills."""
    from jaxtile.compiler.cuda import compile as cuda_compile
    from jaxtile.compiler.cuda import nvrtc

    if not nvrtc.available():
        pytest.skip("NVRTC is not installed (jaxtile[cuda])")
    low = _lower(t=512, s=512, d=128)
    compiled = cuda_compile.compile_to_library(build.lowered_ir(low.kernel, SM90A), SM90A)
    assert compiled.launch.threads == 384
    assert compiled.ptxas.registers == 168, compiled.log
    assert compiled.ptxas.spill_stores == compiled.ptxas.spill_loads == 0, compiled.log


# -- the emulator -----------------------------------------------------------------------------

@pytest.fixture
def hopper(monkeypatch):
    """Kernels run as sm_90a code in the emulator; records the source of each library built
    (as tests/emulator/conftest.py's fixture of that name)."""
    built = []
    real = emulated.build_library

    def spy(source, *args, **kwargs):
        built.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(emulated, "build_library", spy)
    before = jt.backend()
    jax.clear_caches()   # (jit's caches do not know jaxtile's backend)
    jt.set_backend("cuda-emulator:sm_90a")
    try:
        yield built
    finally:
        jt.set_backend(before)
        jax.clear_caches()


def _run(hopper, q, k, v, **kw):
    """Through the backend (jax.jit on ``cuda-emulator:sm_90a``, which raises on errors), and
    the same code run directly for its report: no finding, warnings included."""
    got = jax.jit(lambda *a: flash_fwd(*a, **kw))(q, k, v)
    assert "barrier_arrive(2 + ((tid / 128) + 1) % 2, 256)" in hopper[-1]
    want = flash_formula(q, k, v, **kw)
    # P is rounded to the 16-bit type before P V: 2^-8 (bf16) or 2^-11 (f16) of each weight
    tol = 2e-2 if q.dtype == jnp.bfloat16 else 3e-3
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)
    code = flash_fwd.lower(q, k, v, target="cuda:sm_90a", **kw)._gpu
    # numpy's bfloat16 (ml_dtypes) has no DLPack: a bf16 output goes in as a jax array,
    # which the run does not give back to compare (the jitted call's is compared above)
    f16 = q.dtype == jnp.float16
    out = np.zeros(q.shape, np.float16) if f16 else jnp.zeros(q.shape, q.dtype)
    report = _build(code.source, code, "pp_run").run(q, k, v, out)
    assert report["findings"] == []
    if f16:
        np.testing.assert_array_equal(out, np.asarray(got))
    np.testing.assert_allclose(np.asarray(flash_fwd.reference(q, k, v, **kw), np.float64),
                               want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, t, s, kw", [
    (jnp.float16, 256, 192, {}),                           # dividing; 3 iterations a block
    (jnp.bfloat16, 200, 40, {}),                           # ragged T and S; 1 iteration
    (jnp.float16, 200, 130, {"causal": True, "shift": -128}),   # block 0: 0 iterations,
])                                                               # block 1: 2
def test_the_kernel_runs_in_the_emulator(hopper, dtype, t, s, kw):
    _run(hopper, *_qkv(t, s, 64, dtype), **kw)


def test_three_warpgroups_take_turns_round_robin(hopper):
    """W = 3 (384 consumer threads, 192 queries a block): barriers 2, 3, 4, each warpgroup
    handing over to (w + 1) % 3; ragged T and S, 3 iterations."""
    q, k, v = _qkv(250, 130, 64, jnp.bfloat16, seed=4)
    low = flash_fwd_3wg.lower(q, k, v, bm=192, target="cuda:sm_90a")
    assert "pingpong() {barrier=2, count=256, warpgroups=3}" in low.lowered_ir
    got = jax.jit(lambda *a: flash_fwd_3wg(*a, bm=192))(q, k, v)
    assert "barrier_arrive(2 + ((tid / 128) + 1) % 3, 256)" in hopper[-1]
    assert "(tid / 128) == 2 && " in hopper[-1]
    np.testing.assert_allclose(np.asarray(got, np.float64), flash_formula(q, k, v),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, t, s, d, kw", [
    (jnp.bfloat16, 384, 320, 128, {}),                         # D = 128, 5 iterations
    (jnp.float16, 300, 333, 64, {"causal": True, "shift": -64}),   # trip 1, 3 and 5
    (jnp.bfloat16, 256, 257, 64, {"causal": True, "shift": 70}),
])
def test_the_kernel_runs_in_the_emulator_larger(hopper, dtype, t, s, d, kw):
    _run(hopper, *_qkv(t, s, d, dtype, seed=1), **kw)


def _emulated(t=128, s=256, d=64, **kw):
    """The sm_90a code of one block (4 iterations), its arrays and the float64 result."""
    q, k, v = _qkv(t, s, d, seed=2)
    code = flash_fwd.lower(q, k, v, target="cuda:sm_90a", **kw)._gpu
    arrays = [np.asarray(x).view(np.float16) for x in (q, k, v)]
    return code, [*arrays, np.zeros((t, d), np.float16)], flash_formula(q, k, v)


def _build(source, code, name):
    params, launch = emulated.emulator_launch(code)
    kernel = EmulatedKernel.build(source, code.symbol, params, launch, file=f"{name}.cu")
    kernel.set_timeout(60)
    return kernel


def _logged(source):
    """``source`` with a line before and after every wgmma gemm in which each warpgroup's
    first thread prints its index: the order the emulator ran them in."""
    out = []
    for line in source.splitlines():
        if re.search(r"\bgemm_wgmma(_rs)?<", line):
            pad = line[:len(line) - len(line.lstrip())]
            log = (f'{pad}if (tid % 128 == 0) device_printf("wgmma %s %d\\n", "{{}}", '
                   "tid / 128);")
            out += [log.format("issue"), line, log.format("done")]
        else:
            out.append(line)
    return "\n".join(out)


def _order(capfd, kernel, arrays):
    capfd.readouterr()
    report = kernel.run(*arrays)
    assert report["findings"] == []
    lines = [ln.split() for ln in capfd.readouterr().out.splitlines() if ln.startswith("wgmma")]
    return [(what, int(wg)) for _, what, wg in lines]


def test_the_warpgroups_take_turns_at_the_tensor_cores(capfd):
    """Each warpgroup's wgmmas (2 a iteration, 4 iterations) issue alternately, and no
    warpgroup issues while the other's are in flight; without the pass the emulator's
    scheduler runs the warpgroups' gemms at the same time."""
    code, arrays, want = _emulated()
    logged = _logged(code.source)
    assert logged.count('device_printf("wgmma') == 4
    events = _order(capfd, _build(logged, code, "pp_order"), arrays)
    np.testing.assert_allclose(arrays[3].astype(np.float64), want, rtol=3e-3, atol=3e-3)
    issues = [wg for what, wg in events if what == "issue"]
    assert issues == [0, 1] * 8, events
    for i in range(0, len(events), 2):      # issue, done of one warpgroup, then the next
        assert events[i][0] == "issue" and events[i + 1] == ("done", events[i][1]), events

    plain, arrays, _ = _emulated(pingpong=False)
    events = _order(capfd, _build(_logged(plain.source), plain, "pp_off"), arrays)
    assert sorted(wg for what, wg in events if what == "issue") == [0] * 8 + [1] * 8
    assert any(events[i][0] == events[i + 1][0] == "issue" for i in range(len(events) - 1))


def test_the_unmutated_kernel_runs_clean():
    code, arrays, want = _emulated()
    report = _build(code.source, code, "pp_ok").run(*arrays)
    assert report["findings"] == []
    np.testing.assert_allclose(arrays[3].astype(np.float64), want, rtol=3e-3, atol=3e-3)


_PASS = "barrier_arrive(2 + ((tid / 128) + 1) % 2, 256);"
_WAIT = "barrier_sync(2 + (tid / 128), 256);"


def _first_pass_dropped(source):
    at = source.index(_PASS)
    return source[:at] + "/* dropped */;" + source[at + len(_PASS):]


@pytest.mark.parametrize("mutate, finding", [
    # no hand-over after S = Q K^T: warpgroup 1 waits for its first turn forever
    (_first_pass_dropped, "barrier 3"),
    # warpgroup 0 waits for its first turn too: nobody hands it over
    (lambda s: re.sub(r"if \(!\(\(tid / 128\) == 0 && \w+ == 0\)\) ", "", s, count=1),
     "barrier 2"),
    # the hand-over counts only its own 128 threads against the wait's 256
    (lambda s: s.replace(_PASS, _PASS.replace("256", "128")),
     "barrier_arrive 3 with 128 threads at pp_mutated.cu:"),
    # the wait counts 192 threads against the hand-over's 256: one instance, two counts
    (lambda s: s.replace(_WAIT, _WAIT.replace("256", "192")),
     "meets an open instance of barrier 3 counting 192"),
])
def test_seeded_protocol_mistakes_are_reported(mutate, finding):
    code, arrays, _ = _emulated()
    bad = mutate(code.source)
    assert bad != code.source
    with pytest.raises(EmulatorError) as err:
        _build(bad, code, "pp_mutated").run(*arrays)
    text = str(err.value) + str(err.value.report)
    assert finding in text, text[:2000]


def test_a_hand_over_nobody_takes_is_reported():
    """The last warpgroup hands over in the last iteration too: an arrival on barrier 2 that
    no wait takes. The block's exit discards it (no deadlock), the emulator reports the
    instance left open."""
    code, arrays, _ = _emulated()
    bad = re.sub(r"if \(!\(\(tid / 128\) == 1 && \w+ == \w+ - 1\)\) ", "", code.source, count=1)
    assert bad != code.source
    report = _build(bad, code, "pp_left_open").run(*arrays)
    assert any("barrier 2 ended the block open: 128 of its 256 threads arrived" in f["message"]
               for f in report["findings"]), report["findings"]
