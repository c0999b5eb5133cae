"""jaxtile's compiler: from a traced kernel body to a compiled, cached kernel library.

``from_jaxpr`` converts the jaxpr of a kernel body into Tile IR (``ir``: buffers, grid, tile
ops, structured loops); ``verify`` checks it and ``passes`` rewrite or check it (coverage,
dead-code elimination, scratch initialisation, fusion); ``target`` describes the machine;
``cpu`` lowers the IR to TVM TIR and builds a shared library; ``cache`` keeps built libraries
in memory and on disk under a content key. ``build`` is the entry point that strings these
together. ``errors`` and ``jax_internals`` serve the whole package: errors that point at the
user's source line, and the one place that reaches into JAX's internals.

This layer knows nothing of JAX primitives or the user API (``jaxtile.primitives`` and
``jaxtile`` sit above it); it is imported as ``jaxtile.compiler``.

Inside it, imports go down the tiers (``docs/design.md``, "Tiers"; checked by
``tests/compiler/test_import_tiers.py``): the core never imports a backend. Where the core
needs a backend's answer, the backend's function is registered here, at the top, before any
module of the package is used: the identity of the CUDA and HIP toolchains (in every GPU target's
content key) and the reader of GPU layout annotations in IR text. Each is registered by name
and its module imported on its first call, so that ``import jaxtile`` and a CPU kernel's
compile or cache hit load no GPU module (``tests/compiler/test_build.py``).
"""

import importlib
from collections.abc import Callable
from typing import Any

from . import parser, target


def _on_first_call(module: str, function: str) -> Callable[..., Any]:
    """``module.function``, with ``module`` (relative to this package) imported when the
    result is first called."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module, __name__), function)(*args, **kwargs)
    call.__qualname__ = f"{module.lstrip('.')}.{function}"
    return call


target.TOOLCHAINS["cuda"] = _on_first_call(".cuda.fingerprint", "toolchain_fingerprint")
target.TOOLCHAINS["hip"] = _on_first_call(".hip.toolchain", "identity")
parser.parse_layout = _on_first_call(".gpu.layout", "parse")
