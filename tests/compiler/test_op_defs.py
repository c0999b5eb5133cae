"""Op definitions: keyword-only fields, the hooks passes ask (scalar evaluation, layout
rules, regions) and the backends' lowering registries."""

import jax
import numpy as np
import pytest
from jax import lax

from jaxtile.compiler import ir, op_defs, parser
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.target import parse_target


def _scalar_op(kind, dtype, n_operands, operand_dtype=None, **attrs):
    operands = tuple(ir.Value((), operand_dtype or dtype) for _ in range(n_operands))
    return ir.Op(kind, operands, ir.Value((), dtype), attrs)


def test_fields_are_keywords_and_hooks_are_checked():
    with pytest.raises(TypeError):
        op_defs.OpDef("x", {}, (0,), True, True, True)
    with pytest.raises(ValueError, match="layout rule 'diagonal'"):
        op_defs.OpDef(kind="x", arity=(1,), has_result=True, pure=True, per_element=True,
                      layout="diagonal")
    with pytest.raises(ValueError, match=r"regions \['dst'\] are not attributes"):
        op_defs.OpDef(kind="x", arity=(1,), has_result=False, pure=False,
                      per_element=False, writes=("dst",))


_CASES = [  # (fn, dtype, operands): edges of XLA's integer semantics
    ("add", np.int8, (100, 100)), ("sub", np.uint8, (3, 5)), ("mul", np.int32, (-7, 6)),
    ("div", np.int32, (-7, 2)), ("div", np.int32, (7, 0)), ("div", np.uint16, (7, 0)),
    ("div", np.int8, (-128, -1)), ("rem", np.int32, (-7, 2)), ("rem", np.int32, (7, 0)),
    ("rem", np.int8, (-128, -1)), ("max", np.int64, (-3, 2)), ("min", np.uint32, (3, 2)),
    ("and", np.int16, (12, 10)), ("or", np.uint8, (12, 10)), ("xor", np.int32, (-1, 5)),
    ("neg", np.int8, (-128,)), ("neg", np.uint8, (1,)), ("abs", np.int16, (-32768,)),
    ("not", np.uint16, (0,)), ("sign", np.int32, (-9,)), ("square", np.int8, (12,)),
]


@pytest.mark.parametrize("fn,dtype,values", _CASES)
def test_scalar_evaluation_matches_xla(fn, dtype, values):
    op = _scalar_op("elementwise", dtype, len(values), fn=fn)
    args = [np.asarray(v, dtype) for v in values]
    with jax.enable_x64(True):
        expected = int(getattr(lax, f"{fn}_p").bind(*args))
    assert op_defs.evaluate(op, values) == expected


def test_scalar_evaluation_of_constants_and_conversions():
    assert op_defs.evaluate(_scalar_op("const", np.int32, 0, value=7), []) == 7
    assert op_defs.evaluate(_scalar_op("const", np.float32, 0, value=7), []) is None
    assert op_defs.evaluate(_scalar_op("const", np.bool_, 0, value=True), []) is None
    assert op_defs.evaluate(_scalar_op("convert", np.int8, 1, np.int32), [300]) == 44
    assert op_defs.evaluate(_scalar_op("convert", np.float32, 1, np.int32), [3]) is None
    assert op_defs.evaluate(_scalar_op("convert", np.int32, 1, np.float32), [3]) is None
    # what the hook cannot tell: floats, comparisons (a bool result), ops without it
    assert op_defs.evaluate(_scalar_op("elementwise", np.float32, 2, fn="add"), [1, 2]) is None
    assert op_defs.evaluate(_scalar_op("elementwise", np.bool_, 2, np.int32, fn="lt"),
                            [1, 2]) is None
    assert op_defs.evaluate(_scalar_op("size", np.int32, 0, expr="n"), []) is None


def test_layout_rules_and_regions_are_stated_by_the_definitions():
    rules = {k: d.layout for k, d in op_defs.OPS.items() if d.layout is not None}
    assert rules == {"elementwise": "same", "convert": "same", "select": "same",
                     "broadcast": "broadcast", "transpose": "transpose", "reduce": "reduce"}
    # read-modify-write regions: an atomic's destination, a GEMM's accumulator
    both = {k: set(d.reads) & set(d.writes) for k, d in op_defs.OPS.items()}
    assert {k: v for k, v in both.items() if v} == {"atomic": {"dst"}, "gemm": {"c"}}


def test_a_registry_rejects_unknown_and_doubly_lowered_kinds():
    lowers = op_defs.Lowerings("test")

    @lowers("reduce", "scan")
    def lower(op):
        return op

    assert lowers.get("reduce") is lower and lowers.get("scan") is lower
    assert lowers.get("gemm") is None and lowers.kinds() == {"reduce", "scan"}
    with pytest.raises(ValueError, match="unknown op kind 'reduction'"):
        lowers("reduction")(lower)
    with pytest.raises(ValueError, match="'scan' is lowered twice"):
        lowers("scan")(lower)
    with pytest.raises(ValueError, match="unknown op kind 'halt'"):
        op_defs.Lowerings("test", {"halt": lower})


def test_dtypes_per_function():
    ew = op_defs.get("elementwise")
    assert ew.accepts("exp") == op_defs.FLOATS
    assert ew.accepts("and") == op_defs.INTEGERS | op_defs.BOOL
    assert np.dtype(np.uint8) not in ew.accepts("abs")
    assert op_defs.get("copy").accepts() == op_defs.DTYPES
    assert op_defs.get("atomic").accepts("add") == op_defs.ATOMIC_DTYPES


def test_a_kind_the_cpu_does_not_lower_is_a_kernel_error():
    from jaxtile.compiler.cpu import lower as cpu_lower

    kernel = parser.parse_kernel("\n".join([
        "kernel k(grid=[1], threads=128) blocks(%0):",
        "  input x: global float32[8]",
        "  output y: global float32[8]",
        "  %1: float32[8] = load() {src=x[0:+8]}",
        "  %2: float32[8] = relayout(%1)  # user.py:3",
        "  store(%2) {dst=y[0:+8]}"]))
    with pytest.raises(KernelError, match=r"relayout is not lowered for the CPU.*user.py:3"):
        cpu_lower.to_tir(kernel, parse_target("cpu"))
