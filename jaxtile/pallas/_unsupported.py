"""Names of Pallas' public API that jaxtile does not map: they exist, so that a module
importing them loads, and using one raises ``jt.KernelError`` naming it at the user's line."""

from __future__ import annotations

import importlib
from typing import Any

from jaxtile.compiler.errors import kernel_error, user_line

_WHY = {
    "jax.experimental.pallas": "it belongs to Pallas' TPU or Mosaic GPU backends "
                               "(memory spaces, semaphores, core maps, remote copies), which "
                               "have no jaxtile counterpart",
    "jax.experimental.pallas.triton": "it has no jaxtile counterpart",
}


class _Unsupported:
    """Stands for a Pallas name with no jaxtile meaning; any use is a KernelError."""

    def __init__(self, module: str, name: str):
        self._what = f"{module}.{name}"
        self._why = _WHY[module]

    def _fail(self) -> Exception:
        return kernel_error("pallas", f"{self._what} is not supported by jaxtile.pallas: "
                            f"{self._why} (see docs/pallas.md)", user_line())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._fail()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise self._fail()

    def __getitem__(self, key: Any) -> Any:
        raise self._fail()


def stub(module: str, name: str) -> Any:
    """The stand-in for ``module.name`` if that is a public name of the installed Pallas."""
    if name.startswith("_") or not hasattr(importlib.import_module(module), name):
        raise AttributeError(f"module {module.replace('jax.experimental', 'jaxtile')!r} has "
                             f"no attribute {name!r}")
    return _Unsupported(module, name)
