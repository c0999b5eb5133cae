"""Import TVM for the CPU backend, in about half the time a plain ``import tvm`` takes.

A cold kernel compile pays for importing TVM, so this import is on the critical path of
every first compile. A plain ``import tvm`` spends most of its time on five things that
jaxtile does not need:

1. **The first C++ exception.** TVM's Python import provokes about a hundred C++
   exceptions that it catches itself: looking up an unknown object type (the ``disco``
   runtime, whose library is loaded later), ``Op.get`` probes for ops a backend may not
   define, and registering a TVMScript printer name that is already registered. The first
   exception in a process builds a backtrace, and libbacktrace then indexes the symbols
   and debug info of every loaded library. With jaxlib loaded that is 0.4-0.6 s; the later
   exceptions are cheap. Answering those probes in Python, before they reach C++, means no
   exception is thrown at all (see :func:`_guard_ir_api`).
2. **``tvm.relax``**, the graph-level IR and its pipelines: a placeholder module stands in
   for it during the import and is removed afterwards, so a later ``import tvm.relax`` (or
   ``tvm.relax`` attribute access, which TVMScript's parser does) gets the real package.
3. **The same list of global functions, built again by each of the ``_ffi_api`` modules**
   to pick out their own: it is reused while its length is unchanged.
4. **TVM's device backends** (CUDA, ROCm, Metal, ...: the Python hooks of their code
   generators, loaded by ``tvm.backend`` at the end of ``import tvm``; CUDA's alone imports
   ``meta_schedule``). jaxtile compiles CPU code with LLVM and asks TVM's analyzer about GPU
   bounds; neither needs them. Unless ``$TVM_DEVICE_BACKEND_AUTOLOAD`` is set, the import
   runs as if it were ``0``: about 0.3 s less (0.60 to 0.28 s after ``import jax`` on a
   Zen 4 VM). A program that uses TVM's device backends itself imports ``tvm`` before its
   first jaxtile compile; that import is then left as it is.
5. **``tvm.s_tir``**, the scheduling dialect, which a plain import brings in with its
   device backends or ``tvm.relax`` (``meta_schedule``, ``dlight``: about 0.1 s). Of it
   the CPU pipeline needs one pass, which it looks up by name
   (:mod:`jaxtile.compiler.cpu.tir_passes`); ``import tvm.s_tir`` still works afterwards.

Every shim is removed once ``import tvm`` returns; TVM's state afterwards is the state a plain
import leaves once ``tvm.s_tir`` and the device backends are loaded as well
(tests/compiler/test_tvm_import.py compares the two). If TVM is already imported, nothing is
done.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_imported = False


def import_tvm() -> types.ModuleType:
    """Import TVM (see the module's documentation for what is left out). Safe from
    several threads at once (builds run on compile threads): while one thread imports, the
    module is already in ``sys.modules`` half initialised, so the others wait for it here."""
    global _imported
    if not _imported:
        with _lock:
            if not _imported:
                _import()
                _imported = True
    return sys.modules["tvm"]


def _import() -> None:
    if "tvm" in sys.modules:
        return
    with _guard_ir_api(), _reuse_global_func_names(), _without_device_backends() as left_out:
        with _stand_ins():
            import tvm
    if left_out:
        _load_runtime_extra()

    if isinstance(getattr(tvm, "relax", None), types.ModuleType):
        del tvm.relax
    tvm.__getattr__ = _import_relax_on_first_use


def _import_relax_on_first_use(name: str) -> types.ModuleType:
    if name == "relax":
        return importlib.import_module("tvm.relax")
    raise AttributeError(f"module 'tvm' has no attribute {name!r}")


_AUTOLOAD = "TVM_DEVICE_BACKEND_AUTOLOAD"


@contextmanager
def _without_device_backends() -> Iterator[bool]:
    """``$TVM_DEVICE_BACKEND_AUTOLOAD`` as ``0`` while TVM is imported, where the user has not
    set it (TVM reads it once, at the end of its import); yields whether it did so."""
    if _AUTOLOAD in os.environ:
        yield False
        return
    os.environ[_AUTOLOAD] = "0"
    try:
        yield True
    finally:
        os.environ.pop(_AUTOLOAD, None)


def _load_runtime_extra() -> None:
    """What TVM's backend loading does besides the backends: open ``libtvm_runtime_extra``
    (2 ms), whose registrations make ``tvm.runtime.disco`` importable, where it exists."""
    from pathlib import Path

    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    try:
        _LOADED_LIBS["tvm_runtime_extra"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_extra", extra_lib_paths=[runtime_dir],
            mode="RTLD_LOCAL")
    except (OSError, RuntimeError):  # absent from a runtime-only build, as TVM allows
        pass


@contextmanager
def _stand_ins() -> Iterator[None]:
    """While TVM is imported: an empty module for ``tvm.relax``, and ``None`` for
    ``tvm.runtime.disco``. The latter makes its import fail with an ``ImportError``, which
    TVM treats as it treats the failed type lookup a plain import meets there: either way
    ``tvm.runtime.disco`` is ``None``."""
    stand_ins = {"tvm.relax": types.ModuleType("tvm.relax"), "tvm.runtime.disco": None}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)


@contextmanager
def _guard_ir_api() -> Iterator[None]:
    """Answer, in Python, the ``tvm.ir`` FFI calls that would otherwise throw in C++.

    ``GetOp`` of an unknown op raises a Python ``ValueError`` instead (TVM's callers catch
    any exception), and ``RegisterOpAttr`` of a string attribute whose current value is
    that same string (a TVMScript printer name already registered, which throws when the
    earlier registration had the same priority) is skipped: either way the attribute keeps
    its value. The originals are put back when the import is over.
    """
    import tvm_ffi

    init_ffi_api = tvm_ffi.init_ffi_api
    guarded: list[tuple[types.ModuleType, dict[str, Callable[..., Any]]]] = []

    def init_and_guard(namespace: str, target_module_name: str | None = None) -> None:
        init_ffi_api(namespace, target_module_name)
        if namespace == "ir":
            module = sys.modules[target_module_name or namespace]
            guarded.append((module, {"GetOp": module.GetOp,
                                     "RegisterOpAttr": module.RegisterOpAttr}))
            _install_op_guards(module)

    tvm_ffi.init_ffi_api = init_and_guard
    try:
        yield
    finally:
        tvm_ffi.init_ffi_api = init_ffi_api
        for module, originals in guarded:
            for name, function in originals.items():
                setattr(module, name, function)


def _install_op_guards(api: types.ModuleType) -> None:
    get_op, register_op_attr, list_op_names = api.GetOp, api.RegisterOpAttr, api.ListOpNames
    known: set[str] = set()

    def exists(name: str) -> bool:
        if name not in known:
            # The registry only grows: when its size matches, the set is complete.
            names = list_op_names()
            if len(names) != len(known):
                known.update(str(n) for n in names)
        return name in known

    def guarded_get_op(name: str) -> Any:
        if not exists(name):
            raise ValueError(f"operator {name!r} is not registered")
        return get_op(name)

    def guarded_register_op_attr(op_name: str, key: str, value: Any, level: int) -> Any:
        if isinstance(value, str) and exists(op_name):
            current = api.OpGetAttr(get_op(op_name), key)
            if current is not None and str(current) == value:
                return None
        result = register_op_attr(op_name, key, value, level)
        known.add(op_name)  # registering an attribute creates the op
        return result

    api.GetOp = guarded_get_op
    api.RegisterOpAttr = guarded_register_op_attr


@contextmanager
def _reuse_global_func_names() -> Iterator[None]:
    """Let ``tvm_ffi.init_ffi_api`` reuse the list of global function names while the
    registry's size is unchanged (it only grows during the import)."""
    from tvm_ffi import registry

    list_names = registry.list_global_func_names
    count_names = registry.get_global_func("ffi.FunctionListGlobalNamesFunctor")
    cached: list[str] = []

    def list_names_cached() -> list[str]:
        if count_names()(-1) != len(cached):
            cached[:] = list_names()
        return list(cached)

    registry.list_global_func_names = list_names_cached
    try:
        yield
    finally:
        registry.list_global_func_names = list_names
