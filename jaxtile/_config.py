"""jaxtile's environment variables, read and checked in one place.

Each variable is declared once, in :data:`VARIABLES`, with its parser, default and meaning;
:func:`get` returns its value. Parsing is strict: a value that does not parse (``"4 "``,
``"maybe"``) is ignored with one warning saying what was expected, and the default applies.
Adding a variable is adding one :class:`Variable`. (``JAXTILE_CACHE_DIR`` is a plain path,
read by the build cache.)
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from typing import Any


class ConfigWarning(UserWarning):
    """An environment variable of jaxtile has a value that is ignored."""


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    parse: Callable[[str], Any]
    """The value of the variable's text; raises ValueError saying what was expected."""
    default: Any
    doc: str


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def boolean(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off``, in any case; nothing else."""
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("expected one of 1, true, yes, on or 0, false, no, off")


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads(text: str) -> int:
    limit = 4 * cpu_count()
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= limit:
        raise ValueError(f"expected a whole number from 1 to {limit} (4 times the "
                         f"{cpu_count()} CPUs available)")
    return int(text)


BACKENDS = {"cpu": "cpu", "cuda-emulator": "cuda:sm_80", "cuda-emulator:sm_90a": "cuda:sm_90a",
            "hip-emulator": "hip:gfx942", "hip-emulator:gfx90a": "hip:gfx90a"}
"""Backends that run kernels on this machine, and the target each compiles for: the CPU, or
CUDA code run in the SIMT emulator (``docs/emulator.md``): Ampere code, or Hopper code
(the sm_90a device primitives) on ``cuda-emulator:sm_90a``; or HIP (AMD, wave64) code run in
the emulator's wave64 mode."""


def _backend(text: str) -> str:
    """A backend name in any case, as the boolean variables are read."""
    if text.lower() not in BACKENDS:
        raise ValueError(f"expected one of {', '.join(BACKENDS)} (in any case)")
    return text.lower()


def _cpu_isa(text: str) -> str:
    """``host`` or an x86-64 ISA level this CPU can run, in any case."""
    from jaxtile.compiler.target import check_isa_level

    check_isa_level(text.lower())
    return text.lower()


def _rocm_archs(text: str) -> tuple[str, ...]:
    """Comma-separated AMD architectures jaxtile supports, in any case; a device's name with
    feature flags (``gfx942:sramecc+:xnack-``) stands for its architecture."""
    from jaxtile.compiler.target import HIP_ARCHS

    archs = tuple(dict.fromkeys(a.strip().lower().split(":")[0] for a in text.split(",")))
    if not all(a in HIP_ARCHS for a in archs):
        raise ValueError(f"expected a comma-separated list of {', '.join(HIP_ARCHS)}")
    return archs


VARIABLES = {v.name: v for v in (
    Variable("JAXTILE_BACKEND", _backend, "cpu",
             "what runs kernels on the CPU platform: cpu (compiled for the CPU), "
             "cuda-emulator (compiled for CUDA sm_80, run in the SIMT emulator), "
             "cuda-emulator:sm_90a (compiled for Hopper, sm_90a, run in the emulator), "
             "hip-emulator (compiled for AMD's gfx942; hip-emulator:gfx90a for gfx90a; run "
             "in the emulator's wave64 mode)"),
    Variable("JAXTILE_CPU_ISA", _cpu_isa, "host",
             "the instruction set CPU kernels are compiled for: host (this CPU's own) or a "
             "narrower x86-64 level it can run, x86-64-v3 (AVX2 + FMA) or x86-64-v4 "
             "(AVX-512), or a named CPU it can run, sapphirerapids (AVX-512 + AMX-BF16), "
             "e.g. to test the code other machines get"),
    Variable("JAXTILE_INTERPRET", boolean, False,
             "run kernels without an explicit interpret= as their reference semantics"),
    Variable("JAXTILE_NUM_THREADS", _threads, None,
             "threads a kernel call's blocks are spread over (default: the CPUs available)"),
    Variable("JAXTILE_KEEP_FREED_MEMORY", boolean, False,
             "opt in to setting glibc's allocator, for the whole process, to keep freed "
             "buffers (up to 32 MiB each, 256 MiB per arena's top) rather than returning them "
             "to the OS (faster repeated large kernel calls, more memory kept; see "
             "docs/design.md)"),
    Variable("JAXTILE_AUTOTUNE", boolean, True,
             "time the candidates of autotuned kernels; off: take the first valid config"),
    Variable("JAXTILE_ROCM_ARCHS", _rocm_archs, None,
             "the AMD architectures (gfx90a, gfx942, comma-separated) a ROCm lowering "
             "compiles a code object for when it has no AMD device to ask or is an export "
             "(default: every one jaxtile supports); a lowering for a present device compiles "
             "for that device alone"),
    Variable("JAXTILE_TUNE_OPS", boolean, False,
             "opt in to tuning the library kernels' (jt.ops) tile sizes at run time for each "
             "call's shapes (timed once per machine); off: their stored tile tables"),
)}

_warned: set[tuple[str, str]] = set()


def cpu_target_name() -> str:
    """The target CPU kernels compile for: ``"cpu"`` (the host), or ``"cpu:<level>"`` as
    ``JAXTILE_CPU_ISA`` narrows it."""
    level = get("JAXTILE_CPU_ISA")
    return "cpu" if level == "host" else f"cpu:{level}"


def get(name: str) -> Any:
    """The value of the variable ``name`` (its default if unset or invalid)."""
    var = VARIABLES[name]
    text = os.environ.get(name)
    if text is None or text == "":
        return var.default
    try:
        return var.parse(text)
    except ValueError as e:
        if (name, text) not in _warned:
            _warned.add((name, text))
            warnings.warn(f"jaxtile: ignoring {name}={text!r}: {e}; using the default "
                          f"({var.doc})", ConfigWarning, stacklevel=2)
        return var.default


def configure_runtime() -> None:
    """Hand the runtime its settings; call before any kernel runs (at import)."""
    from jaxtile import _ffi

    if get("JAXTILE_KEEP_FREED_MEMORY"):
        _ffi.keep_freed_memory()
    threads = get("JAXTILE_NUM_THREADS")
    if threads is not None:
        _ffi.set_num_threads(threads)
