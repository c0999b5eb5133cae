"""The payload an exported kernel call carries: its compiled library, versioned and checksummed.

``jax.export`` lowers a kernel call to the custom call ``jaxtile_cpu_exported_call`` with two
string attributes, ``key`` and ``payload``, so that the exported program runs in a process
that never compiled (or cached) the kernel. The C++ handler decodes and verifies the payload
on the first call there (``ffi/common/payload.cc``, which documents the same format). Format 1 is
text: a header of ``field=value`` lines, then the library in base64::

    jaxtile-kernel-payload
    format=1
    jaxtile=<version of the writer>
    key=<content key>
    name=<kernel name>
    symbol=<function symbol>
    num_blocks=<int>
    alignment=<bytes>
    arch=<platform.machine()>
    isa=<comma-separated /proc/cpuinfo flags the code may use>
    size=<library bytes>
    sha256=<hex digest of every byte above, then of the library>
    <base64 library>

The first three lines keep their meaning in every format, so that an older jaxtile can say
which version a newer payload needs, and so does the last header line: the checksum, which
the reader verifies first (a damaged ``format`` digit is damage, not a newer format).

Only the library that was compiled is ever embedded: :func:`encode` checks the bytes it reads
from the cache against the checksum recorded when the kernel was compiled. Bump ``FORMAT``
(and ``kPayloadFormat`` in ``ffi/common/payload.h``) whenever the format changes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import platform

from jaxtile.compiler.cpu_abi import DATA_ALIGNMENT
from jaxtile.compiler.errors import kernel_error

from .kernel_call import KernelHandle

MAGIC = "jaxtile-kernel-payload"
FORMAT = 1

# Instruction-set extensions, as /proc/cpuinfo names them, that compiled code may use. A
# kernel is compiled for the host CPU (LLVM's -mcpu), so a machine lacking one of the
# exporting host's extensions could die on an illegal instruction; the loader refuses such a
# payload instead. Flags outside this list (e.g. "hypervisor") say nothing about code.
_ISA_FLAGS = frozenset("""
    sse sse2 pni ssse3 sse4_1 sse4_2 sse4a popcnt abm movbe cx16 lahf_lm f16c fma fma4 xop
    avx avx2 bmi1 bmi2 adx aes pclmulqdq vpclmulqdq vaes gfni sha_ni avx_vnni avx_vnni_int8
    avx_ifma avx512f avx512cd avx512bw avx512dq avx512vl avx512ifma avx512vbmi avx512_vbmi2
    avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16 avx512_fp16 amx_tile amx_bf16
    amx_int8
    fp asimd fphp asimdhp asimdrdm asimddp asimdfhm atomics crc32 pmull sha1 sha2 sha3 sha512
    sve sve2 svebf16 svei8mm svef32mm svef64mm bf16 i8mm sme sme2 fcma jscvt lrcpc ilrcpc
""".split())


@functools.cache
def host_isa() -> tuple[str, ...]:
    """The instruction-set extensions of this machine's CPU that compiled code may use."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return tuple(sorted(_ISA_FLAGS.intersection(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return ()


def _version() -> str:
    try:
        return importlib.metadata.version("jaxtile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def pack(*, key: str, name: str, symbol: str, num_blocks: int, library: bytes,
         alignment: int = DATA_ALIGNMENT, arch: str | None = None,
         isa: tuple[str, ...] | None = None,
         format: int = FORMAT, version: str | None = None) -> str:
    """The payload text for a library; the keyword defaults describe this machine and jaxtile.

    ``format`` and ``version`` exist so that tests can write what another jaxtile would.
    """
    fields = {
        "format": format, "jaxtile": version or _version(), "key": key, "name": name,
        "symbol": symbol, "num_blocks": num_blocks, "alignment": alignment,
        "arch": platform.machine() if arch is None else arch,
        "isa": ",".join(host_isa() if isa is None else isa), "size": len(library),
    }
    lines = [MAGIC] + [f"{field}={value}" for field, value in fields.items()]
    for line in lines:
        if "\n" in line or "\r" in line:
            raise ValueError(f"payload field {line!r} must not contain a line break")
    header = "".join(line + "\n" for line in lines).encode()
    digest = hashlib.sha256(header + library).hexdigest()
    return f"{header.decode()}sha256={digest}\n{base64.b64encode(library).decode()}"


@functools.lru_cache(maxsize=64)
def encode(kernel: KernelHandle) -> str:
    """The payload of a loaded kernel, read from its library in the build cache and checked
    against the checksum recorded when it was compiled."""
    entry = kernel.entry
    try:
        with open(entry.library, "rb") as f:
            library = f.read()
    except OSError as e:
        raise kernel_error(kernel.name, f"cannot embed the compiled library in an export: {e}"
                           " (was the kernel cache cleared while this process ran?)") from e
    if hashlib.sha256(library).hexdigest() != entry.sha256:
        raise kernel_error(
            kernel.name, f"cannot embed the compiled library in an export: {entry.library} "
            "changed on disk since it was compiled (checksum mismatch), so it is not the code "
            "this process runs. Delete it and run the program again to rebuild it.")
    # Kernel names are Python names, but a generated one could hold anything.
    name = " ".join(kernel.name.split()) or "kernel"
    return pack(key=kernel.key, name=name, symbol=entry.symbol, num_blocks=entry.num_blocks,
                alignment=entry.alignment, library=library)
