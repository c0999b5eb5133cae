"""Tile IR: canonical printing, the verifier, dead-code elimination and fusion decisions."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import ir, verify
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.passes.dce import eliminate_dead_code
from jaxtile.compiler.passes.fusion import fuse_elementwise


@jt.kernel
def _scaled_rows(x, *, rows=4):
    n, m = x.shape
    out = jt.empty((n, m), x.dtype)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, m), jnp.float32)
    jt.copy(x.at[r * rows, 0], t)
    v = t[...]
    t[...] = v / jnp.max(v, axis=1, keepdims=True)
    jt.copy(t, out.at[r * rows, 0])
    return out


def test_printed_ir_is_canonical_and_readable():
    x = jnp.ones((10, 16))
    a = _scaled_rows.lower(x)
    b = _scaled_rows.lower(x)
    assert a.tile_ir == b.tile_ir and a.key == b.key
    text = a.tile_ir
    assert text.startswith("kernel _scaled_rows(grid=[3], threads=128)")
    assert "scratch frag0: fragment float32[4, 16]" in text
    assert "reduce(" in text and "fn='max'" in text
    assert "copy() {dst='out0'" in text
    assert "%0" in text and "?" not in text


def test_dce_drops_unused_loads_but_keeps_effects():
    kernel = _scaled_rows.lower(jnp.ones((10, 16))).kernel
    kinds = [s.kind for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    # the swap that writes t returns the old value; nobody uses it, so only one load remains
    assert kinds.count("load") == 1
    assert kinds.count("copy") == 2 and kinds.count("store") == 1
    assert eliminate_dead_code(kernel).body == kernel.body


def test_verifier_rejects_bad_ir_with_the_line():
    i32 = np.dtype(np.int32)
    buf = ir.Buffer("x", (4,), np.dtype(np.float32), "global", "input")
    val = ir.Value((4,), np.float32)
    bad_store = ir.Op("store", (val,), None,
                      {"buffer": "x", "index": (ir.Index(0, 4),)}, line="user.py:7")
    kernel = ir.Kernel("k", (1,), 128, (buf,), (ir.Value((), i32),),
                       [ir.Op("load", (), val, {"buffer": "x", "index": (ir.Index(0, 4),)}),
                        bad_store])
    with pytest.raises(KernelError, match=r"read-only.*user.py:7"):
        verify.verify(kernel)
    orphan = ir.Op("elementwise", (ir.Value((4,), np.float32),), ir.Value((4,), np.float32),
                   {"fn": "exp"})
    with pytest.raises(KernelError, match="outside its scope"):
        verify.verify(ir.Kernel("k", (1,), 128, (buf,), (), [orphan]))


def test_fusion_keeps_expensive_shared_values_and_respects_writes():
    kernel = fuse_elementwise(_scaled_rows.lower(jnp.ones((10, 16))).kernel)
    ops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    load = next(o for o in ops if o.kind == "load")
    reduce = next(o for o in ops if o.kind == "reduce")
    div = next(o for o in ops if o.attrs.get("fn") == "div")
    # v is read twice (max and division) but re-reading t is cheap and nothing writes t
    # in between; the reduction and the division's result are not per-element leaves.
    assert load.attrs.get("inline") and div.attrs.get("inline")
    assert not reduce.attrs.get("inline")
