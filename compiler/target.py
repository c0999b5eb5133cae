"""Target descriptions: what the lowering needs to know about a machine.

Target differences live here, not in ``if arch == ...`` branches across the compiler.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import platform

from .errors import KernelError


@dataclasses.dataclass(frozen=True)
class Target:
    """A compilation target. ``name`` is what users pass (``"cpu"``)."""

    name: str
    kind: str
    features: str
    """A fingerprint of the host's instruction-set features, so that a cache entry built
    on one machine is not loaded on a machine that cannot run it."""
    vector_bits: int
    """Width of the widest SIMD registers (512 with AVX-512, 256 with AVX2, else 128);
    sizes register tiles such as the GEMM's."""

    def describe(self) -> str:
        """A stable text form, part of every content key."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@functools.cache
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _cpu_features() -> str:
    text = f"{platform.machine()}|{_cpu_flags()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cpu_vector_bits() -> int:
    flags = set(_cpu_flags().split())
    if "avx512f" in flags:
        return 512
    return 256 if "avx2" in flags else 128


def get_target(name: str = "cpu") -> Target:
    """The target called ``name``; only ``"cpu"`` (the host) can be compiled for today."""
    if name == "cpu":
        return Target("cpu", "cpu", _cpu_features(), _cpu_vector_bits())
    raise KernelError(f"unknown or not yet supported target {name!r}; supported: 'cpu'")
