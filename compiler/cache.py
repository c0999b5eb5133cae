"""Content-addressed build cache, in memory and on disk.

An entry is a compiled library ``<key>.so`` plus ``<key>.json`` (metadata with the library's
sha256) under ``$JAXTILE_CACHE_DIR`` (default ``~/.cache/jaxtile``). Files are written to a
temporary name and renamed into place, so readers never see a half-written entry and two
processes building the same kernel both succeed (the contents are identical). An entry whose
library is missing, truncated or altered fails its checksum and is rebuilt, never loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Entry:
    """A compiled kernel library on disk and what is needed to load it."""

    key: str
    library: str
    symbol: str
    num_blocks: int


def cache_dir() -> Path:
    """The on-disk cache directory (``$JAXTILE_CACHE_DIR`` or ``~/.cache/jaxtile``)."""
    root = os.environ.get("JAXTILE_CACHE_DIR") or os.path.join("~", ".cache", "jaxtile")
    return Path(root).expanduser()


def content_key(*parts: str) -> str:
    """A hex sha256 over the given strings (kernel IR text, target, versions, flags)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


_memory: dict[str, Entry] = {}


def _paths(key: str) -> tuple[Path, Path]:
    folder = cache_dir() / key[:2]
    return folder / f"{key}.so", folder / f"{key}.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lookup(key: str) -> Entry | None:
    """The entry for ``key`` from memory or a verified disk entry, else None."""
    entry = _memory.get(key)
    if entry is not None:
        return entry
    lib, meta = _paths(key)
    try:
        info = json.loads(meta.read_text())
        if info.get("format") != FORMAT or _sha256(lib) != info["sha256"]:
            return None
        entry = Entry(key, str(lib), info["symbol"], int(info["num_blocks"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _memory[key] = entry
    return entry


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(key: str, library_bytes: bytes, symbol: str, num_blocks: int) -> Entry:
    """Write a compiled library for ``key`` atomically and return its entry."""
    lib, meta = _paths(key)
    lib.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(lib, library_bytes)
    info = {"format": FORMAT, "symbol": symbol, "num_blocks": num_blocks,
            "sha256": hashlib.sha256(library_bytes).hexdigest()}
    _write_atomic(meta, json.dumps(info).encode())
    entry = Entry(key, str(lib), symbol, num_blocks)
    _memory[key] = entry
    return entry


def clear_memory() -> None:
    """Forget in-memory entries (the disk cache stays); used by tests."""
    _memory.clear()
