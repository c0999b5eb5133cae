"""An LDS bank model for wave64, and the LDS layouts of MFMA operand tiles that it finds free
of bank conflicts.

The model (AMD's Composable Kernel documentation, "Understanding AMD GPU LDS and Bank
Conflicts" (CK Tile conceptual docs), and the ROCm blog "Avoiding LDS Bank Conflicts on AMD
GPUs Using CK-Tile Framework"; the CDNA3 ISA guide's "Data Share Operations" for the 32
banks): LDS has 32 banks of 4 bytes, dword ``a // 4`` in bank ``(a // 4) % 32``, and serves
128 bytes a cycle. A wave's ``ds_read``/``ds_write`` of ``w`` bytes per lane (4, 8 or 16) is
served in phases of ``128 // w`` consecutive lanes (b32: two halves of 32 lanes; b64: four
phases of 16; b128: eight phases of 8). Within a phase, lanes reading the same dword share
it (broadcast); distinct dwords in one bank take one cycle each. So a phase costs as many
cycles as the most distinct dwords any bank is asked for, and an access is conflict-free
when every phase takes one cycle.

Sub-dword reads (``ds_read_u16``: 2 bytes per lane, what ``gemm_mfma`` issues for an operand
stored with k across rows, such as B stored ``[K, N]``) are not in those sources' tables;
the model serves them like ``ds_read_b32``, one bank per lane in phases of 32 lanes, lanes on
one dword sharing it. That is the bank-per-lane limit the 32 banks impose whatever the width,
so it cannot call an access conflict-free that a dword access at the same dwords would not be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .mfma import WAVE, MfmaLayout

BANKS = 32
BANK_BYTES = 4
BYTES_PER_CYCLE = BANKS * BANK_BYTES


def cycles(addresses: Sequence[int], width: int) -> int:
    """LDS cycles a wave's access takes: ``addresses[l]`` is lane ``l``'s byte address (None
    for an inactive lane), each lane reading or writing ``width`` bytes (2, 4, 8 or 16,
    ``width``-aligned)."""
    if width not in (2, 4, 8, 16):
        raise ValueError(f"LDS accesses are 2, 4, 8 or 16 bytes per lane, not {width}")
    if len(addresses) != WAVE:
        raise ValueError(f"a wave has {WAVE} lanes, got {len(addresses)} addresses")
    phase = BYTES_PER_CYCLE // max(width, BANK_BYTES)
    total = 0
    for start in range(0, WAVE, phase):
        dwords_by_bank: dict[int, set[int]] = {}
        for a in addresses[start:start + phase]:
            if a is None:
                continue
            if a % width:
                raise ValueError(f"address {a} is not {width}-byte aligned")
            for d in range(a // BANK_BYTES, (a + width - 1) // BANK_BYTES + 1):
                dwords_by_bank.setdefault(d % BANKS, set()).add(d)
        total += max((len(s) for s in dwords_by_bank.values()), default=0)
    return total


def ideal_cycles(width: int) -> int:
    """The cycles of a conflict-free access of ``width`` bytes per lane by a whole wave."""
    return WAVE * max(width, BANK_BYTES) // BYTES_PER_CYCLE


@dataclass(frozen=True)
class OperandTile:
    """An MFMA operand tile in LDS, stored with its k elements contiguous: A as ``rows x
    depth`` (m-major), B transposed as ``columns x depth`` (n-major), so each lane's
    consecutive k-elements are one vector read. ``row_bytes`` is the stride between rows,
    the data (``depth`` elements) plus padding."""

    depth: int
    element_bytes: int
    row_bytes: int


def operand_tile(mfma: MfmaLayout, depth: int) -> OperandTile:
    """The LDS layout jaxtile gives an A or B tile of ``depth`` k-elements per row for
    ``mfma``: rows padded by one lane read (``elements_per_lane`` elements), which shifts
    each row by that many banks, so the rows a read phase touches fall into distinct banks.
    Conflict-freedom under :func:`cycles` is what the tests check."""
    element_bytes = mfma.element_bits // 8
    read = mfma.elements_per_lane * element_bytes
    return OperandTile(depth, element_bytes, depth * element_bytes + read)


def operand_read_addresses(mfma: MfmaLayout, tile: OperandTile, k0: int,
                           row0: int = 0) -> list[int]:
    """Each lane's LDS byte address when the wave reads its A (or B) operand of one MFMA at
    k-offset ``k0`` and row (column, for B) offset ``row0`` from ``tile``: lane ``l`` reads
    its ``elements_per_lane`` consecutive k-elements of row ``row0 + l % m`` in one access."""
    out = []
    for lane in range(WAVE):
        row, k = mfma.a(lane, 0)  # B's (column, k) pattern is A's (row, k) with n = m
        out.append((row0 + row) * tile.row_bytes + (k0 + k) * tile.element_bytes)
    return out
