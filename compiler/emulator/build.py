"""Building a CUDA source against the emulator's device header into a CPU kernel library.

The `.cu` text that nvcc compiles is compiled by the machine's C++ compiler with
``-DJAXTILE_EMULATOR``; a small generated launch shim maps jaxtile's CPU kernel ABI (the tvm-ffi
packed call ``(block_begin, block_end, DLTensor*...)``) onto the CUDA kernel's parameters with
the launch geometry baked in. The emulator runtime (``ffi/emulator/src``) is compiled once per
runtime version into a shared library in the cache directory, next to the kernel libraries
that link to it; a kernel library then runs behind jaxtile's CPU FFI handler.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import compile_log
from ..cache import cache_dir


def _ffi_dir() -> Path:
    # In a checkout the C++ lives in ffi/ beside compiler/; an installed wheel carries the
    # device header and the emulator sources in jaxtile/ffi/ (see CMakeLists.txt).
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "ffi", here.parents[1] / "ffi"):
        if (candidate / "device" / "jaxtile" / "device.h").exists():
            return candidate
    return here.parents[2] / "ffi"


_FFI_DIR = _ffi_dir()
DEVICE_INCLUDE = _FFI_DIR / "device"
EMULATOR_INCLUDE = _FFI_DIR / "emulator" / "include"
RUNTIME_SOURCES = _FFI_DIR / "emulator" / "src"

# -Wno-unknown-pragmas: device code's `#pragma unroll` is for nvcc.
_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wno-unknown-pragmas",
          "-DJAXTILE_EMULATOR")
# For the device source only, so that its faults are contained by construction (the fault
# guards below handle what these call): line tables, so that a call named by its return
# address has a line (-g1); each frame's size, so that fiber stacks fit the kernel's frames
# (-fstack-usage); a check before every integer division by zero, which would trap
# (-fsanitize=integer-divide-by-zero); a stack check on entry to each device function, which
# turns deep recursion into a report before the guard page (-finstrument-functions, not for
# the headers' functions, which do not recurse).
_DEVICE_FLAGS = ("-g1", "-fstack-usage", "-fsanitize=integer-divide-by-zero",
                 "-finstrument-functions")
# The runtime exports what kernels call; its internals stay out of the way of interposition.
_RUNTIME_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fno-semantic-interposition",
                  "-DJAXTILE_EMULATOR")

# numpy dtype -> the C++ element type device code declares for it.
_CTYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "::jaxtile::half",
    "bfloat16": "::jaxtile::bf16",
    "float8_e4m3fn": "::jaxtile::fp8e4m3",
    "float8_e5m2": "::jaxtile::fp8e5m2",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "uint16": "uint16_t",
    "int32": "int",
    "uint32": "unsigned",
    "int64": "int64_t",
    "uint64": "uint64_t",
}


class ToolchainError(RuntimeError):
    """A compiler is missing or rejected the source; the message says which and why."""


@dataclass(frozen=True)
class Buffer:
    """A pointer parameter of the kernel, bound to the next XLA operand or result."""

    name: str
    dtype: str

    @property
    def ctype(self) -> str:
        """The C++ element type device code sees for this buffer."""
        try:
            return _CTYPES[np.dtype(self.dtype).name]
        except (KeyError, TypeError):
            raise ToolchainError(
                f"buffer '{self.name}': dtype {self.dtype!r} has no device element type"
            ) from None

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Scalar:
    """A scalar parameter of the kernel, baked into the launch shim as a constant."""

    name: str
    value: int | float


@dataclass(frozen=True)
class Size:
    """An int parameter of the kernel read at launch from a dimension of a buffer parameter
    (a dynamic size): ``dim`` of the ``buffer``-th buffer."""

    name: str
    buffer: int
    dim: int

    @property
    def c_value(self) -> str:
        """Its value in the launch shim (whose buffers are the regions ``b``)."""
        return f"static_cast<int>(b[{self.buffer}].shape[{self.dim}])"


@dataclass(frozen=True)
class TensorMapParam:
    """A TMA tensor map parameter (``JT_TENSOR_MAP``) that the launch shim builds at each
    launch from the ``buffer``-th buffer's address and shape (row-major, ``elem_bytes`` per
    element): the emulator's ``TensorMap`` (runtime.h), copying boxes of ``box`` elements
    (innermost dimension first) with ``swizzle`` bytes (0, 32, 64 or 128)."""

    name: str
    buffer: int
    elem_bytes: int
    box: tuple[int, ...]
    swizzle: int = 0

    def c_build(self, var: str) -> list[str]:
        """Statements of the launch shim that fill ``var`` (a TensorMap) from the buffer
        regions ``b``."""
        rank, b = len(self.box), f"b[{self.buffer}]"
        lines = [f"alignas(64) ::jaxtile::emu::TensorMap {var}{{}};",
                 f"{var}.magic = ::jaxtile::emu::kTensorMapMagic;",
                 f"{var}.buffer = {self.buffer}u;",
                 f"{var}.rank = {rank}u;",
                 f"{var}.elem_bytes = {self.elem_bytes}u;",
                 f"{var}.swizzle = {self.swizzle}u;"]
        for d, extent in enumerate(self.box):
            lines.append(f"{var}.box[{d}] = {extent}u;")
            lines.append(f"{var}.dims[{d}] = static_cast<uint64_t>({b}.shape[{rank - 1 - d}]);")
        for d in range(1, rank):
            prev = f"{self.elem_bytes}u" if d == 1 else f"{var}.strides[{d - 2}]"
            lines.append(f"{var}.strides[{d - 1}] = {prev} * {var}.dims[{d - 1}];")
        return lines


Param = Buffer | Scalar | Size | TensorMapParam


@dataclass(frozen=True)
class LaunchConfig:
    """Grid and block extents (x, y, z) and dynamic shared memory, following CUDA's rules."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int = 0
    grid_of: str = ""
    """For a grid that depends on dynamic sizes: C text of its x extent over the launch
    shim's buffer regions ``b`` (see :attr:`Size.c_value`); ``grid`` is then ignored."""
    warp_size: int = 32
    """Lanes per warp: 32 (CUDA), or 64 for HIP text run in the emulator's wave64 mode
    (compiled with ``-DJAXTILE_WAVE64``, so that the device header has AMD's contract)."""

    @property
    def mode_flags(self) -> tuple[str, ...]:
        """The compiler flags of the device header's mode for this warp size."""
        if self.warp_size not in (32, 64):
            raise ToolchainError(f"the emulator runs warps of 32 or 64 lanes, not "
                                 f"{self.warp_size}")
        return ("-DJAXTILE_WAVE64",) if self.warp_size == 64 else ()

    @property
    def num_blocks(self) -> int:
        """Blocks in the grid."""
        return self.grid[0] * self.grid[1] * self.grid[2]


def cxx_compiler() -> str:
    """The C++ compiler to use: ``$CXX`` or g++ / c++ / clang++ from PATH.

    Raises ToolchainError saying what to install when there is none.
    """
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else []
    candidates += ["g++", "c++", "clang++"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise ToolchainError(
        "the CUDA emulator needs a C++17 compiler and none was found (tried $CXX, g++, c++, "
        "clang++): install one, e.g. `apt-get install g++` on Debian/Ubuntu, or set CXX"
    )


def _tvm_ffi_include() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or spec.origin is None:
        raise ToolchainError("the emulator runtime needs the apache-tvm-ffi headers (tvm_ffi)")
    return Path(spec.origin).parent / "include"


def _run(cmd: Sequence[str], what: str) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed ({' '.join(cmd[:1])}):\n{proc.stderr.strip()}")


def _compiler_version(cxx: str) -> str:
    proc = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.stdout else cxx


def _hash_files(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def device_headers(root: Path | None = None, leave_out: Collection[str] = ()) -> list[Path]:
    """The device header's files (under ``root``, :data:`DEVICE_INCLUDE` by default), sorted,
    without those named in ``leave_out`` (a vendor's implementation that another never
    reads). Every compile of generated code keys its cache on these (emulator, CUDA
    fingerprint, HIP toolchain), so a header added for one of them changes all their keys."""
    return sorted(p for p in (root or DEVICE_INCLUDE).rglob("*.h") if p.name not in leave_out)


def _header_files() -> list[Path]:
    return device_headers() + sorted(EMULATOR_INCLUDE.rglob("*.h"))


def _includes() -> list[str]:
    return [f"-I{DEVICE_INCLUDE}", f"-I{EMULATOR_INCLUDE}", f"-I{RUNTIME_SOURCES}"]


def _device_flags(version: str) -> list[str]:
    # Functions of the device header, the emulator's and the system's headers are not
    # instrumented: they do not recurse, and some are on every memory access. Clang has no
    # exclusion list; instrumenting after inlining spares the same small functions.
    if "clang" in version:
        return [*_DEVICE_FLAGS, "-finstrument-functions-after-inlining"]
    exclude = ",".join([str(DEVICE_INCLUDE), str(EMULATOR_INCLUDE), "/usr/"])
    return [*_DEVICE_FLAGS, f"-finstrument-functions-exclude-file-list={exclude}"]


def frame_bytes(stack_usage: str) -> int:
    """The stack a kernel's CUDA thread needs, from g++'s ``-fstack-usage`` report of its
    translation unit (``file:line:col:function<TAB>bytes<TAB>static|dynamic[,bounded]``).

    The sum of every frame bounds any chain of calls in which no function appears twice
    (recursion is caught by the stack check instead); a frame with ``alloca`` or a
    variable-length array counts its fixed part only.
    """
    total = 0
    for line in stack_usage.splitlines():
        fields = line.rsplit("\t", 2)
        if len(fields) == 3 and fields[1].isdigit():
            total += int(fields[1])
    return total


def fault_guards(frames: int) -> str:
    """C++ linked into every kernel library: its settings (with the stack its frames need),
    and the functions the device code's instrumentation and ``assert`` call, which report
    through the runtime instead of trapping or aborting the process."""
    return f"""// ---- fault guards generated by jaxtile.compiler.emulator.build ----
#include <assert.h>
#include <stdint.h>

#include "jaxtile_emu/runtime.h"

::jaxtile::emu::KernelSettings jt_kernel_settings = {{1, -1, -1.0, {frames}u, nullptr}};

// Hidden: the kernel's own calls must bind to these, not to a definition elsewhere in the
// process (glibc has its own __assert_fail and __cyg_profile_func_enter).
#pragma GCC diagnostic ignored "-Wattributes"
#define JT_GUARD extern "C" __attribute__((visibility("hidden")))

extern "C" __attribute__((visibility("default"))) ::jaxtile::emu::KernelSettings*
jaxtile_emu_kernel_settings() {{
  return &jt_kernel_settings;
}}

// glibc's assert calls this; here it fails the launch instead of aborting the process.
JT_GUARD void __assert_fail(const char* expr, const char*, unsigned line, const char*) noexcept {{
  ::jaxtile::emu::device_assert_failed(expr, line);
}}
// What -fsanitize=integer-divide-by-zero calls before a division by zero (its first argument
// starts with the source location: file, line, column).
struct JtSourceLocation {{
  const char* file;
  uint32_t line, column;
}};
JT_GUARD void __ubsan_handle_divrem_overflow(const JtSourceLocation* at, void*, void*) {{
  ::jaxtile::emu::divide_by_zero(at->file, at->line);
}}
JT_GUARD void __ubsan_handle_divrem_overflow_abort(const JtSourceLocation* at, void*, void*) {{
  ::jaxtile::emu::divide_by_zero(at->file, at->line);
}}
// What -finstrument-functions calls on entry to and exit from each device function. g++
// declares them itself, visible; the assembler makes them hidden all the same.
asm(".hidden __cyg_profile_func_enter");
asm(".hidden __cyg_profile_func_exit");
JT_GUARD void __cyg_profile_func_enter(void*, void* call_site) {{
  ::jaxtile::emu::check_stack(call_site);
}}
JT_GUARD void __cyg_profile_func_exit(void*, void*) {{}}
"""


def runtime_library() -> Path:
    """The emulator runtime as a shared library, compiled on first use and cached by content.

    Every kernel library links to it, so that its state (thread-local fiber pointers, the
    report sink) exists once per process whatever the number of kernels loaded.
    """
    cxx = cxx_compiler()
    sources = sorted(RUNTIME_SOURCES.glob("*.cc"))
    headers = sorted(RUNTIME_SOURCES.glob("*.h")) + _header_files()
    key = hashlib.sha256(
        "|".join([_hash_files(sources + headers), _compiler_version(cxx), *_RUNTIME_FLAGS])
        .encode()
    ).hexdigest()[:24]
    out = cache_dir() / "emulator" / f"libjaxtile_emu-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        lib = Path(tmp) / out.name
        cmd = [cxx, *_RUNTIME_FLAGS, *_includes(), f"-I{_tvm_ffi_include()}",
               *map(str, sources), "-shared", f"-Wl,-soname,{out.name}", "-o", str(lib)]
        # About half a minute, once per machine and compiler: say so rather than hang.
        compile_log.logger.info("building the CUDA emulator runtime %s", out)
        with compile_log.progress("building the CUDA emulator's runtime (once)", after=0):
            _run(cmd, "compiling the emulator runtime")
        os.replace(lib, out)
    return out


def _scalar_literal(p: Scalar) -> str:
    value = p.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}LL" if not -(2**31) <= value < 2**31 else str(value)
    if isinstance(value, float) and np.isfinite(value):
        single = float(np.float32(value))
        return f"{single!r}f" if single == value else repr(value)
    raise ToolchainError(f"scalar '{p.name}': {value!r} cannot be a constant of the launch shim")


def launch_shim(kernel: str, params: Sequence[Param], launch: LaunchConfig, file: str) -> str:
    """C++ appended to the device source: the `__tvm_ffi_<kernel>` entry point.

    Buffers bind to the packed tensors in order; scalars are constants; sizes are read from
    the buffers' shapes.
    """
    buffers = [p for p in params if isinstance(p, Buffer)]
    if not buffers:
        raise ToolchainError(f"kernel '{kernel}' needs at least one buffer parameter")
    args = []
    maps: list[str] = []
    index = 0
    for p in params:
        if isinstance(p, TensorMapParam):
            var = f"jt_map{len(maps)}"
            if not 0 <= p.buffer < len(buffers):
                raise ToolchainError(f"tensor map '{p.name}' describes buffer {p.buffer} of a "
                                     f"kernel with {len(buffers)}")
            maps += p.c_build(var)
            maps.append(f"const ::jaxtile::emu::Region {var}_region{{reinterpret_cast<char*>("
                        f"&{var}), sizeof({var}), \"{p.name}\", ::jaxtile::emu::kGlobal}};")
            args.append(f"::jaxtile::ptr<const ::jaxtile::tensor_map>(reinterpret_cast<"
                        f"const ::jaxtile::tensor_map*>(&{var}), &{var}_region)")
        elif isinstance(p, Buffer):
            args.append(
                f"::jaxtile::ptr<{p.ctype}>(reinterpret_cast<{p.ctype}*>(b[{index}].base), "
                f"&b[{index}])"
            )
            index += 1
        elif isinstance(p, Size):
            args.append(p.c_value)
        else:
            args.append(_scalar_literal(p))
    names = ", ".join(f'"{p.name}"' for p in buffers)
    sizes = ", ".join(str(p.itemsize) for p in buffers)
    g, blk = launch.grid, launch.block
    grid_of = "" if not launch.grid_of else (
        "::jaxtile::emu::DimSpec jt_grid(const ::jaxtile::emu::Region* b) {\n"
        f"  return {{static_cast<unsigned>({launch.grid_of}), 1u, 1u}};\n}}\n")
    return f"""
// ---- launch shim generated by jaxtile.compiler.emulator.build ----
extern ::jaxtile::emu::KernelSettings jt_kernel_settings;  // in the fault guards
namespace {{
const char* const jt_buffer_names[] = {{{names}}};
const int32_t jt_buffer_bytes[] = {{{sizes}}};
void jt_entry(const ::jaxtile::emu::Region* b) {{
{"".join(f"  {line}{chr(10)}" for line in maps)}  {kernel}({", ".join(args)});
}}
{grid_of}const ::jaxtile::emu::KernelSpec jt_spec = {{
    "{kernel}", "{file}", {{{g[0]}u, {g[1]}u, {g[2]}u}}, {{{blk[0]}u, {blk[1]}u, {blk[2]}u}},
    {launch.dynamic_smem}u, {len(buffers)}, jt_buffer_names, jt_buffer_bytes, &jt_entry,
    {"&jt_grid" if launch.grid_of else "nullptr"}, &jt_kernel_settings, {launch.warp_size}u}};
}}  // namespace
extern "C" __attribute__((visibility("default"))) int __tvm_ffi_{kernel}(
    void*, const void* args, int32_t num_args, void*) {{
  return ::jaxtile::emu::launch(&jt_spec, args, num_args);
}}
// This kernel's own report (see jaxtile::emu::take_report).
extern "C" __attribute__((visibility("default"))) size_t jaxtile_emu_kernel_report(
    char* buf, size_t cap) {{
  return ::jaxtile::emu::take_report(&jt_spec, buf, cap);
}}
"""


def build_library(
    source: str,
    kernel: str,
    params: Sequence[Param],
    launch: LaunchConfig,
    *,
    file: str = "kernel.cu",
) -> Path:
    """Compile `source` (CUDA text written against jaxtile/device.h, or HIP text when
    ``launch.warp_size`` is 64) for the emulator.

    Returns the path of a cached shared library exporting ``__tvm_ffi_<kernel>``. `file` is
    the name reports give the source. Raises ToolchainError with the compiler's messages.
    """
    cxx = cxx_compiler()
    version = _compiler_version(cxx)
    runtime = runtime_library()
    text = source + launch_shim(kernel, params, launch, file)
    device_flags = [*_device_flags(version), *launch.mode_flags]
    key = hashlib.sha256(
        "|".join([text, runtime.name, version, *_FLAGS, *device_flags,
                  fault_guards(0)]).encode()
    ).hexdigest()[:32]
    out = cache_dir() / "emulator" / f"{kernel}-{key}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / file
        src.write_text(text)
        obj = Path(tmp) / "kernel.o"
        cmd = [cxx, *_FLAGS, *device_flags, *_includes(), "-x", "c++", "-c", str(src),
               "-o", str(obj)]
        _run(cmd, f"compiling '{file}' for the emulator")
        guards = Path(tmp) / "fault_guards.cc"
        # A compiler without -fstack-usage output leaves the default stacks.
        usage = Path(tmp) / "kernel.su"
        guards.write_text(fault_guards(frame_bytes(usage.read_text()) if usage.exists() else 0))
        lib = Path(tmp) / "kernel.so"
        # The runtime sits beside the kernel library in the cache: found through $ORIGIN.
        cmd = [cxx, *_FLAGS, *launch.mode_flags, *_includes(), "-x", "c++", str(guards),
               "-x", "none", str(obj), str(runtime), "-Wl,-rpath,$ORIGIN", "-shared", "-o",
               str(lib)]
        _run(cmd, f"linking '{file}' for the emulator")
        os.replace(lib, out)
    return out
