"""Cap the ISA of the YNNPACK kernels inside XLA:CPU, for comparisons on a narrower ISA.

``--xla_cpu_max_isa=AVX2`` caps the code XLA:CPU generates with LLVM, but not the library
kernels it calls: jaxlib 0.10's XLA:CPU runs dots (and some reductions and elementwise
fusions) through YNNPACK, which picks its kernels from the CPU's own features. On a Zen 4
under ``JAXTILE_CPU_ISA=x86-64-v3`` the "AVX2" XLA matmul therefore ran
``ynn::dot_fp32_5x64x1_1x16x1_avx512`` (``perf``), and the benchmark compared jaxtile's AVX2
code with XLA's AVX-512 code: not what a user on an AVX2 machine sees.

YNNPACK keeps the features it found in a function-local static,
``ynn::get_supported_arch_flags()::flags`` (``ynnpack/base/arch.cc``), a bit set whose low
seven bits are SSE2, SSSE3, SSE4.1, AVX, F16C, AVX2 and FMA3 and whose higher bits are
AVX-512 and AMX. :func:`cap_to_avx2` lets YNNPACK fill it, then clears every bit above FMA3,
so that YNNPACK dispatches as on an AVX2 + FMA machine (``perf`` then shows
``ynn::dot_fp32_6x16x1_1x8x1_fma3``). The static is found through the symbol table of
jaxlib's ``libjax_common.so``; where that fails (another jaxlib, a stripped library, a
layout this module does not recognise) nothing is written and the reason is returned, for the
benchmark's JSON. Only benchmarks use this; it writes into jaxlib's memory and has no place
in the library.
"""

from __future__ import annotations

import ctypes
import os
import struct

FLAGS = "_ZZN3ynn24get_supported_arch_flagsEvE5flags"
GUARD = "_ZGVZN3ynn24get_supported_arch_flagsEvE5flags"
UP_TO_FMA3 = 0x7F   # sse2 | ssse3 | sse41 | avx | f16c | avx2 | fma3
AVX2_FMA3 = 0x60


def _symbol_values(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """The ``st_value`` of each of ``names`` in the ELF64 file's ``.symtab``."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:5] != b"\x7fELF\x02":
            return {}
        (shoff,) = struct.unpack_from("<Q", header, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize)
                    for i in range(shnum)]
        symtab = next((s for s in sections if s[1] == 2), None)   # SHT_SYMTAB
        if symtab is None:
            return {}
        strtab = sections[symtab[6]]
        f.seek(strtab[4])
        strings = f.read(strtab[5])
        f.seek(symtab[4])
        symbols = f.read(symtab[5])
    wanted = {n.encode() for n in names}
    found = {}
    for off in range(0, len(symbols), 24):
        name_off, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", symbols, off)
        name = strings[name_off:strings.index(b"\0", name_off)]
        if name in wanted:
            found[name.decode()] = value
    return found


def _load_base(path: str) -> int | None:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == real and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16)
    return None


def cap_to_avx2() -> str:
    """Make YNNPACK in this process dispatch as on an AVX2 + FMA3 machine. Call after
    ``import jax`` and before compiling what is to be measured. Returns what was done, or
    why nothing was."""
    import jax
    import jax.numpy as jnp
    import jaxlib

    lib = os.path.join(os.path.dirname(jaxlib.__file__), "libjax_common.so")
    if not os.path.exists(lib):
        return f"not capped: no {lib}"
    symbols = _symbol_values(lib, (FLAGS, GUARD))
    base = _load_base(lib)
    if len(symbols) != 2 or base is None:
        return "not capped: YNNPACK's feature flags not found in libjax_common.so"
    # A dot lets YNNPACK fill its flags (its static's guard then reads as set).
    x = jnp.ones((64, 64), jnp.float32)
    jax.jit(jnp.matmul)(x, x).block_until_ready()
    flags = ctypes.c_uint64.from_address(base + symbols[FLAGS])
    guard = ctypes.c_uint8.from_address(base + symbols[GUARD])
    if guard.value == 0 or flags.value & AVX2_FMA3 != AVX2_FMA3:
        return (f"not capped: YNNPACK's flags are {flags.value:#x} (guard {guard.value}), "
                "not the layout this module knows")
    before = flags.value
    flags.value = before & UP_TO_FMA3
    return f"capped: {before:#x} -> {flags.value:#x}"
