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

from jaxtile.compiler import cache
from jaxtile.compiler.cpu_abi import DATA_ALIGNMENT
from jaxtile.compiler.errors import kernel_error
from jaxtile.compiler.target import host_isa

MAGIC = "jaxtile-kernel-payload"
FORMAT = 1

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
def encode(kernel_name: str, entry: cache.Entry) -> str:
    """The payload of a compiled kernel, read from its library in the build cache and
    checked against the checksum recorded when it was compiled."""
    try:
        with open(entry.library, "rb") as f:
            library = f.read()
    except OSError as e:
        raise kernel_error(kernel_name, f"cannot embed the compiled library in an export: {e}"
                           " (was the kernel cache cleared while this process ran?)") from e
    if hashlib.sha256(library).hexdigest() != entry.sha256:
        raise kernel_error(
            kernel_name, f"cannot embed the compiled library in an export: {entry.library} "
            "changed on disk since it was compiled (checksum mismatch), so it is not the code "
            "this process runs. Delete it and run the program again to rebuild it.")
    # Kernel names are Python names, but a generated one could hold anything.
    name = " ".join(kernel_name.split()) or "kernel"
    return pack(key=entry.key, name=name, symbol=entry.symbol, num_blocks=entry.num_blocks,
                alignment=entry.alignment, library=library)
