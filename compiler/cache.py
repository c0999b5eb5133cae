"""Content-addressed build cache, in memory and on disk.

An entry is a compiled artifact ``<key>.so`` (a relocatable object or a cubin too keeps that
name) plus
``<key>.json``, its record: the artifact's kind (see :data:`KINDS`), its metadata (entry
symbol, number of blocks, buffer alignment, a cubin's launch configuration, a CPU library's
signature) and checksums, under ``$JAXTILE_CACHE_DIR`` (default ``~/.cache/jaxtile``).
Files are written to a temporary name and renamed into place, so readers never see a
half-written entry and two processes building the same kernel both succeed (the contents
are identical).

Integrity: the record's checksum covers every field of the record, the key included, and
the record holds the artifact's sha256. An entry whose record or artifact is missing,
truncated or altered fails these checks and is a miss, rebuilt and rewritten; so is an
entry that passes them but cannot be loaded (see ``discard``). The checksums detect damage,
not forgery: whoever can write the cache directory can make jaxtile run native code, so the
directory must be as trusted as the Python packages themselves.

Prebuilt entries: kernels compiled ahead of time (``jaxtile prebuild``) into directories of
the same layout, read-only, that a lookup consults after the cache directory: those
``$JAXTILE_PREBUILT_DIR`` names (``os.pathsep``-separated), then the ``prebuilt`` folder of
this package where a build step filled one. Their keys are content keys like any other, so
an entry there is found only for the very kernel, target and compiler version it was built
for; anything else (another ISA, jaxtile version, dtype or shape) misses and is compiled as
without them. A hit there loads the artifact and imports no compiler backend. The host CPU
target, whose key holds its CPU model, finds code prebuilt for an x86-64 level through
:func:`cached` and :func:`find_prebuilt` (``jaxtile/_specialisation.py`` chooses the level).

A cache directory that cannot be written (read-only, full, not a directory) costs the
cache, not the kernel: entries then go to a temporary directory of this process, with one
warning that says why.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path

from .cpu_abi import DATA_ALIGNMENT

FORMAT = 4
"""The record format this jaxtile writes. Format 4 added the kind :data:`CPU_OBJECT`."""
READ_FORMATS = frozenset({3, FORMAT})
"""Record formats a lookup accepts. A format-3 entry's CPU artifact is a shared library, which
the FFI still loads (it tells the two apart by the artifact's ELF header); older formats are a
miss, rebuilt and rewritten in the current one."""

CPU_OBJECT = "cpu-object"
"""A CPU kernel as a relocatable ELF object, which the FFI links into the process itself
(``ffi/cpu/elf_object.h``): no ``ld``, no ``dlopen``."""
CPU_SHARED_LIBRARY = "cpu-shared-library"
"""A CPU kernel as a shared library, opened with ``dlopen``: what format-3 entries hold, and
what machines whose FFI does not link objects (``_ffi.CPU_LINKS_OBJECTS``) still build."""
EMULATOR_LIBRARY = "cuda-emulator-library"
"""CUDA code compiled for the SIMT emulator: a CPU kernel library that needs the emulator
runtime loaded first (``compiler/cuda/emulated.py``)."""
CUDA_CUBIN = "cuda-cubin"
"""A cubin (with its PTX) for the CUDA handler."""
HIP_CODE_OBJECT = "hip-code-object"
"""An AMDGPU code object for the ROCm handler."""
KINDS = frozenset({CPU_OBJECT, CPU_SHARED_LIBRARY, EMULATOR_LIBRARY, CUDA_CUBIN,
                   HIP_CODE_OBJECT})
"""Artifact kinds an entry may hold."""
CPU_KINDS = frozenset({CPU_OBJECT, CPU_SHARED_LIBRARY})
"""Kinds of a CPU kernel, which carry the buffers it was compiled for (its signature)."""
GPU_KINDS = frozenset({CUDA_CUBIN, HIP_CODE_OBJECT})
"""Kinds a GPU handler loads from the call's payload; they carry a launch configuration,
whose grid a kernel with dynamic sizes computes from the shapes of each call."""

STALE_SECONDS = 3600
"""Temporary files older than this were left by a writer that died mid-write."""


class CacheWarning(UserWarning):
    """The kernel cache directory is unusable; kernels still compile and run."""


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What a loader needs besides the artifact's bytes."""

    symbol: str
    """The entry point's symbol in the artifact."""
    num_blocks: int
    """Blocks of the launch grid."""
    alignment: int
    """Byte alignment the code assumes for every buffer's data pointer."""
    launch: str = ""
    """A cubin's or code object's launch configuration (``compiler/gpu/launch.py``'s text
    form); empty for the other kinds."""
    ptx_bytes: int = 0
    """How many bytes at the end of a cubin entry's artifact are the PTX it came from."""
    signature: str = ""
    """A CPU library's: the buffers its kernel was compiled for (``ffi/cpu/signature.h``),
    which the handler checks every call against, since the library checks nothing itself;
    empty for the other kinds, and for a library that checks its arguments itself."""

    def check(self) -> None:
        """Raise ValueError unless every field has a usable type and value."""
        if not isinstance(self.symbol, str) or not self.symbol:
            raise ValueError(f"bad symbol {self.symbol!r}")
        for name in ("num_blocks", "alignment"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"bad {name} {value!r}")
        if self.alignment & (self.alignment - 1):
            raise ValueError(f"alignment {self.alignment} is not a power of two")
        if not isinstance(self.launch, str):
            raise ValueError(f"bad launch {self.launch!r}")
        if type(self.ptx_bytes) is not int or self.ptx_bytes < 0:
            raise ValueError(f"bad ptx_bytes {self.ptx_bytes!r}")
        if not isinstance(self.signature, str) or "\n" in self.signature:
            raise ValueError(f"bad signature {self.signature!r}")


@dataclasses.dataclass(frozen=True)
class Entry:
    """A compiled artifact on disk and what is needed to load it."""

    key: str
    kind: str
    library: str
    """Path of the artifact."""
    meta: Metadata
    sha256: str
    """Hex sha256 of the artifact's bytes when it was compiled."""

    @property
    def symbol(self) -> str:
        return self.meta.symbol

    @property
    def num_blocks(self) -> int:
        return self.meta.num_blocks

    @property
    def alignment(self) -> int:
        return self.meta.alignment

    def launched_with(self, num_blocks: int) -> Entry:
        """The same artifact launched with ``num_blocks`` blocks, under a key of its own:
        how a kernel with dynamic sizes (one artifact, a grid per size) is loaded."""
        return dataclasses.replace(self, key=f"{self.key}@{num_blocks}",
                                   meta=dataclasses.replace(self.meta, num_blocks=num_blocks))

    @property
    def launch(self) -> str:
        return self.meta.launch


def cache_dir() -> Path:
    """The on-disk cache directory (``$JAXTILE_CACHE_DIR`` or ``~/.cache/jaxtile``)."""
    root = os.environ.get("JAXTILE_CACHE_DIR") or os.path.join("~", ".cache", "jaxtile")
    return Path(root).expanduser()


PACKAGE_PREBUILT = Path(__file__).resolve().parent / "prebuilt"
"""Prebuilt entries shipped inside the package, if a build step put any there."""


def prebuilt_dirs() -> list[Path]:
    """The read-only directories of prebuilt entries, in lookup order (see the module doc)."""
    named = os.environ.get("JAXTILE_PREBUILT_DIR", "")
    dirs = [Path(d).expanduser() for d in named.split(os.pathsep) if d]
    return [*dirs, PACKAGE_PREBUILT]


def content_key(*parts: str) -> str:
    """A hex sha256 over the given strings (kernel IR text, target, versions, flags)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


_memory: dict[str, Entry] = {}
_refused: set[str] = set()
"""Keys whose prebuilt entry could not be loaded in this process (see :func:`discard`)."""
_lock = threading.Lock()
_warned = False
_swept: set[Path] = set()
_fallback: Path | None = None


def _paths(root: Path, key: str) -> tuple[Path, Path]:
    folder = root / key[:2]
    return folder / f"{key}.so", folder / f"{key}.json"


def _record_digest(record: dict) -> str:
    """The checksum of a record: sha256 of its canonical JSON without the checksum."""
    fields = {k: v for k, v in record.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _record(key: str, kind: str, meta: Metadata, sha256: str) -> dict:
    record = {"format": FORMAT, "key": key, "kind": kind, "sha256": sha256,
              **dataclasses.asdict(meta)}
    record["checksum"] = _record_digest(record)
    return record


def _read_entry(root: Path, key: str) -> Entry | None:
    lib, meta_path = _paths(root, key)
    try:
        record = json.loads(meta_path.read_text())
        if (not isinstance(record, dict) or record.get("format") not in READ_FORMATS
                or record.get("checksum") != _record_digest(record)
                or record.get("key") != key or record.get("kind") not in KINDS
                or (record["format"] < FORMAT and record["kind"] == CPU_OBJECT)):
            return None
        meta = Metadata(record["symbol"], record["num_blocks"], record["alignment"],
                        record.get("launch", ""), record.get("ptx_bytes", 0),
                        record.get("signature", ""))
        meta.check()
        if hashlib.sha256(lib.read_bytes()).hexdigest() != record["sha256"]:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Entry(key, record["kind"], str(lib), meta, record["sha256"])


_stats = {"stored": 0, "memory_hits": 0, "disk_hits": 0, "prebuilt_hits": 0, "misses": 0}


def stats() -> dict[str, int]:
    """Counts for this process: artifacts compiled and stored, and lookups answered from
    memory, from the cache directory, from a prebuilt directory, or not at all (e.g. to
    check that a call compiled nothing)."""
    return dict(_stats)


def lookup(key: str) -> Entry | None:
    """The entry for ``key`` from memory or a verified disk entry, else None."""
    return find(key)[0]


def find(key: str) -> tuple[Entry | None, str]:
    """:func:`lookup`, and where the entry came from: ``"memory"``, ``"disk"`` (the cache
    directory), ``"prebuilt"`` (:func:`prebuilt_dirs`) or ``"miss"`` (for per-kernel
    statistics)."""
    entry = _memory.get(key)
    if entry is not None:
        _stats["memory_hits"] += 1
        return entry, "memory"
    where = "disk"
    entry = _read_entry(cache_dir(), key)
    if entry is None and key not in _refused:
        where = "prebuilt"
        entry = next((e for root in prebuilt_dirs()
                      if (e := _read_entry(root, key)) is not None), None)
    if entry is None:
        _stats["misses"] += 1
        return None, "miss"
    _memory[key] = entry
    _stats[f"{where}_hits"] += 1
    return entry, where


def cached(key: str) -> bool:
    """Whether :func:`lookup` would find ``key`` (in memory, the cache directory or a
    prebuilt directory), without counting a lookup: to choose between an entry of this
    very target and a prebuilt one of an ISA level before either is loaded."""
    if key in _memory or _read_entry(cache_dir(), key) is not None:
        return True
    return key not in _refused and any(_read_entry(root, key) is not None
                                       for root in prebuilt_dirs())


def find_prebuilt(key: str) -> tuple[Entry | None, str]:
    """The entry for ``key`` from a prebuilt directory only, or from memory where it was
    loaded from one, and where it came from (``"prebuilt"``, ``"memory"`` or ``"miss"``;
    a hit counts as :func:`find`'s do, a miss counts nothing, since the caller then looks
    elsewhere): how the host CPU finds the code prebuilt for its ISA level
    (``Specialisation``). An entry this process compiled for the level is not one: the
    host compiles its own code instead."""
    entry = _memory.get(key)
    if entry is not None:
        if not _is_prebuilt(entry):
            return None, "miss"
        _stats["memory_hits"] += 1
        return entry, "memory"
    if key in _refused:
        return None, "miss"
    entry = next((e for root in prebuilt_dirs() if (e := _read_entry(root, key)) is not None),
                 None)
    if entry is None:
        return None, "miss"
    _memory[key] = entry
    _stats["prebuilt_hits"] += 1
    return entry, "prebuilt"


def read_entry(root: Path, key: str) -> Entry | None:
    """The entry for ``key`` under the cache directory ``root`` if its record and artifact
    pass the checks a lookup makes, else None (for inspecting a cache)."""
    return _read_entry(root, key)


def discard(key: str) -> None:
    """Forget the entry for ``key`` and delete its files: it passed its checks but could
    not be loaded, so the next :func:`lookup` is a miss and the kernel is rebuilt. A
    prebuilt entry's files are left alone (they are read-only data of whoever shipped
    them) and no longer consulted by this process for ``key``; the rebuilt entry, in the
    cache directory, is found first from then on."""
    entry = _memory.pop(key, None)
    prebuilt = entry is not None and _is_prebuilt(entry)
    if prebuilt:
        _refused.add(key)
    paths = [Path(entry.library)] if entry is not None and not prebuilt else []
    lib, meta = _paths(cache_dir(), key)
    for path in [meta, lib, *paths]:
        with contextlib.suppress(OSError):
            path.unlink()


def _is_prebuilt(entry: Entry) -> bool:
    """Whether ``entry`` was read from a prebuilt directory."""
    return any(Path(entry.library).is_relative_to(root) for root in prebuilt_dirs())


def store_record(path: Path, record: dict) -> None:
    """Write ``record`` as JSON to ``path`` (a file under :func:`cache_dir` that is not a
    kernel entry, such as a self-check's verdict or an autotuning record) atomically; a
    directory that cannot be written costs the record only."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, json.dumps(record).encode())


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name and a rename. No ``fsync``: it
    cost 4-20 ms per file, two files per compile, and a cache needs no durability. An entry
    that a crash leaves empty or torn fails the record's checksums on the next lookup and is
    rebuilt (see the module doc)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _sweep(root: Path) -> None:
    """Remove, once per process and directory, temporary files that writers killed
    mid-write left behind (young ones may belong to a live writer and stay)."""
    if root in _swept:
        return
    _swept.add(root)
    cutoff = time.time() - STALE_SECONDS
    with contextlib.suppress(OSError):
        for path in root.glob("*/.*"):
            with contextlib.suppress(OSError):
                if path.is_file() and path.stat().st_mtime < cutoff:
                    path.unlink()


def _write_entry(root: Path, key: str, data: bytes, record: dict) -> Path:
    lib, meta = _paths(root, key)
    lib.parent.mkdir(parents=True, exist_ok=True)
    _sweep(root)
    _write_atomic(lib, data)
    _write_atomic(meta, json.dumps(record).encode())
    return lib


def _fallback_dir() -> Path:
    global _fallback
    if _fallback is None:
        _fallback = Path(tempfile.mkdtemp(prefix="jaxtile-cache-"))
        atexit.register(shutil.rmtree, _fallback, True)
    return _fallback


def _warn_unusable(root: Path, error: OSError) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    why = error.strerror or str(error)
    warnings.warn(
        f"jaxtile: cannot write the kernel cache directory {root} ({why}); compiled kernels "
        f"are kept in a temporary directory for this process only. Set JAXTILE_CACHE_DIR "
        "to a writable directory to keep them.", CacheWarning, stacklevel=4)


def store(key: str, library_bytes: bytes, symbol: str, num_blocks: int, *,
          alignment: int | None = None, kind: str = CPU_SHARED_LIBRARY,
          launch: str = "", ptx_bytes: int = 0, signature: str = "") -> Entry:
    """Write a compiled artifact for ``key`` atomically and return its entry.

    ``alignment`` defaults to what the CPU lowering assumes (``cpu_abi.DATA_ALIGNMENT``);
    ``launch`` is a GPU artifact's launch configuration, required for those kinds only, and
    ``ptx_bytes`` how much of its artifact's end is PTX; ``signature`` a CPU library's
    buffers (see :attr:`Metadata.signature`).
    If the cache directory cannot be written, the entry goes to a temporary directory of
    this process instead, with one :class:`CacheWarning`.
    """
    meta = Metadata(symbol, num_blocks, DATA_ALIGNMENT if alignment is None else alignment,
                    launch, ptx_bytes, signature)
    meta.check()
    if ptx_bytes > len(library_bytes):
        raise ValueError(f"ptx_bytes {ptx_bytes} exceed the artifact's {len(library_bytes)}")
    if kind not in KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}; expected one of {sorted(KINDS)}")
    if signature and kind not in CPU_KINDS:
        raise ValueError("a signature goes with a CPU kernel's artifact only")
    if (kind in GPU_KINDS) != bool(launch):
        raise ValueError("a launch configuration goes with a cubin or a code object, and "
                         "only with them")
    sha256 = hashlib.sha256(library_bytes).hexdigest()
    record = _record(key, kind, meta, sha256)
    root = cache_dir()
    with _lock:
        try:
            lib = _write_entry(root, key, library_bytes, record)
        except OSError as e:
            _warn_unusable(root, e)
            lib = _write_entry(_fallback_dir(), key, library_bytes, record)
    entry = Entry(key, kind, str(lib), meta, sha256)
    _memory[key] = entry
    _stats["stored"] += 1
    return entry


def clear_memory() -> None:
    """Forget in-memory entries (the disk cache stays); used by tests."""
    _memory.clear()
