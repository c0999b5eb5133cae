// Process-wide table of loaded kernels, keyed by the string jaxtile's compiler assigns.
#pragma once

#include <tvm/ffi/c_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace jaxtile {

// The tvm-ffi packed calling convention of an exported `__tvm_ffi_<name>` symbol.
using KernelFn = int (*)(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

struct Kernel {
  std::string key;
  // Where the library came from, for messages: its path, or what else held it.
  std::string path;
  std::string symbol;
  KernelFn fn;
  int64_t num_blocks;
  // Byte alignment the generated code assumes for every buffer's data pointer.
  int64_t alignment;
};

// Loads a kernel, or returns the one already registered under `key` (keys name immutable
// compiled artifacts, so a second load is a no-op). `symbol` may be the exported name or the
// bare function name. `origin` names the library in messages instead of `path` (which may be
// a throwaway file). Throws std::invalid_argument or std::runtime_error.
const Kernel& load_kernel(const std::string& key, const std::string& path,
                          const std::string& symbol, int64_t num_blocks, int64_t alignment,
                          const std::string& origin = {});

// Null if nothing is registered under `key`. Kernels are never unloaded, so the pointer stays
// valid for the life of the process.
const Kernel* find_kernel(std::string_view key);

std::vector<std::string> loaded_keys();

}  // namespace jaxtile
