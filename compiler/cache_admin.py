"""Inspecting and pruning an on-disk kernel cache (``jaxtile cache ...``).

An entry is judged by :func:`cache.read_entry`, the checks a lookup makes, so an entry
reported intact here is one a kernel call would load, and a damaged one is one it would
rebuild. Besides entries, the cache directory holds the emulator's builds (``emulator/``:
its runtime and per-kernel libraries); they are counted and cleared with the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from pathlib import Path

from . import cache

_FOLDER = re.compile(r"[0-9a-f]{2}")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
EMULATOR_FOLDER = "emulator"


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One cache entry as found on disk."""

    key: str
    files: tuple[Path, ...]
    """The entry's record and artifact, those that exist."""
    size: int
    """Bytes of those files."""
    mtime: float
    """When the entry was last written (the newest of its files)."""
    kind: str = ""
    symbol: str = ""
    problem: str = ""
    """Why a lookup would not load the entry; empty for an intact one."""


def _entry(root: Path, key: str) -> EntryInfo:
    lib, record = root / key[:2] / f"{key}.so", root / key[:2] / f"{key}.json"
    files = tuple(p for p in (record, lib) if p.exists())
    stats = [p.stat() for p in files]
    size, mtime = sum(s.st_size for s in stats), max(s.st_mtime for s in stats)
    entry = cache.read_entry(root, key)
    if entry is not None:
        return EntryInfo(key, files, size, mtime, entry.kind, entry.symbol)
    if not record.exists():
        problem = "its record (.json) is missing"
    elif not lib.exists():
        problem = "its artifact (.so) is missing"
    else:
        problem = "its record or artifact fails its checksum or format check"
    return EntryInfo(key, files, size, mtime, problem=problem)


def entries(root: Path | None = None) -> list[EntryInfo]:
    """Every entry under ``root`` (default: the cache directory), oldest first, each
    checked as a lookup would check it; an artifact or record without its pair is an
    entry with a problem."""
    root = cache.cache_dir() if root is None else root
    keys: set[str] = set()
    for folder in root.glob("??"):
        if folder.is_dir() and _FOLDER.fullmatch(folder.name):
            keys.update(p.stem for p in folder.iterdir()
                        if p.suffix in (".so", ".json") and not p.name.startswith("."))
    found = [_entry(root, key) for key in sorted(keys)]
    return sorted(found, key=lambda e: e.mtime)


def other_files(root: Path | None = None) -> list[Path]:
    """The emulator's builds under ``root`` (runtime and per-kernel libraries)."""
    root = cache.cache_dir() if root is None else root
    folder = root / EMULATOR_FOLDER
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (or a sum,
    ``1d12h``). Raises ValueError naming the accepted forms."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"bad duration {text!r}: expected a number and a unit s, m, h, d "
                         "or w, e.g. 12h or 7d")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def clear(root: Path | None = None, older_than: float | None = None) -> tuple[int, int]:
    """Delete the entries and emulator builds under ``root`` last written more than
    ``older_than`` seconds ago (all of them when None); returns (files, bytes) removed.
    Files other processes are writing have temporary names and are not touched."""
    root = cache.cache_dir() if root is None else root
    cutoff = None if older_than is None else time.time() - older_than
    doomed: list[Path] = []
    for e in entries(root):
        if cutoff is None or e.mtime < cutoff:
            doomed.extend(e.files)
    for path in other_files(root):
        with contextlib.suppress(OSError):
            if cutoff is None or path.stat().st_mtime < cutoff:
                doomed.append(path)
    removed = size = 0
    for path in doomed:
        with contextlib.suppress(OSError):
            bytes_ = path.stat().st_size
            path.unlink()
            removed += 1
            size += bytes_
    # Entries in this process's memory may point at deleted files.
    cache.clear_memory()
    return removed, size
