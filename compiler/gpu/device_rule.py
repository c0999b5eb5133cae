"""The rule for device code: architecture features only through jaxtile/device.h.

Outside the device header, a `.cu` file may not contain inline assembly, CUDA's warp or
barrier intrinsics, builtin index variables, CUDA memory-space keywords or any other
double-underscore intrinsic: those have no emulator (and later no HIP) implementation, so code
using them would compile for one backend only and escape the emulator's checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RULES = (
    (re.compile(r"\basm\b|\b__asm__\b|\b__asm\b"), "inline assembly"),
    (re.compile(r"\b__shfl\w*"), "a CUDA shuffle intrinsic"),
    (re.compile(r"\b__syncthreads\w*|\b__syncwarp\b"), "a CUDA barrier intrinsic"),
    (re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim|warpSize)\b"),
     "a CUDA builtin variable"),
    (re.compile(r"\b__(?:shared|global|device|constant|managed|launch_bounds)__"),
     "a CUDA keyword (use JT_SHARED / JT_KERNEL / JT_DEVICE / JT_LAUNCH_BOUNDS)"),
    (re.compile(r"\batomic[A-Z]\w*\s*\("), "a CUDA atomic intrinsic"),
    (re.compile(r"\b__[a-z]\w*\s*\("), "an intrinsic"),
)

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')


@dataclass(frozen=True)
class Violation:
    """One forbidden construct: where it is and what it is."""

    line: int
    text: str
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}: {self.text!r}"


def _blank(match: re.Match[str]) -> str:
    # Keep newlines so that line numbers stay right.
    return re.sub(r"[^\n]", " ", match.group(0))


def device_rule_violations(source: str) -> list[Violation]:
    """Every construct of `source` that must go through the device header instead."""
    code = _STRING.sub(_blank, _COMMENT.sub(_blank, source))
    found = []
    for number, line in enumerate(code.splitlines(), start=1):
        for pattern, what in _RULES:
            if m := pattern.search(line):
                found.append(Violation(number, m.group(0).strip(), what))
    return found
