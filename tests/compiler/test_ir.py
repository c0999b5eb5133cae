"""Tile IR: canonical text, the parser, immutability, keys and the verifier."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import build, ir, op_defs, parser, printer, verify
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.target import parse_target


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


@jt.kernel
def _staged_gemm(a, b, *, stages=2):
    m, k = a.shape
    out = jt.empty((m, b.shape[1]), jnp.float32)
    jt.grid(1)
    a_s = jt.shared((stages, m, 16), a.dtype)
    acc = jt.fragment((m, b.shape[1]), jnp.float32)
    b_s = jt.shared((16, b.shape[1]), b.dtype)
    acc[...] = jnp.zeros(acc.shape, jnp.float32)

    @jt.loop(k // 16)
    def _(i):
        jt.copy(a.at[0, i * 16], a_s.at[i % stages])
        jt.copy(b.at[i * 16, 0], b_s)
        jt.gemm(a_s.at[i % stages], b_s, acc)

    jt.copy(acc, out)
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
    assert "copy() {dst=out0[%" in text and "src=frag0[0:+4, 0:+16]" in text
    assert "%0" in text and "?" not in text


@pytest.mark.parametrize("kernel,args", [
    (_scaled_rows, (jnp.ones((10, 16)),)),
    (_staged_gemm, (jnp.ones((32, 64)), jnp.ones((64, 16)))),
    (jt.ops.layer_norm_fwd, (jnp.ones((6, 40)), jnp.ones(40), jnp.ones(40))),
    (jt.ops.matmul_relu, (jnp.ones((40, 24), jnp.bfloat16), jnp.ones((24, 8), jnp.bfloat16))),
])
def test_text_round_trips_through_the_parser(kernel, args):
    lowered = kernel.lower(*args)
    parsed = parser.parse_kernel(lowered.tile_ir)
    assert printer.format_kernel(parsed) == lowered.tile_ir
    verify.verify(parsed)
    # the parsed kernel compiles to the same key, so it is the same program
    assert build.kernel_key(parsed, parse_target("cpu")) == lowered.key
    noted = build.lowered_ir(parsed, parse_target("cpu"))
    text = printer.format_kernel(noted)
    assert printer.format_kernel(parser.parse_kernel(text)) == text


def test_parser_errors_name_the_line():
    text = _scaled_rows.lower(jnp.ones((10, 16))).tile_ir.replace("%1", "%99", 1)
    with pytest.raises(ValueError, match=r"Tile IR line \d+"):
        parser.parse_kernel(text)


def test_gemm_reads_a_stage_of_a_multi_buffered_tile():
    a = jax.random.normal(jax.random.key(0), (32, 64))
    b = jax.random.normal(jax.random.key(1), (64, 16))
    text = _staged_gemm.lower(a, b).tile_ir
    assert "gemm() {a=a_s" not in text  # names are generated; check the region shape
    gemm_line = next(ln for ln in text.splitlines() if "gemm()" in ln)
    assert ", 0:+32, 0:+16]" in gemm_line and "transpose_a=False" in gemm_line
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(jax.jit(_staged_gemm)(a, b), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_staged_gemm.reference(a, b), ref, rtol=1e-4, atol=1e-4)


def test_ir_is_immutable():
    kernel = _scaled_rows.lower(jnp.ones((10, 16))).kernel
    op = next(s for s in ir.walk(kernel.body) if isinstance(s, ir.Op))
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.kind = "store"
    with pytest.raises(TypeError):
        op.attrs["value"] = 3
    with pytest.raises(AttributeError):
        op.result.shape = (1,)
    assert isinstance(kernel.body, tuple)


def test_key_and_text_survive_build_and_lowering():
    x = jnp.ones((10, 16))
    lowered = _scaled_rows.lower(x)
    before = (lowered.tile_ir, lowered.key, printer.key_text(lowered.kernel))
    build.lowered_ir(lowered.kernel, parse_target("cpu"))   # runs fusion
    assert "jt__scaled_rows" in lowered.source               # builds the TIR
    jax.jit(_scaled_rows)(x).block_until_ready()              # compiles and runs
    again = _scaled_rows.lower(x)
    assert (lowered.tile_ir, lowered.key, printer.key_text(lowered.kernel)) == before
    assert (again.tile_ir, again.key) == before[:2]


def test_pass_notes_stay_out_of_the_key():
    kernel = _scaled_rows.lower(jnp.ones((10, 16))).kernel
    fused = build.lowered_ir(kernel, parse_target("cpu"))
    assert "!{inline=True}" in printer.format_kernel(fused)
    assert printer.key_text(fused) == printer.key_text(kernel)


def test_every_op_kind_has_a_definition():
    kernel = _scaled_rows.lower(jnp.ones((10, 16))).kernel
    for op in ir.walk(kernel.body):
        if isinstance(op, ir.Op):
            d = op_defs.get(op.kind)
            assert set(op.attrs) == set(d.attrs)
    assert {r.buffer for r in op_defs.reads(next(
        s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.kind == "copy"))} \
        == {"x"}


_HEADER = """kernel k(grid=[1], threads=128) blocks(%0):
  input x: global float32[16]
  scratch a: fragment float32[16, 8]
  scratch b: fragment float32[4, 32]
  scratch c: fragment float32[7, 7]
"""


@pytest.mark.parametrize("body,message", [
    ("  gemm() {a=a[0:+16, 0:+8], b=b[0:+4, 0:+32], c=c[0:+7, 0:+7], transpose_a=False, "
     "transpose_b=False}  # user.py:3",
     r"jt.gemm: shapes \(16, 8\) @ \(4, 32\) -> \(7, 7\) do not agree.*user.py:3"),
    ("  %1: float32[16] = load() {src=x[0:+16]}\n"
     "  %2: float32[] = reduce(%1) {axes=(7,), fn='sum'}  # user.py:4",
     r"reduce over axes \(7,\) of a rank-1 value.*user.py:4"),
    ("  %1: float32[16] = load() {src=x[0:+16]}\n"
     "  %2: float32[16, 4] = broadcast(%1) {dims=(1,)}  # user.py:5",
     r"broadcast: operand shape \(16,\) does not fit.*user.py:5"),
    ("  %1: float32[16] = load() {src=x[0:+16]}\n"
     "  %2: float32[16] = elementwise(%1) {fn='frobnicate'}  # user.py:6",
     r"fn='frobnicate' must be an elementwise function name.*user.py:6"),
    ("  %1: float32[16] = load() {src=x[0:+16]}\n"
     "  store(%1) {dst=x[0:+16]}  # user.py:7",
     r"read-only.*user.py:7"),
    ("  %1: float32[8] = load() {src=x[0:+16]}  # user.py:8",
     r"value shape \(8,\) does not match the indexed tile \(16,\).*user.py:8"),
    ("  %1: float32[16] = load() {src=y[0:+16]}  # user.py:9", r"unknown buffer 'y'"),
    ("  %1: float32[16] = load() {src=x[0:+16], pad=0}  # user.py:10",
     r"load has attributes \['pad', 'src'\], expected \['src'\]"),
    ("  %1: float32[16] = frob()  # user.py:11", r"unknown op kind 'frob'"),
    ("  %1: float32[16] = load() {src=x[0:+16]}\n"
     "  %2: float32[16] = elementwise(%1, %1, %1) {fn='add'}", r"elementwise takes 1 or 2 operand"),
    ("  copy() {dst=a[0:+32, 0:+8], pad=None, src=x[0:+32]}",
     r"a tile of 32 does not fit dimension 16 of fragment buffer 'a'"),
])
def test_verifier_rejects_bad_ops_with_the_line(body, message):
    kernel = parser.parse_kernel(_HEADER + body)
    with pytest.raises(KernelError, match=message):
        verify.verify(kernel)


@pytest.mark.parametrize("buffer_line,message", [
    ("  scratch s: texture float32[4]", r"unknown scope 'texture'"),
    ("  scratch s: global float32[4]", r"a scratch cannot live in global memory"),
    ("  temp s: shared float32[4]", r"unknown role 'temp'"),
])
def test_verifier_rejects_bad_buffers(buffer_line, message):
    text = _HEADER + buffer_line + "\n"
    with pytest.raises(KernelError, match=message):
        verify.verify(parser.parse_kernel(text))


def test_verifier_rejects_values_outside_their_scope():
    buf = ir.Buffer("x", (4,), np.dtype(np.float32), "global", "input")
    orphan = ir.Op("elementwise", (ir.Value((4,), np.float32),), ir.Value((4,), np.float32),
                   {"fn": "exp"})
    with pytest.raises(KernelError, match="outside its scope"):
        verify.verify(ir.Kernel("k", (1,), 128, (buf,), (), [orphan]))


_NESTED = """
kernel k(grid=[1], threads=128) blocks(%0):
  input x: global float32[8]
  output y: global float32[8]
  %1: float32[8] = load() {src=x[0:+8]}
  for %2 in serial(0, +2):
    store(%1) {dst=y[0:+8]}
    while:
      %3: bool[] = const() {value=False}
    do %3:
      store(%1) {dst=y[0:+8]}
  %4: bool[] = const() {value=True}
  if %4:
    store(%1) {dst=y[0:+8]}
  else:
    %5: float32[8] = elementwise(%1) {fn='neg'}
    store(%5) {dst=y[0:+8]}
""".strip()


def test_map_ops_rewrites_ops_at_every_depth_and_rebuilds_what_holds_them():
    kernel = parser.parse_kernel(_NESTED)
    seen = []

    def fn(op):
        seen.append(op.kind)
        # Each store is written twice; every other op stays.
        return [op, op] if op.kind == "store" else [op]

    body = ir.map_ops(kernel.body, fn)
    assert seen == ["load", "store", "const", "store", "const", "store", "elementwise",
                    "store"]                          # program order, every block
    doubled = [ln for line in _NESTED.splitlines()
               for ln in ([line, line] if "store(" in line else [line])]
    assert printer.format_kernel(dataclasses.replace(kernel, body=body)) == "\n".join(doubled)
    assert printer.format_kernel(kernel) == _NESTED        # the input is unchanged
    loop = ir.with_blocks(kernel.body[1], [()])
    assert isinstance(loop, ir.For) and loop.body == () and loop.var is kernel.body[1].var
