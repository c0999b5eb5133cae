"""The CPU backend: Tile IR -> TVM TIR -> LLVM -> a shared library.

Importing this package imports TVM (see ``_tvm_import`` for how that is kept short).
"""

from __future__ import annotations

from jaxtile.compiler.tvm_import import import_tvm

import_tvm()
