"""The CPU backend: Tile IR -> TVM TIR -> LLVM -> a shared library.

Importing this package imports TVM, without its graph-level IR.

``import tvm`` also imports ``tvm.relax`` (the graph-level IR and its pipelines), about a
quarter of TVM's 0.5-1 s import time, and jaxtile never uses it. A cold kernel compile pays
that import, so a placeholder module stands in for ``tvm.relax`` while TVM initialises and is
removed afterwards: a later ``import tvm.relax`` or ``tvm.relax`` attribute access by anyone
gets the real package.
"""

from __future__ import annotations

import importlib
import sys
import types

if "tvm" in sys.modules:
    import tvm
else:
    sys.modules["tvm.relax"] = types.ModuleType("tvm.relax")
    try:
        import tvm
    finally:
        del sys.modules["tvm.relax"]
        if "tvm" in sys.modules and isinstance(getattr(sys.modules["tvm"], "relax", None),
                                               types.ModuleType):
            del sys.modules["tvm"].relax
    # The tirx lowering pipeline refers to tvm.s_tir, which tvm.relax would have imported.
    import tvm.s_tir  # noqa: F401

    def _import_relax_on_first_use(name: str) -> types.ModuleType:
        # Code that reaches for ``tvm.relax`` as an attribute (TVMScript's parser does)
        # still finds it.
        if name == "relax":
            return importlib.import_module("tvm.relax")
        raise AttributeError(f"module 'tvm' has no attribute {name!r}")

    tvm.__getattr__ = _import_relax_on_first_use
