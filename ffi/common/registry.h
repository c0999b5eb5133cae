// Process-wide table of loaded kernels, keyed by the string jaxtile's compiler assigns. It is
// platform-neutral; each platform's loader (cpu/loader.h) makes the Kernel records.
#pragma once

#include <tvm/ffi/c_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace jaxtile {

// The tvm-ffi packed calling convention of an exported `__tvm_ffi_<name>` symbol.
using KernelFn = int (*)(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

// The buffers a kernel was compiled for (a CPU kernel's: cpu/signature.h).
struct Signature;

struct Kernel {
  std::string key;
  // Where the library came from, for messages: its path, or what else held it.
  std::string path;
  std::string symbol;
  KernelFn fn;
  int64_t num_blocks;
  // Byte alignment the generated code assumes for every buffer's data pointer.
  int64_t alignment;
  // Checked by the handler before every call; null: the kernel checks its arguments itself
  // (a library built with TVM's entry assertions, e.g. from an older export's payload).
  std::shared_ptr<const Signature> signature;
};

// The kernel registered under `key`, or the one `load()` makes and registers if there is
// none (keys name immutable compiled artifacts, so a second load is a no-op). Loads are
// serialised, lookups are not blocked by them. A platform's loader (cpu/loader.h) calls this;
// exceptions from `load` propagate and register nothing.
const Kernel& register_kernel(std::string_view key,
                              const std::function<std::unique_ptr<Kernel>()>& load);

// Null if nothing is registered under `key`. Kernels are never unloaded, so the pointer stays
// valid for the life of the process.
const Kernel* find_kernel(std::string_view key);

std::vector<std::string> loaded_keys();

}  // namespace jaxtile
