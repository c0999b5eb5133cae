"""The payload an exported kernel call carries: its compiled library, versioned and checksummed.

``jax.export`` lowers a kernel call to the custom call ``jaxtile_cpu_exported_call`` with two
string attributes, ``key`` and ``payload``, so that the exported program runs in a process
that never compiled (or cached) the kernel. The C++ handler decodes and verifies the payload
on the first call there (``ffi/common/payload.cc``, which documents the same format). Format 3 is
text: a header of ``field=value`` lines, then the library in base64::

    jaxtile-kernel-payload
    format=3
    jaxtile=<version of the writer>
    key=<content key>
    name=<kernel name>
    symbol=<function symbol>
    num_blocks=<int>
    alignment=<bytes>
    arch=<platform.machine()>
    isa=<comma-separated /proc/cpuinfo flags the code may use>
    signature=<the buffers the kernel was compiled for>
    size=<library bytes>
    sha256=<hex digest of every byte above, then of the library>
    <base64 library>

In format 3 the library is a relocatable ELF object (cache kind ``cpu-object``), which the
handler links in process (``ffi/cpu/elf_object.h``). Format 2 has the same header and a shared
library, opened with ``dlopen``: it is still read, and still written for a kernel whose cache
entry is a shared library (an entry of cache format 3, or a machine whose FFI does not link
objects). ``signature`` (``compiler/cpu/lower.py``'s ``entry_signature``,
``ffi/cpu/signature.h``) is what the handler checks every call's buffers against: the library
is built without TVM's entry assertions. Format 1 lacks it; its libraries check their
arguments themselves, and they are still read.

The first three lines keep their meaning in every format, so that an older jaxtile can say
which version a newer payload needs, and so does the last header line: the checksum, which
the reader verifies first (a damaged ``format`` digit is damage, not a newer format).

A CUDA kernel's call (``jaxtile_cuda_call``, :func:`encode_cuda`) always carries its payload
(format 1, :data:`CUDA_FORMAT`), under jit as under export, so that a
persistent-compilation-cache hit needs no compiler either. Its fields after the first
three lines are ``platform=cuda``, ``key``, ``name``, ``symbol`` (the kernel's name in the
cubin), ``arch`` (``sm_80``...), ``launch`` (grid, block, dynamic shared memory and
parameters: ``compiler/gpu/launch.py``), ``ptx_size``, ``size`` and ``sha256``, then in
base64 the cubin followed by the PTX it was assembled from (``ptx_size`` bytes, possibly
none), which the driver compiles on a GPU the cubin does not run on
(``decode_cuda_payload`` in ``payload.cc``).

A ROCm kernel's call (``jaxtile_rocm_call``, :func:`encode_hip`) likewise always carries its
payload, in format 2 (:data:`HIP_FORMAT`; format 1's single code object is no longer read):
``platform=rocm``, ``key``, ``name``, ``code_objects`` (their count), then for each code
object ``arch`` (``gfx90a``, ``gfx942``: it runs on that architecture only), ``symbol``,
``launch`` (the same text as a cubin's) and ``size``, then ``sha256`` and in base64 the code
objects one after another. An export carries one per architecture, since it cannot know the
GPU it will meet; the ROCm handler loads the one for the device's architecture with
``hipModuleLoadData`` (``decode_hip_payload`` in ``payload.cc``).

Only the library that was compiled is ever embedded: :func:`encode` checks the bytes it reads
from the cache against the checksum recorded when the kernel was compiled. Bump ``FORMAT``
(and ``kPayloadFormat`` in ``ffi/common/payload.h``) whenever the format changes,
``CUDA_FORMAT`` (``kCudaPayloadFormat``) when the CUDA payload's does and ``HIP_FORMAT``
(``kHipPayloadFormat``) when the ROCm payload's does.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import importlib.metadata
import platform
from collections.abc import Iterable, Sequence

from jaxtile.compiler import cache
from jaxtile.compiler.cpu_abi import DATA_ALIGNMENT
from jaxtile.compiler.errors import kernel_error
from jaxtile.compiler.target import host_isa

MAGIC = "jaxtile-kernel-payload"
FORMAT = 3
SHARED_LIBRARY_FORMAT = 2
"""The newest format whose library is a shared library (see the module doc)."""
CUDA_FORMAT = 1
HIP_FORMAT = 2

def _version() -> str:
    try:
        return importlib.metadata.version("jaxtile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def pack(*, key: str, name: str, symbol: str, num_blocks: int, library: bytes,
         signature: str = "", alignment: int = DATA_ALIGNMENT, arch: str | None = None,
         isa: tuple[str, ...] | None = None,
         format: int = FORMAT, version: str | None = None) -> str:
    """The payload text for a library (a relocatable object from format 3 on, a shared
    library before); the keyword defaults describe this machine and jaxtile.

    ``signature`` (required from format 2 on) is the buffers the library's kernel was
    compiled for. ``format`` and ``version`` exist so that tests can write what another
    jaxtile would.
    """
    fields = {
        "format": format, "jaxtile": version or _version(), "key": key, "name": name,
        "symbol": symbol, "num_blocks": num_blocks, "alignment": alignment,
        "arch": platform.machine() if arch is None else arch,
        "isa": ",".join(host_isa() if isa is None else isa),
    }
    if format >= 2:
        if not signature:
            raise ValueError("a CPU payload of format 2 or later needs the kernel's signature")
        fields["signature"] = signature
    fields["size"] = len(library)
    return _seal(fields.items(), library)


def _seal(fields: Iterable[tuple[str, object]], artifact: bytes) -> str:
    """The header lines of ``fields`` (in order; a field may repeat), the checksum over them
    and ``artifact``, then it."""
    lines = [MAGIC] + [f"{field}={value}" for field, value in fields]
    for line in lines:
        if "\n" in line or "\r" in line:
            raise ValueError(f"payload field {line!r} must not contain a line break")
    header = "".join(line + "\n" for line in lines).encode()
    digest = hashlib.sha256(header + artifact).hexdigest()
    return f"{header.decode()}sha256={digest}\n{base64.b64encode(artifact).decode()}"


def pack_cuda(*, key: str, name: str, symbol: str, arch: str, launch: str, cubin: bytes,
              ptx: bytes = b"", version: str | None = None) -> str:
    """The payload text of a CUDA kernel call: its cubin (and PTX) and how to launch it."""
    fields = {"format": CUDA_FORMAT, "jaxtile": version or _version(), "platform": "cuda",
              "key": key, "name": name, "symbol": symbol, "arch": arch, "launch": launch,
              "ptx_size": len(ptx), "size": len(cubin) + len(ptx)}
    return _seal(fields.items(), cubin + ptx)


@dataclasses.dataclass(frozen=True)
class HipCode:
    """One code object of a ROCm payload."""

    arch: str
    """``gfx90a``, ``gfx942``: the architecture it runs on."""
    symbol: str
    launch: str
    code_object: bytes


def pack_hip(*, key: str, name: str, code: Sequence[HipCode], version: str | None = None,
             format: int = HIP_FORMAT) -> str:
    """The payload text of a ROCm kernel call: a code object per architecture and how to
    launch each. ``format`` exists so that tests can write what another jaxtile would."""
    fields: list[tuple[str, object]] = [
        ("format", format), ("jaxtile", version or _version()), ("platform", "rocm"),
        ("key", key), ("name", name), ("code_objects", len(code))]
    for c in code:
        fields += [("arch", c.arch), ("symbol", c.symbol), ("launch", c.launch),
                   ("size", len(c.code_object))]
    return _seal(fields, b"".join(c.code_object for c in code))


def unpack(text: str) -> tuple[dict[str, str], bytes]:
    """The header fields and the artifact of a payload, checksum verified (ValueError if
    it does not match); for tests and tools (the handlers decode in C++)."""
    header, _, rest = text.partition("\nsha256=")
    digest, _, blob = rest.partition("\n")
    artifact = base64.b64decode(blob, validate=True)
    if hashlib.sha256((header + "\n").encode() + artifact).hexdigest() != digest:
        raise ValueError("payload checksum mismatch")
    lines = header.split("\n")
    if lines[0] != MAGIC:
        raise ValueError("not a jaxtile kernel payload")
    return dict(line.split("=", 1) for line in lines[1:]), artifact


@functools.lru_cache(maxsize=64)
def encode(kernel_name: str, entry: cache.Entry, isa: tuple[str, ...]) -> str:
    """The payload of a compiled kernel, read from its library in the build cache and
    checked against the checksum recorded when it was compiled; ``isa``: the extensions it
    was compiled for (its target's), which the machine that loads it must have."""
    library = _read_checked(kernel_name, entry)
    fmt = FORMAT if entry.kind == cache.CPU_OBJECT else SHARED_LIBRARY_FORMAT
    return pack(key=entry.key, name=_one_line(kernel_name), symbol=entry.symbol,
                num_blocks=entry.num_blocks, alignment=entry.alignment, isa=isa,
                signature=entry.meta.signature, library=library, format=fmt)


def _one_line(kernel_name: str) -> str:
    # Kernel names are Python names, but a generated one could hold anything.
    return " ".join(kernel_name.split()) or "kernel"


def _read_checked(kernel_name: str, entry: cache.Entry) -> bytes:
    try:
        with open(entry.library, "rb") as f:
            data = f.read()
    except OSError as e:
        raise kernel_error(kernel_name, f"cannot embed the compiled code in the program: {e}"
                           " (was the kernel cache cleared while this process ran?)") from e
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise kernel_error(
            kernel_name, f"cannot embed the compiled code in the program: {entry.library} "
            "changed on disk since it was compiled (checksum mismatch), so it is not the code "
            "this process runs. Delete it and run the program again to rebuild it.")
    return data


@functools.lru_cache(maxsize=64)
def encode_cuda(kernel_name: str, entry: cache.Entry, arch: str) -> str:
    """The payload of a kernel compiled to a cubin for ``arch``, read from the build cache
    and checked against the checksum recorded when it was compiled."""
    artifact = _read_checked(kernel_name, entry)
    split = len(artifact) - entry.meta.ptx_bytes
    return pack_cuda(key=entry.key, name=_one_line(kernel_name), symbol=entry.symbol,
                     arch=arch, launch=entry.launch, cubin=artifact[:split],
                     ptx=artifact[split:])


@functools.lru_cache(maxsize=64)
def encode_hip(kernel_name: str,
               entries: tuple[tuple[str, cache.Entry], ...]) -> tuple[str, str]:
    """The call's key and payload for a kernel compiled to a code object for each ``(arch,
    entry)``, read from the build cache and checked against the checksums recorded when they
    were compiled. The key is the one entry's, or a digest of all of theirs."""
    code = [HipCode(arch, entry.symbol, entry.launch, _read_checked(kernel_name, entry))
            for arch, entry in entries]
    keys = [entry.key for _, entry in entries]
    key = keys[0] if len(keys) == 1 else hashlib.sha256(",".join(keys).encode()).hexdigest()
    return key, pack_hip(key=key, name=_one_line(kernel_name), code=code)
