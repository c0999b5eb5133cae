"""The TMA-store pass (``compiler/gpu/tma_store.py``): which shared -> global copies become
TMA stores on sm_90 on, their boxes and tensor maps, the proxy fence the barrier pass puts
before them and the waits before their source is written again and at the kernel's end;
copies that do not qualify, and targets without TMA, are unchanged. The generated GEMM with
a TMA-store epilogue (``tests/tma_store_kernels.py``) runs in the emulator
(``tests/emulator/test_hopper_tma_store.py``)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from tma_store_kernels import (
    gemm_tma_epilogue,
    store_then_pipeline,
    two_tiles_through_one_buffer,
)

import jaxtile as jt
from jaxtile.compiler import build, ir, op_defs
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu import tma
from jaxtile.compiler.gpu.tma_store import STORE, WAIT, store_box, verify_tma_stores
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")


@jt.kernel(threads=128)
def read_back(x):
    """A tile stored, then read back from the output by the block: the store stays generic."""
    n, m = x.shape
    out = jt.empty((n, m), x.dtype)
    s = jt.shared((n, m), x.dtype)
    s[...] = x[...] * 2
    jt.copy(s, out.at[0, 0])
    out[...] = out[...] + 1
    return out


def _ops(kernel: ir.Kernel, kind: str) -> list[ir.Op]:
    return [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.kind == kind]


def _lowered(fn, *args, target=SM90A):
    low = fn.lower(*args, target=target.name)
    return low, build.lowered_ir(low.kernel, target)


def _f16(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float16)


@pytest.mark.parametrize("m, n, k", [(128, 128, 64), (100, 72, 40)])
def test_the_epilogue_copy_becomes_a_tma_store(m, n, k):
    low, kernel = _lowered(gemm_tma_epilogue, _f16((m, k)), _f16((k, n), 1))
    stores = _ops(kernel, STORE)
    assert len(stores) == 1 and not [c for c in _ops(kernel, "copy")
                                     if c.attrs["dst"].buffer == kernel.params[-1].name]
    assert stores[0].notes[tma.BOX] == (64, 64) and stores[0].notes[tma.SWIZZLE] == 0
    # the tile's generic writes are fenced for the async proxy: a proxy-fence barrier between
    body = list(ir.walk(kernel.body))
    at = body.index(stores[0])
    fill = max(i for i, s in enumerate(body[:at]) if isinstance(s, ir.Op) and s.kind == "copy"
               and s.attrs["dst"].buffer == stores[0].attrs["src"].buffer)
    assert any(isinstance(s, ir.Op) and s.kind == "barrier" and s.notes.get("proxy_fence")
               for s in body[fill:at])
    # the kernel ends with the issuing thread's wait
    assert isinstance(kernel.body[-1], ir.Op) and kernel.body[-1].kind == WAIT
    assert kernel.body[-1].attrs["count"] == 0
    # its tensor map: the output's, box 64 x 64, no swizzle, after the loads' two
    maps = tma.tensor_maps(kernel)
    assert [(m.buffer, m.box, m.swizzle) for m in maps][-1] == (2, (64, 64), 0)
    assert "tma_store" in low.lowered_ir and "tma_store_wait" in low.lowered_ir


def test_generated_source_issues_commits_and_waits_in_that_order():
    low = gemm_tma_epilogue.lower(_f16((100, 40)), _f16((40, 72), 1), target=SM90A.name)
    src = low._gpu.source
    fence = src.rindex("fence_proxy_async();")
    store = src.index("tma_store_2d(tensor_map_ref(tmap_")
    commit = src.index("bulk_commit_group();")
    wait = src.index("bulk_wait_group_read<0>();")
    assert fence < store < commit < wait
    assert "if (tid == 0)" in src[store - 200:store]


def test_targets_without_tma_keep_the_copy():
    for name in ("cuda:sm_80", "hip:gfx90a"):
        _, kernel = _lowered(gemm_tma_epilogue, _f16((128, 64)), _f16((64, 128), 1),
                             target=parse_target(name))
        assert not _ops(kernel, STORE) and not _ops(kernel, WAIT)


def test_a_refilled_source_waits_before_its_next_write():
    x = _f16((32, 64))
    _, kernel = _lowered(two_tiles_through_one_buffer, x)
    flat = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    kinds = [s.kind for s in flat if s.kind in (STORE, WAIT)]
    assert kinds == [STORE, WAIT, STORE, WAIT]
    # between the first store and the refill: the wait, then a barrier (the others write)
    first_wait = next(i for i, s in enumerate(flat) if s.kind == WAIT)
    source = next(s for s in flat if s.kind == STORE).attrs["src"].buffer
    refill = next(i for i in range(first_wait, len(flat))
                  if any(r.buffer == source for r in op_defs.writes(flat[i])))
    assert any(s.kind == "barrier" for s in flat[first_wait:refill])


def test_an_output_the_block_reads_back_keeps_the_generic_copy():
    _, kernel = _lowered(read_back, _f16((16, 64)))
    assert not _ops(kernel, STORE)


@pytest.mark.parametrize("shape, why", [
    ((64, 999), "rows of 999 halves are not 16-byte multiples"),
    ((64, 520), "a box 520 wide is past TMA's 256"),
])
def test_outputs_tma_cannot_store_keep_the_copy(shape, why):
    @jt.kernel(threads=128)
    def copy_out(x):
        out = jt.empty(x.shape, x.dtype)
        s = jt.shared(x.shape, x.dtype)
        s[...] = x[...]
        jt.copy(s, out.at[0, 0])
        return out

    _, kernel = _lowered(copy_out, _f16(shape))
    assert not _ops(kernel, STORE), why


def test_store_box_rules():
    """The box is the shared tile's, innermost first; a 3-D output takes a box of depth 1;
    a converting copy, a swizzled or multi-buffered source do not qualify."""
    f16 = np.dtype(np.float16)
    bufs = {"s": ir.Buffer("s", (16, 64), f16, "shared", "scratch"),
            "o2": ir.Buffer("o2", (40, 64), f16, "global", "output"),
            "o3": ir.Buffer("o3", (3, 40, 64), f16, "global", "output"),
            "f": ir.Buffer("f", (40, 64), np.dtype(np.float32), "global", "output"),
            "sw": ir.Buffer("sw", (16, 64), f16, "shared", "scratch", attrs={"swizzle": 3}),
            "st": ir.Buffer("st", (16, 64), f16, "shared", "scratch", attrs={"stages": 2})}

    def copy(src, dst, index):
        return ir.Op("copy", (), None, {"src": ir.whole(src, bufs[src].shape),
                                        "dst": ir.Region(dst, index), "pad": None})

    two = (ir.Index(16, 16), ir.Index(0, 64))
    assert store_box(copy("s", "o2", two), bufs) == (64, 16)
    assert store_box(copy("s", "o3", (ir.Index(2, None), *two)), bufs) == (64, 16, 1)
    assert store_box(copy("s", "f", two), bufs) is None
    assert store_box(copy("sw", "o2", two), bufs) is None
    assert store_box(copy("st", "o2", two), bufs) is None


def _drop_wait(kernel: ir.Kernel, which: int) -> ir.Kernel:
    """The kernel without its ``which``-th top-level tma_store_wait."""
    waits = [i for i, s in enumerate(kernel.body) if isinstance(s, ir.Op) and s.kind == WAIT]
    drop = waits[which]
    return dataclasses.replace(kernel, body=kernel.body[:drop] + kernel.body[drop + 1:])


def test_the_verifier_refuses_a_source_written_before_the_wait():
    _, kernel = _lowered(two_tiles_through_one_buffer, _f16((32, 64)))
    verify_tma_stores(kernel)       # the pass's output passes
    with pytest.raises(KernelError, match="writes a TMA store's source"):
        verify_tma_stores(_drop_wait(kernel, 0))
    with pytest.raises(KernelError, match="ends with a TMA store pending"):
        verify_tma_stores(_drop_wait(kernel, -1))


@jt.kernel(threads=128)
def _tiles_in_a_loop(x):
    """Row blocks of ``x`` doubled, out through one shared tile in a loop: the next
    iteration's fill is the source's next write."""
    n, m = x.shape
    out = jt.empty((n, m), x.dtype)
    s = jt.shared((16, m), x.dtype)

    @jt.loop(n // 16)
    def _(t):
        s[...] = x[jt.ds(t * 16, 16), :] * 2
        jt.copy(s, out.at[t * 16, 0])

    return out


def test_a_store_in_a_loop_waits_before_the_next_iterations_fill():
    _, kernel = _lowered(_tiles_in_a_loop, _f16((48, 64)))
    loop = next(s for s in ir.walk(kernel.body) if isinstance(s, ir.For))
    kinds = [s.kind for s in loop.body if isinstance(s, ir.Op) and s.kind in (STORE, WAIT)]
    assert kinds[0] == STORE and WAIT in kinds
    verify_tma_stores(kernel)
    # without the loop's waits the next iteration's fill writes the source too early
    bare = ir.with_blocks(loop, [[s for s in loop.body
                                  if not (isinstance(s, ir.Op) and s.kind == WAIT)]])
    body = tuple(bare if s is loop else s for s in kernel.body)
    with pytest.raises(KernelError, match="writes a TMA store's source"):
        verify_tma_stores(dataclasses.replace(kernel, body=body))


def test_a_pipeline_prologue_after_a_store_waits_first():
    _, kernel = _lowered(store_then_pipeline, _f16((16, 64)), _f16((64, 64), 1))
    flat = [s.kind for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    store, issue = flat.index(STORE), flat.index("tma_issue")
    assert WAIT in flat[store:issue]
    verify_tma_stores(kernel)
