"""Lane layouts of the MFMA (matrix core) instructions: which matrix entry each lane and
register of a wave holds, for the A and B operands and the C/D accumulators.

Written from AMD's "AMD Instinct MI300 Instruction Set Architecture" reference guide (CDNA3),
its "Matrix Arithmetic Instructions" chapter (the operand and result layouts of the dense
MFMA instructions), for the single-block (no broadcast: CBSZ = ABID = BLGP = 0) f16, bf16,
xf32 and (gfx942) float8 instructions into float32; CDNA2's (gfx90a) layouts are the same.
``tests/compiler/hip/test_hip_mfma.py`` checks every entry against AMD's Matrix Instruction
Calculator, a separate source.

For an ``m x n x k`` instruction (m = n, 16 or 32) each lane holds ``e = k m / 64``
consecutive k-elements of one row of A and of one column of B, and ``m n / 64`` accumulator
registers:

- A (m x k): lane ``l``, element ``i`` (0 <= i < e) is ``A[l % m][e * (l // m) + i]``;
- B (k x n): lane ``l``, element ``i`` is ``B[e * (l // n) + i][l % n]``;
- C/D (m x n): lane ``l``, register ``r`` is ``D[8 (r // 4) + 4 (l // n) + r % 4][l % n]``
  for m = 32 (groups of 4 rows, the two lane halves interleaved) and ``D[4 (l // 16) + r]
  [l % 16]`` for m = 16 (the same formula, since r < 4).

Elements are packed from the low bits up: 16-bit element ``i`` is bits ``16 (i % 2)`` and up
of the lane's operand register ``i // 2``, 8-bit element ``i`` bits ``8 (i % 4)`` of register
``i // 4``; 32-bit (xf32) element ``i`` is register ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..target import MfmaShape

WAVE = 64

_ELEMENT_BITS = {"f16": 16, "bf16": 16, "xf32": 32, "fp8": 8, "bf8": 8}


@dataclass(frozen=True)
class MfmaLayout:
    """The lane layout of one MFMA instruction (see the module docstring)."""

    shape: MfmaShape

    @property
    def elements_per_lane(self) -> int:
        """A's (and B's) elements each lane holds."""
        return self.shape.k * self.shape.m // WAVE

    @property
    def element_bits(self) -> int:
        return _ELEMENT_BITS[self.shape.operand]

    @property
    def operand_registers(self) -> int:
        """32-bit registers each lane passes for A (and for B)."""
        return self.elements_per_lane * self.element_bits // 32

    @property
    def accumulator_registers(self) -> int:
        return self.shape.m * self.shape.n // WAVE

    def _check_lane(self, lane: int) -> None:
        if not 0 <= lane < WAVE:
            raise ValueError(f"lane {lane} is not in 0..{WAVE - 1}")

    def _check_element(self, element: int) -> None:
        if not 0 <= element < self.elements_per_lane:
            raise ValueError(f"element {element} is not in 0..{self.elements_per_lane - 1} "
                             f"for {self.shape.instruction}")

    def a(self, lane: int, element: int) -> tuple[int, int]:
        """The (row, k) of A that ``lane`` holds as its ``element``-th operand value."""
        self._check_lane(lane)
        self._check_element(element)
        m = self.shape.m
        return lane % m, self.elements_per_lane * (lane // m) + element

    def b(self, lane: int, element: int) -> tuple[int, int]:
        """The (k, column) of B that ``lane`` holds as its ``element``-th operand value."""
        self._check_lane(lane)
        self._check_element(element)
        n = self.shape.n
        return self.elements_per_lane * (lane // n) + element, lane % n

    def accumulator(self, lane: int, register: int) -> tuple[int, int]:
        """The (row, column) of C and D that ``lane`` holds in accumulator ``register``."""
        self._check_lane(lane)
        if not 0 <= register < self.accumulator_registers:
            raise ValueError(f"register {register} is not in "
                             f"0..{self.accumulator_registers - 1} for {self.shape.instruction}")
        n = self.shape.n
        return 8 * (register // 4) + 4 * (lane // n) + register % 4, lane % n

    def operand_slot(self, element: int) -> tuple[int, int]:
        """Where a lane keeps its ``element``-th operand value: (register, lowest bit)."""
        self._check_element(element)
        per_register = 32 // self.element_bits
        return element // per_register, self.element_bits * (element % per_register)


def layout(shape: MfmaShape) -> MfmaLayout:
    """The lane layout of ``shape``; only the dense single-block instructions are known."""
    if shape.m != shape.n or shape.m not in (16, 32):
        raise ValueError(f"no lane layout for {shape.instruction}: jaxtile uses the 16x16 and "
                         "32x32 single-block instructions only")
    return MfmaLayout(shape)
