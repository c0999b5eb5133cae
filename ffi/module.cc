// Python bindings: the `jaxtile._ffi` extension module.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/payload.h"
#include "common/registry.h"
#include "cpu/elf_object.h"
#include "cpu/exported_kernel.h"
#include "cpu/handler.h"
#include "cpu/heap.h"
#include "cpu/host_cpu.h"
#include "cpu/launch.h"
#include "cpu/loader.h"
#include "cpu/thread_pool.h"
#include "cpu/trace.h"
#include "cuda/driver.h"
#include "cuda/handler.h"
#include "cuda/kernels.h"
#include "rocm/handler.h"
#include "rocm/kernels.h"
#include "rocm/runtime.h"
#include "common/launch_spec.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxtile {
namespace {

using Array = nb::ndarray<nb::ro, nb::device::cpu>;

DLTensor to_tensor(const Array& a, size_t index) {
  int64_t expected_stride = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    const auto extent = static_cast<int64_t>(a.shape(d));
    if (extent != 1 && a.stride(d) != expected_stride) {
      throw std::invalid_argument("jaxtile: argument #" + std::to_string(index) +
                                  " must be C-contiguous");
    }
    expected_stride *= extent;
  }
  DLTensor t{};
  t.data = const_cast<void*>(a.data());
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(a.ndim());
  t.dtype = DLDataType{a.dtype().code, a.dtype().bits, a.dtype().lanes};
  t.shape = const_cast<int64_t*>(a.shape_ptr());
  return t;
}

// Test hook: runs blocks of a loaded kernel directly on numpy arrays, writing results in place.
void call_kernel(const std::string& key, const nb::list& arrays, int64_t block_begin,
                 std::optional<int64_t> block_end) {
  const Kernel* k = find_kernel(key);
  if (k == nullptr) {
    throw std::invalid_argument("jaxtile: no kernel is loaded for key '" + key + "'");
  }
  const int64_t end = block_end.value_or(k->num_blocks);
  if (block_begin < 0 || block_begin > end || end > k->num_blocks) {
    throw std::invalid_argument("jaxtile: block range must satisfy 0 <= begin <= end <= " +
                                std::to_string(k->num_blocks));
  }
  // No conversion: a silently made contiguous copy would swallow the kernel's results.
  std::vector<Array> held;
  for (nb::handle h : arrays) {
    if (!nb::try_cast<Array>(h, held.emplace_back(), /*convert=*/false)) {
      throw nb::type_error(("jaxtile: argument #" + std::to_string(held.size() - 1) +
                            " is not a CPU array supporting DLPack")
                               .c_str());
    }
  }
  std::vector<DLTensor> tensors(held.size());
  std::vector<TVMFFIAny> packed(held.size() + 2);
  for (size_t i = 0; i < held.size(); ++i) {
    tensors[i] = to_tensor(held[i], i);
    packed[i + 2].type_index = kTVMFFIDLTensorPtr;
    packed[i + 2].v_ptr = &tensors[i];
  }
  std::string msg;
  {
    nb::gil_scoped_release release;
    msg = run_blocks(*k, packed.data(), static_cast<int32_t>(packed.size()), block_begin, end);
  }
  if (!msg.empty()) throw std::runtime_error("jaxtile: kernel '" + key + "' failed: " + msg);
}

// What a GPU handler (CUDA's or ROCm's `launch`) does on a call, without XLA: for tests of
// its error paths and of the calls it makes into the driver or runtime.
template <typename Stream,
          std::string (*Launch)(Stream, std::string_view, std::string_view, void* const*,
                                size_t, const BufferDims*)>
void test_launch(const std::string& key, const std::string& payload, uintptr_t stream,
                 const std::vector<uintptr_t>& buffers,
                 const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<void*> pointers;
  for (uintptr_t b : buffers) pointers.push_back(reinterpret_cast<void*>(b));
  // The buffers' shapes, as XLA passes them, when the test gives them (dynamic sizes).
  std::vector<BufferDims> dims;
  for (const auto& s : shapes) dims.push_back(BufferDims{s.data(), s.size()});
  std::string error;
  {
    nb::gil_scoped_release release;
    error = Launch(reinterpret_cast<Stream>(stream), key, payload, pointers.data(),
                   pointers.size(), dims.empty() ? nullptr : dims.data());
  }
  if (!error.empty()) throw std::runtime_error(error);
}

// What a GPU handler's initialize stage (its `load`) does, without XLA.
template <typename Stream, std::string (*Load)(Stream, std::string_view, std::string_view)>
void test_load(const std::string& key, const std::string& payload, uintptr_t stream) {
  std::string error;
  {
    nb::gil_scoped_release release;
    error = Load(reinterpret_cast<Stream>(stream), key, payload);
  }
  if (!error.empty()) throw std::runtime_error(error);
}

nb::dict cuda_launch_fields(const std::string& text) {
  const LaunchSpec spec = parse_launch(text);
  nb::list params;
  for (const Param& p : spec.params) params.append(nb::make_tuple(p.is_buffer, p.value));
  nb::dict d;
  d["grid"] = nb::make_tuple(spec.grid[0], spec.grid[1], spec.grid[2]);
  d["block"] = nb::make_tuple(spec.block[0], spec.block[1], spec.block[2]);
  d["smem"] = spec.dynamic_smem;
  d["params"] = params;
  d["buffers_needed"] = spec.buffers_needed;
  return d;
}

// The grid and parameter values the CUDA handler would launch with, for buffers of these
// shapes (addresses 0, 1, ...): for tests of dynamic sizes without a GPU.
nb::dict cuda_launch_geometry(const std::string& text,
                              const std::vector<std::vector<int64_t>>& shapes) {
  const LaunchSpec spec = parse_launch(text);
  std::vector<BufferDims> dims;
  std::vector<void*> buffers;
  for (const auto& s : shapes) {
    dims.push_back(BufferDims{s.data(), s.size()});
    buffers.push_back(reinterpret_cast<void*>(buffers.size()));
  }
  const auto grid = resolve_grid(spec, dims.data(), dims.size());
  nb::list params;
  for (const Param& p : spec.params) {
    params.append(param_value(p, buffers.data(), dims.data(), dims.size()));
  }
  nb::dict d;
  d["grid"] = nb::make_tuple(grid[0], grid[1], grid[2]);
  d["params"] = params;
  return d;
}

nb::dict cuda_payload_fields(const std::string& key, const std::string& payload) {
  CudaPayload p = decode_cuda_payload(key, payload);
  nb::dict d;
  d["format"] = p.format;
  d["jaxtile"] = p.jaxtile_version;
  d["key"] = p.key;
  d["name"] = p.name;
  d["symbol"] = p.symbol;
  d["arch"] = p.arch;
  d["launch"] = p.launch;
  d["cubin"] = nb::bytes(p.cubin.data(), p.cubin.size());
  d["ptx"] = nb::bytes(p.ptx.data(), p.ptx.size());
  return d;
}

nb::dict hip_payload_fields(const std::string& key, const std::string& payload) {
  HipPayload p = decode_hip_payload(key, payload);
  nb::dict d;
  d["format"] = p.format;
  d["jaxtile"] = p.jaxtile_version;
  d["key"] = p.key;
  d["name"] = p.name;
  nb::list code_objects;
  for (const HipCodeObject& c : p.code_objects) {
    nb::dict o;
    o["arch"] = c.arch;
    o["symbol"] = c.symbol;
    o["launch"] = c.launch;
    o["code_object"] = nb::bytes(c.code_object.data(), c.code_object.size());
    code_objects.append(o);
  }
  d["code_objects"] = code_objects;
  return d;
}

}  // namespace
}  // namespace jaxtile

NB_MODULE(_ffi, m) {
  using namespace jaxtile;
  m.doc() = "jaxtile's runtimes: load compiled kernels and run them from XLA (CPU, CUDA, ROCm).";

  m.def(
      "profiler_api",
      [] { return nb::capsule(jaxtile::profiler_pjrt_api(), "pjrt_c_api"); },
      "A PJRT C API with only a profiler extension, for jax's "
      "_profiler.register_plugin_profiler: the CPU pool's chunks of blocks as trace ranges.");
  m.def(
      "cpu_handler", [] { return nb::capsule(jaxtile::cpu_handler()); },
      "XLA FFI handler for jax.ffi.register_ffi_target('jaxtile_cpu_call', ..., platform='cpu').");

  m.def(
      "cpu_exported_handler", [] { return nb::capsule(jaxtile::cpu_exported_handler()); },
      "XLA FFI handler for 'jaxtile_cpu_exported_call', the kernel call of an exported program "
      "(attributes `key` and `payload`, the kernel library it carries).");
  m.attr("PAYLOAD_FORMAT") = kPayloadFormat;
  // Whether CPU kernels are compiled to objects linked in process (cpu/elf_object.h), or to
  // shared libraries linked with `ld` and opened with dlopen (machines other than x86-64).
  m.attr("CPU_LINKS_OBJECTS") = kLinksObjects;
  m.attr("CUDA_PAYLOAD_FORMAT") = kCudaPayloadFormat;
  m.attr("HIP_PAYLOAD_FORMAT") = kHipPayloadFormat;
  m.def(
      "load_exported_kernel",
      [](const std::string& key, const std::string& payload) {
        load_exported_kernel(key, payload);
      },
      "key"_a, "payload"_a, nb::call_guard<nb::gil_scoped_release>(),
      "Verify an exported kernel payload and load its library under `key`, as the first call "
      "of an exported program does (a no-op if `key` is loaded). Raises RuntimeError naming "
      "what is wrong with a bad payload.");

  m.def("amx_permitted", &amx_permitted,
        "Whether this process may run AMX tile instructions: on the first call, on a CPU with "
        "AMX, asks Linux for the tile data state (ffi/cpu/host_cpu.h).");

  m.def(
      "load_kernel",
      [](const std::string& key, const std::string& library_path, const std::string& symbol,
         int64_t num_blocks, int64_t alignment, const std::string& signature) {
        load_kernel(key, library_path, symbol, num_blocks, alignment, signature);
      },
      "key"_a, "library_path"_a, "symbol"_a, "num_blocks"_a, "alignment"_a,
      "signature"_a = "", nb::call_guard<nb::gil_scoped_release>(),
      "Load kernel `symbol` from a TVM-exported library under `key` (a no-op if `key` is "
      "already loaded). `alignment` is the buffer alignment the kernel was compiled to assume; "
      "`signature` the buffers it was compiled for (ffi/cpu/signature.h), which every call is "
      "checked against, or empty for a library that checks its arguments itself.");

  m.def(
      "cuda_handler", [] { return nb::capsule(cuda::handler()); },
      "XLA FFI handler (execute stage) for 'jaxtile_cuda_call' on platform 'CUDA': "
      "attributes `key` and `payload` (the cubin and its launch).");
  m.def(
      "cuda_initialize_handler", [] { return nb::capsule(cuda::initialize_handler()); },
      "The initialize stage of 'jaxtile_cuda_call': loads the kernel before execution.");
  m.def(
      "cuda_driver_error",
      [] {
        std::string why;
        return cuda::driver(&why) ? std::string() : why;
      },
      "Why the NVIDIA driver cannot be used here ('' if it can); loads it on first call.");
  m.def("cuda_launch", &test_launch<cuda::CUstream, cuda::launch>, "key"_a, "payload"_a, "stream"_a, "buffers"_a,
        "shapes"_a = std::vector<std::vector<int64_t>>(),
        "Launch a CUDA kernel as the handler does (device addresses of operands then "
        "results, and optionally their shapes), raising RuntimeError with the handler's "
        "message. Meant for tests.");
  m.def("cuda_load", &test_load<cuda::CUstream, cuda::load>, "key"_a, "payload"_a, "stream"_a,
        "Load a CUDA kernel into the stream's context as the handler's initialize stage does, "
        "raising RuntimeError with its message. Meant for tests.");
  m.def("parse_cuda_launch", &cuda_launch_fields, "text"_a,
        "A launch configuration as the CUDA handler reads it: grid, block, smem, params as "
        "(is_buffer, index or scalar bytes), buffers_needed. Raises ValueError on bad text. "
        "Meant for tests.");
  m.def("cuda_launch_geometry", &cuda_launch_geometry, "text"_a, "shapes"_a,
        "The grid and parameter values (buffer i's address is i) the CUDA handler computes "
        "for buffers of these shapes. Raises ValueError. Meant for tests.");
  m.def("decode_cuda_payload", &cuda_payload_fields, "key"_a, "payload"_a,
        "The fields of a CUDA kernel payload, checked as the handler checks them (raises "
        "RuntimeError naming what is wrong). Meant for tests.");

  m.def(
      "rocm_handler", [] { return nb::capsule(rocm::handler()); },
      "XLA FFI handler (execute stage) for 'jaxtile_rocm_call' on platform 'ROCM': "
      "attributes `key` and `payload` (the code object and its launch).");
  m.def(
      "rocm_initialize_handler", [] { return nb::capsule(rocm::initialize_handler()); },
      "The initialize stage of 'jaxtile_rocm_call': loads the kernel before execution.");
  m.def(
      "rocm_runtime_error",
      [] {
        std::string why;
        return rocm::runtime(&why) ? std::string() : why;
      },
      "Why the HIP runtime cannot be used here ('' if it can); loads it on first call.");
  m.def("rocm_launch", &test_launch<rocm::hipStream_t, rocm::launch>, "key"_a, "payload"_a, "stream"_a, "buffers"_a,
        "shapes"_a = std::vector<std::vector<int64_t>>(),
        "Launch a HIP kernel as the ROCm handler does, raising RuntimeError with its "
        "message. Meant for tests.");
  m.def("rocm_load", &test_load<rocm::hipStream_t, rocm::load>, "key"_a, "payload"_a, "stream"_a,
        "Load a HIP kernel on the stream's device as the handler's initialize stage does. "
        "Meant for tests.");
  m.def("decode_hip_payload", &hip_payload_fields, "key"_a, "payload"_a,
        "The fields of a ROCm kernel payload, checked as the handler checks them (raises "
        "RuntimeError naming what is wrong); `code_objects` lists each one's arch, symbol, "
        "launch and code_object. Meant for tests.");

  m.def(
      "is_loaded", [](const std::string& key) { return find_kernel(key) != nullptr; }, "key"_a);
  m.def("loaded_keys", &loaded_keys);
  m.def("num_threads", &num_threads, "Threads a multi-block kernel call is split across.");
  m.def("set_num_threads", &set_num_threads, "n"_a,
        "Set the threads a kernel call is split across; only before the first kernel call "
        "(returns False, changing nothing, after it or for n < 1).");
  m.def(
      "plan_threads",
      [](int own, bool requested, int64_t host_threads) {
        const ThreadPlan p = plan_threads(own, requested, host_threads);
        return nb::make_tuple(p.threads, p.on_host_pool);
      },
      "own"_a, "requested"_a, "host_threads"_a,
      "(threads, on_host_pool): how a call with `own` = num_threads(), JAXTILE_NUM_THREADS "
      "set or not and a host (XLA) pool of `host_threads` spreads its blocks. For tests.");
  m.def("chunk_bounds", &chunk_bounds, "num_blocks"_a, "threads"_a,
        "How a call splits `num_blocks` blocks over `threads` threads: chunk c is blocks "
        "[bounds[c], bounds[c + 1]). For tests.");
  m.def("own_pool_started", &own_pool_started,
        "Whether jaxtile's own worker threads have been started in this process.");
  m.def("keep_freed_memory", &keep_freed_memory,
        "Keep freed buffers of up to 32 MiB, and up to 256 MiB free at the heap's top, in the "
        "process instead of returning them to the OS (glibc only; returns whether applied).");
  m.def("call_kernel", &call_kernel, "key"_a, "arrays"_a, "block_begin"_a = 0,
        "block_end"_a = nb::none(),
        "Run blocks [block_begin, block_end) of a loaded kernel on numpy arrays (operands then "
        "results, results written in place). Meant for tests.");
}
