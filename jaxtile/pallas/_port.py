"""Run an unmodified Pallas module through jaxtile: its source with the Pallas imports
replaced by jaxtile's, executed as a new module."""

from __future__ import annotations

import pathlib
import re
import sys
import types

_IMPORTS = (
    (re.compile(r"^from jax\.experimental import pallas as (\w+)$", re.M),
     r"from jaxtile import pallas as \1"),
    (re.compile(r"^from jax\.experimental\.pallas import triton as (\w+)$", re.M),
     r"from jaxtile.pallas import triton as \1"),
)


def port(path: str | pathlib.Path, name: str | None = None) -> types.ModuleType:
    """The Python module at ``path`` with its ``from jax.experimental import pallas as pl``
    and ``from jax.experimental.pallas import triton as plgpu`` lines (any alias) changed
    to ``jaxtile.pallas`` and ``jaxtile.pallas.triton``: the one-line port, without editing
    the file. Raises ValueError if the source imports Pallas in neither form.

    >>> import jax.experimental.pallas, pathlib        # doctest: +SKIP
    >>> ops = pathlib.Path(jax.experimental.pallas.__file__).parent / "ops" / "gpu"
    >>> softmax = port(ops / "softmax.py").softmax
    """
    path = pathlib.Path(path)
    source = path.read_text()
    replaced = 0
    for pattern, new in _IMPORTS:
        source, n = pattern.subn(new, source)
        replaced += n
    if not replaced:
        raise ValueError(f"{path} has no 'from jax.experimental import pallas as ...' or "
                         "'from jax.experimental.pallas import triton as ...' line to port")
    module = types.ModuleType(name or f"jaxtile_ported_{path.stem}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the user's module
    return module
