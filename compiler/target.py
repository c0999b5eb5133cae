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

    def describe(self) -> str:
        """A stable text form, part of every content key."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@functools.cache
def _cpu_features() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    text = f"{platform.machine()}|{flags}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def get_target(name: str = "cpu") -> Target:
    """The target called ``name``; only ``"cpu"`` (the host) can be compiled for today."""
    if name == "cpu":
        return Target("cpu", "cpu", _cpu_features())
    raise KernelError(f"unknown or not yet supported target {name!r}; supported: 'cpu'")
