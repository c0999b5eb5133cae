"""Errors raised for bad kernels and bad calls, pointing at the user's source line.

The user's line is the innermost frame that is not jaxtile's own code (:func:`own_code_paths`,
the one list of jaxtile's internal frames, which JAX is also given for the source lines of
traced operations), nor JAX, the standard library or another installed package.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sysconfig
import traceback
from types import TracebackType


class KernelError(Exception):
    """A kernel could not be traced, compiled or called; the message names the kernel,
    the op or argument at fault and, where known, the user's source line."""


class ClampedIndexWarning(UserWarning):
    """A kernel indexes a ref directly at a start that JAX's rule may clamp (a ragged edge):
    that block then reads or writes elements another block owns."""


def _package_dir(name: str) -> str:
    # The folder of the package's __init__.py: an editable install's search path for the
    # jaxtile package also holds the repository root (where primitives/ and compiler/ sit).
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ImportError(f"jaxtile: cannot locate package {name}")
    return os.path.dirname(os.path.abspath(spec.origin))


@functools.cache
def own_code_paths() -> tuple[str, ...]:
    """Path prefixes of jaxtile's internal code: the folders of ``jaxtile.compiler`` and
    ``jaxtile.primitives`` and the modules at the top of the ``jaxtile`` package.

    They are found where Python imports them from, which differs between a source checkout
    (three top-level folders, mapped into the package by pyproject) and an installed wheel
    (one folder), so that no folder name decides what counts as internal. The kernel library
    ``jaxtile.ops`` is left out: it is kernel-body code, and its lines are worth reporting.
    """
    top = _package_dir("jaxtile")
    modules = sorted(os.path.join(top, f) for f in os.listdir(top) if f.endswith(".py"))
    return tuple(_package_dir(f"jaxtile.{sub}") + os.sep
                 for sub in ("compiler", "primitives", "pallas")) + tuple(modules)


@functools.cache
def _library_paths() -> tuple[str, ...]:
    """Path prefixes of code that is neither jaxtile's nor the user's: JAX, jaxlib, the
    standard library and installed packages."""
    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {_package_dir(p) for p in ("jax", "jaxlib")}
    return tuple(os.path.abspath(p) + os.sep for p in paths if p)


@functools.lru_cache(maxsize=4096)
def _is_internal(filename: str) -> bool:
    # Frames carry the paths their modules were imported from, as the packages' specs do.
    if filename.startswith("<"):  # generated code (dataclasses, exec) is nobody's source
        return True
    if filename.startswith(own_code_paths()):
        return True
    # The kernel library is kernel-body code (it ships inside the package, which may be in
    # site-packages): its lines are the ones worth reporting, not those of its private
    # helpers such as the operand checks.
    if filename.startswith(_package_dir("jaxtile.ops") + os.sep):
        return os.path.basename(filename).startswith("_")
    return filename.startswith(_library_paths()) or "site-packages" in filename.split(os.sep)


def user_line(tb: TracebackType | None = None) -> str | None:
    """``file:line`` of the innermost frame outside jaxtile, JAX and installed packages.

    With ``tb``, searches that traceback (innermost first); otherwise the current stack.
    """
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack()
    for frame in reversed(frames):
        if not _is_internal(frame.filename):
            return f"{frame.filename}:{frame.lineno}"
    return None


def kernel_error(kernel: str, message: str, line: str | None = None) -> KernelError:
    """A KernelError whose text reads ``kernel 'name': message (at file:line)``."""
    where = f" (at {line})" if line else ""
    return KernelError(f"jaxtile kernel '{kernel}': {message}{where}")
