"""Running an emulated CUDA kernel behind jaxtile's CPU FFI handler.

An emulator library exports the same packed ABI as a TVM-built CPU kernel, so it is loaded into
jaxtile's kernel registry by key and runs through the ``jaxtile_cpu_call`` custom call inside
``jax.jit`` (blocks split over the handler's thread pool), or directly on numpy arrays.
This is the runner a ``cuda-emulator`` backend plugs in: specialise -> CUDA source ->
``EmulatedKernel.build`` -> ``ffi_call``.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .build import Buffer, LaunchConfig, Param, build_library


class _KernelSettings(ctypes.Structure):
    """``jaxtile::emu::KernelSettings`` (runtime.h): one per kernel library."""

    _fields_ = [("checks", ctypes.c_int32), ("isolate", ctypes.c_int32),
                ("timeout_s", ctypes.c_double), ("stack_bytes", ctypes.c_uint64),
                ("sink", ctypes.c_void_p)]


# One lock per kernel library: run() takes the report its own launch made.
_RUN_LOCKS: dict[str, threading.Lock] = {}
_RUN_LOCKS_GUARD = threading.Lock()


class EmulatorError(RuntimeError):
    """An emulated kernel failed a check (race, out of bounds, deadlock, misuse).

    ``report`` holds every finding of the launch (see EmulatedKernel.report).
    """

    def __init__(self, message: str, report: dict[str, Any]):
        super().__init__(message)
        self.report = report


@dataclass
class EmulatedKernel:
    """A CUDA kernel compiled for the emulator and loaded into jaxtile's kernel registry."""

    name: str
    library: Path
    params: tuple[Param, ...]
    launch: LaunchConfig
    key: str = field(init=False)
    _lib: ctypes.CDLL = field(init=False, repr=False)

    @classmethod
    def build(
        cls,
        source: str,
        kernel: str,
        params: Sequence[Param],
        launch: LaunchConfig,
        *,
        file: str = "kernel.cu",
    ) -> EmulatedKernel:
        """Compile `source` for the emulator (cached) and load it."""
        library = build_library(source, kernel, params, launch, file=file)
        return cls(kernel, library, tuple(params), launch)

    def __post_init__(self) -> None:
        from jaxtile import _ffi

        self.key = f"emulator:{self.library.stem}"
        # The full entry symbol: looked up by the bare kernel name, a kernel called `div` or
        # `remainder` would bind to the C library's function of that name, which the handler
        # would then call as the kernel.
        _ffi.load_kernel(self.key, str(self.library), f"__tvm_ffi_{self.name}",
                         self.launch.num_blocks, 1)
        # The same file is already open in this process, so this is the same library instance
        # whose kernels jaxtile's handler runs.
        self._lib = ctypes.CDLL(str(self.library))
        self._lib.jaxtile_emu_kernel_report.restype = ctypes.c_size_t
        self._lib.jaxtile_emu_kernel_report.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self._lib.jaxtile_emu_kernel_settings.restype = ctypes.POINTER(_KernelSettings)
        self._settings = self._lib.jaxtile_emu_kernel_settings().contents
        with _RUN_LOCKS_GUARD:
            self._run_lock = _RUN_LOCKS.setdefault(self.key, threading.Lock())

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        """The pointer parameters, in the order arrays are passed."""
        return tuple(p for p in self.params if isinstance(p, Buffer))

    def set_checks(self, on: bool) -> None:
        """Turn the race / uninitialised / cp.async-hazard / bank checks on or off for this
        kernel's launches (every EmulatedKernel of the same compiled library shares them)."""
        self._settings.checks = 1 if on else 0

    def set_timeout(self, seconds: float | None) -> None:
        """The watchdog's limit for one launch, in seconds (0: none; None: from
        ``$JAXTILE_EMULATOR_TIMEOUT``, default 600). A launch past it fails with an
        EmulatorError naming where the threads were."""
        if seconds is None:
            self._settings.timeout_s = -1.0
            return
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                0 <= seconds <= 1e9):
            raise ValueError(f"kernel '{self.name}': the time limit must be a number of "
                             f"seconds between 0 (none) and 1e9, got {seconds!r}")
        self._settings.timeout_s = float(seconds)

    def set_isolate(self, on: bool | None) -> None:
        """Run this kernel's launches in a forked worker process (None: as
        ``$JAXTILE_EMULATOR_ISOLATE`` says, off by default). Faults the emulator cannot
        contain by construction (a raw pointer dereferenced, ``INT_MIN / -1``, an endless loop
        that touches no memory) then fail the launch with an EmulatorError naming the signal,
        thread and line, instead of ending the process. Isolated launches take turns."""
        self._settings.isolate = -1 if on is None else int(bool(on))

    @property
    def stack_bytes(self) -> int:
        """What the kernel's frames need per CUDA thread, as g++ reported them; fiber stacks
        are that plus a reserve, or the default (256 KiB) if larger."""
        return int(self._settings.stack_bytes)

    def report(self) -> dict[str, Any]:
        """This kernel's findings, bank-conflict statistics and counters since its last report
        (then cleared); other kernels' launches keep their own.

        ``{"findings": [{"severity", "count", "message"}], "bank_conflicts": [{"line",
        "instructions", "wavefronts", "ideal_wavefronts"}], "counters": {...}}``
        """
        size = self._lib.jaxtile_emu_kernel_report(None, 0)
        buf = ctypes.create_string_buffer(size + 4096)
        self._lib.jaxtile_emu_kernel_report(buf, len(buf))
        return json.loads(buf.value.decode())

    def run(self, *arrays: np.ndarray) -> dict[str, Any]:
        """Run the whole grid on C-contiguous numpy arrays (outputs written in place).

        Returns the launch's report; raises EmulatorError if a check failed. Launches of
        this kernel through run() take turns, so that each gets its own report.
        """
        from jaxtile import _ffi

        self._check_arrays(arrays)
        with self._run_lock:
            self.report()  # start from a clean slate
            try:
                _ffi.call_kernel(self.key, list(arrays))
            except RuntimeError as e:
                # Drop the registry's "kernel '<key>' failed: RuntimeError:" prefix.
                message = str(e)
                start = message.find("emulated kernel")
                raise EmulatorError(message[start:] if start >= 0 else message,
                                    self.report()) from None
            return self.report()

    def ffi_call(self, out_shapes: Sequence[tuple[tuple[int, ...], Any]], *operands: Any) -> Any:
        """Call the kernel from JAX (inside jit or not): `operands` are the leading buffers,
        `out_shapes` ((shape, dtype) each) the trailing ones. Needs the ``jaxtile_cpu_call``
        target registered with XLA (importing ``jaxtile.primitives`` does it)."""
        import jax

        outs = [jax.ShapeDtypeStruct(s, d) for s, d in out_shapes]
        result = jax.ffi.ffi_call("jaxtile_cpu_call", outs)(*operands, key=self.key)
        return result

    def _check_arrays(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self.buffers):
            raise ValueError(
                f"kernel '{self.name}' takes {len(self.buffers)} buffers, got {len(arrays)}"
            )
        for a, b in zip(arrays, self.buffers):
            if np.dtype(a.dtype) != np.dtype(b.dtype):
                raise ValueError(
                    f"kernel '{self.name}': buffer '{b.name}' must be {np.dtype(b.dtype)}, "
                    f"got {a.dtype}"
                )
