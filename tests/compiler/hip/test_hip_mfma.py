"""MFMA lane layouts (compiler/hip/mfma.py, written from the CDNA3 ISA guide) against AMD's
Matrix Instruction Calculator's tables (data/mfma_calculator, a different source)."""

import csv
import re
from pathlib import Path

import pytest

from jaxtile.compiler import target
from jaxtile.compiler.hip import mfma

DATA = Path(__file__).parent / "data" / "mfma_calculator"
_CELL = re.compile(r"v(\d+)\{(\d+)\}(?:\.\[(\d+):(\d+)\])?$")


def _table(arch: str, instruction: str, matrix: str) -> dict[tuple[int, int], tuple]:
    """(row, column) -> (register, lane, lowest bit) from the calculator's CSV output."""
    lines = (DATA / f"{arch}.{instruction}.{matrix}.csv").read_text().splitlines()
    rows = list(csv.reader(lines[lines.index("Block 0") + 1:]))
    columns = [int(c) for c in rows[0][1:]]
    out = {}
    for row in rows[1:]:
        for col, cell in zip(columns, row[1:]):
            m = _CELL.match(cell)
            assert m, cell
            out[int(row[0]), col] = (int(m.group(1)), int(m.group(2)), int(m.group(4) or 0))
    return out


def _shapes():
    for gfx, arch in (("gfx90a", "cdna2"), ("gfx942", "cdna3")):
        for shape in target.parse_target(f"hip:{gfx}").caps.mfma:
            yield pytest.param(arch, shape, id=f"{gfx}-{shape.instruction}")


@pytest.mark.parametrize("arch,shape", list(_shapes()))
def test_layouts_match_the_matrix_instruction_calculator(arch, shape):
    lay = mfma.layout(shape)
    a, b = _table(arch, shape.instruction, "A"), _table(arch, shape.instruction, "B")
    assert len(a) == len(b) == shape.m * shape.k == 64 * lay.elements_per_lane
    for lane in range(64):
        for e in range(lay.elements_per_lane):
            reg, bit = lay.operand_slot(e)
            assert a[lay.a(lane, e)] == (reg, lane, bit), (lane, e)
            assert b[lay.b(lane, e)] == (reg, lane, bit), (lane, e)
    for matrix in "CD":
        acc = _table(arch, shape.instruction, matrix)
        assert len(acc) == shape.m * shape.n == 64 * lay.accumulator_registers
        for lane in range(64):
            for r in range(lay.accumulator_registers):
                assert acc[lay.accumulator(lane, r)] == (r, lane, 0), (matrix, lane, r)


def test_register_counts():
    shapes = {s.instruction: s for s in target.parse_target("hip:gfx942").caps.mfma}
    big, small = (mfma.layout(shapes[f"v_mfma_f32_{s}_f16"]) for s in ("32x32x8", "16x16x16"))
    assert (big.operand_registers, big.accumulator_registers) == (2, 16)
    assert (small.operand_registers, small.accumulator_registers) == (2, 4)
    xf32 = mfma.layout(shapes["v_mfma_f32_16x16x8_xf32"])
    assert (xf32.elements_per_lane, xf32.operand_registers) == (2, 2)


def test_out_of_range_lanes_and_shapes_are_errors():
    shape = target.parse_target("hip:gfx942").caps.mfma[0]
    with pytest.raises(ValueError, match="lane 64"):
        mfma.layout(shape).a(64, 0)
    with pytest.raises(ValueError, match="register 16"):
        mfma.layout(shape).accumulator(0, 16)
    odd = target.MfmaShape(4, 4, 4, "f16", "b", "v_mfma_f32_4x4x4_16b_f16")
    with pytest.raises(ValueError, match="4x4x4"):
        mfma.layout(odd)
