"""Shared-memory planning: offsets with reuse across disjoint lifetimes, loops keeping
buffers alive, alignment, the 48 KB opt-in and the per-target limit."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import ir, parser
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.smem_plan import ALIGN, Scratch, plan_shared_memory
from jaxtile.compiler.target import parse_target

CAPS = parse_target("cuda:sm_80").caps


def _kernel(body, shared):
    decls = "\n".join(f"  scratch {n}: shared float32[{e}]  # user.py:{i}"
                      for i, (n, e) in enumerate(shared.items(), 3))
    text = (f"kernel k(grid=[1], threads=128) blocks(%0):\n"
            f"  input x: global float32[4096]\n  output y: global float32[4096]\n{decls}\n"
            + textwrap.indent(textwrap.dedent(body).strip("\n"), "  "))
    return parser.parse_kernel(text)


def _bytes(shared):
    return {n: 4 * e for n, e in shared.items()}


def _disjoint(plan, a, b):
    return (plan.offsets[a] + plan.sizes[a] <= plan.offsets[b]
            or plan.offsets[b] + plan.sizes[b] <= plan.offsets[a])


SEQ = """
copy() {dst=a[0:+1000], pad=None, src=x[0:+1000]}
copy() {dst=y[0:+1000], pad=None, src=a[0:+1000]}
copy() {dst=b[0:+500], pad=None, src=x[0:+500]}
copy() {dst=y[0:+500], pad=None, src=b[0:+500]}
"""


def test_disjoint_lifetimes_share_bytes():
    shared = {"a": 1000, "b": 500}
    plan = plan_shared_memory(_kernel(SEQ, shared), _bytes(shared), CAPS)
    assert plan.offsets == {"a": 0, "b": 0}
    assert plan.total == 4096                      # 4000 bytes rounded up to ALIGN
    assert plan.shares() == [("a", "b")]
    assert not plan.needs_opt_in


def test_a_loop_that_uses_both_keeps_them_apart():
    shared = {"a": 1000, "b": 500}
    body = "for %1 in serial(0, +4):\n" + textwrap.indent(textwrap.dedent(SEQ).strip(), "  ")
    plan = plan_shared_memory(_kernel(body, shared), _bytes(shared), CAPS)
    assert _disjoint(plan, "a", "b")
    assert plan.offsets["b"] % ALIGN == 0 and plan.offsets["b"] >= 4000
    assert plan.shares() == []


def test_pipelined_stages_stay_alive_around_other_buffers():
    """A 3-stage operand filled inside a pipelined loop, and an epilogue buffer after it:
    the epilogue may reuse the stages, a buffer read inside the loop may not."""
    shared = {"stages": 3 * 1024, "bias": 256, "epi": 2048}
    body = """
    copy() {dst=bias[0:+256], pad=None, src=x[0:+256]}
    for %1 in pipelined(0, +8, stages=3):
      copy() {dst=stages[0:+1024], pad=None, src=x[0:+1024]}
    copy() {dst=y[0:+256], pad=None, src=bias[0:+256]}
    copy() {dst=epi[0:+2048], pad=None, src=x[0:+2048]}
    copy() {dst=y[0:+2048], pad=None, src=epi[0:+2048]}
    """
    plan = plan_shared_memory(_kernel(body, shared), _bytes(shared), CAPS)
    assert _disjoint(plan, "stages", "bias")
    assert plan.offsets["epi"] == plan.offsets["stages"] == 0
    assert set(plan.shares()) == {("epi", "stages")}
    assert plan.lifetimes["stages"] == (1, 2)


def test_op_scratch_lives_for_its_op_only():
    shared = {"a": 1000}
    kernel = _kernel(SEQ.replace("b[", "a["), shared)
    ops = [s for s in ir.walk(kernel.body)]
    extra = [Scratch("red0", 512, ops[1]), Scratch("conv0", 1024, ops[3])]
    plan = plan_shared_memory(kernel, _bytes(shared), CAPS, extra)
    assert _disjoint(plan, "a", "red0") and _disjoint(plan, "a", "conv0")
    assert plan.offsets["red0"] == plan.offsets["conv0"]   # never at the same time
    assert all(o % ALIGN == 0 for o in plan.offsets.values())


def test_above_48k_needs_the_opt_in():
    shared = {"a": 16384}                          # 64 KiB
    plan = plan_shared_memory(_kernel(SEQ.replace("b[", "a["), shared), _bytes(shared), CAPS)
    assert plan.total == 65536 and plan.needs_opt_in
    assert plan.static_limit == CAPS.static_smem_bytes == 48 * 1024
    assert "65536 / " in plan.report()


def test_over_the_limit_names_the_biggest_buffers():
    shared = {"a": 40000, "b": 30000, "c": 10}
    body = """
    for %1 in serial(0, +2):
      copy() {dst=a[0:+40000], pad=None, src=x[0:+1]}
      copy() {dst=b[0:+30000], pad=None, src=x[0:+1]}
      copy() {dst=c[0:+10], pad=None, src=x[0:+10]}
    """
    with pytest.raises(KernelError, match=r"k.*280192 bytes.*a \(160000 bytes, user.py:3\), "
                                          r"b \(120000 bytes, user.py:4\)"):
        plan_shared_memory(_kernel(body, shared), _bytes(shared), CAPS)


@jt.kernel
def _gemm_epilogue(a, b, *, bm=64, bn=64, bk=32):
    """A pipelined GEMM whose result goes out through a shared tile."""
    m, kd = a.shape
    n = b.shape[1]
    out = jt.empty((m, n), jnp.float32)
    i, j = jt.grid(jt.cdiv(m, bm), jt.cdiv(n, bn))
    acc = jt.fragment((bm, bn), jnp.float32)
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    c_s = jt.shared((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(kd, bk), stages=3)
    def _(k):
        jt.copy(a.at[i * bm, k * bk], a_s)
        jt.copy(b.at[k * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c_s)
    jt.copy(c_s, out.at[i * bm, j * bn])
    return out


def test_traced_gemm_epilogue_reuses_the_pipeline_stages():
    specs = (jax.ShapeDtypeStruct((256, 256), jnp.float16),) * 2
    kernel = _gemm_epilogue._specialise(specs, {}).tile_ir
    stages = 3
    shared = {b.name: int(np.prod(b.shape)) * b.dtype.itemsize for b in kernel.buffers
              if b.scope == "shared"}
    by_size = sorted(shared, key=shared.get)
    a_s, b_s, c_s = by_size[0], by_size[1], by_size[2]   # 4 KiB, 4 KiB, 16 KiB
    bytes_of = {**shared, a_s: stages * shared[a_s], b_s: stages * shared[b_s]}
    plan = plan_shared_memory(kernel, bytes_of, CAPS)
    assert _disjoint(plan, a_s, b_s)
    assert not _disjoint(plan, c_s, a_s) or not _disjoint(plan, c_s, b_s)
    assert plan.total == 2 * stages * 4096             # the epilogue fits in the stages' bytes
    assert not plan.needs_opt_in


def test_random_programs_never_overlap_live_buffers():
    """Straight-line copies with one loop around a random stretch: buffers whose uses
    (stretched over the loop) overlap in time get disjoint, aligned bytes."""
    rng = np.random.default_rng(3)
    for _ in range(40):
        names = [f"s{i}" for i in range(int(rng.integers(2, 7)))]
        shared = {n: int(rng.integers(1, 3000)) for n in names}
        uses = [names[int(rng.integers(len(names)))] for _ in range(int(rng.integers(3, 12)))]
        lo, hi = sorted(int(x) for x in rng.integers(0, len(uses) + 1, size=2))
        lines, when = [], {}
        for pos, n in enumerate(uses):
            inside = lo <= pos < hi
            if pos == lo and inside:
                lines.append("for %1 in serial(0, +3):")
            lines.append(("  " if inside else "")
                         + f"copy() {{dst={n}[0:+1], pad=None, src=x[0:+1]}}")
            t = (lo, hi - 1) if inside else (pos, pos)
            when[n] = (min(when.get(n, t)[0], t[0]), max(when.get(n, t)[1], t[1]))
        plan = plan_shared_memory(_kernel("\n".join(lines), shared), _bytes(shared), CAPS)
        assert set(plan.offsets) == set(uses)
        for a in plan.offsets:
            assert plan.offsets[a] % ALIGN == 0
            assert plan.offsets[a] + plan.sizes[a] <= plan.total
            for b in plan.offsets:
                if a < b and when[a][0] <= when[b][1] and when[b][0] <= when[a][1]:
                    assert _disjoint(plan, a, b), (lines, plan)


def test_a_tma_rings_mbarriers_are_planned_after_everything():
    """The ring's full and empty mbarriers (8 bytes each per stage) sit in the dynamic buffer
    at the ring_offset note, past every buffer (they live for the whole ring, the whole
    kernel once warp-specialised): no static shared array is left, for the plain ring
    (warp_specialize=False) and the split one."""
    import re

    from ws_gemm import ws_gemm

    from jaxtile.compiler import build
    from jaxtile.compiler.gpu.smem_plan import recorded_bytes, ring_bytes

    target = parse_target("cuda:sm_90a")
    a, b = jnp.zeros((128, 192), jnp.float16), jnp.zeros((192, 256), jnp.float16)
    for flag in (False, None):
        low = ws_gemm.lower(a, b, stages=3, warp_specialize=flag, target=target.name)
        kernel = build.lowered_ir(low.kernel, target)
        offsets, sizes = recorded_bytes(kernel)
        end = max(offsets[n] + sizes[n] for n in offsets)
        wait = next(s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
                    and s.kind == "tma_wait")
        at = wait.notes["ring_offset"]
        assert at >= end and at % 8 == 0 and ring_bytes(3) == 48
        src = low.source
        assert "JT_SHARED(" not in src
        views = re.findall(r"JT_SHARED_AT\(uint64_t, \w+, 3, (\d+)\);", src)
        assert [int(v) for v in views] == ([at] if flag is False else [at, at + 24])
        assert low._gpu.shared_bytes >= at + (24 if flag is False else 48)
