"""Errors raised for bad kernels and bad calls, pointing at the user's source line."""

from __future__ import annotations

import os
import traceback
from types import TracebackType

# In a source tree the three layers are top-level folders; installed, they all live in the
# jaxtile/ package folder (which then is the parent of this file's folder).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INTERNAL_DIRS = tuple(
    os.path.join(_PACKAGE_ROOT, d) + os.sep for d in ("jaxtile", "primitives", "compiler")
) + ((_PACKAGE_ROOT + os.sep,) if os.path.basename(_PACKAGE_ROOT) == "jaxtile" else ())


class KernelError(Exception):
    """A kernel could not be traced, compiled or called; the message names the kernel,
    the op or argument at fault and, where known, the user's source line."""


def _is_internal(filename: str) -> bool:
    if filename.startswith("<"):  # generated code (dataclasses, exec) is nobody's source
        return True
    # The kernel library is kernel-body code: its lines are the ones worth reporting (those
    # of the op, not of its private helpers such as the operand checks).
    ops = f"{os.sep}jaxtile{os.sep}ops{os.sep}"
    if ops in filename:
        return filename.rsplit(ops, 1)[1].startswith("_")
    if filename.startswith(_INTERNAL_DIRS):
        return True
    parts = filename.replace("\\", "/").split("/")
    return "site-packages" in parts or "/jax/" in filename or "/jaxlib/" in filename


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
