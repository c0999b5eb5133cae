// Loading CPU kernels: a TVM-exported shared library, registered under its key.
#pragma once

#include <cstdint>
#include <string>

#include "common/registry.h"

namespace jaxtile {

// Loads a kernel, or returns the one already registered under `key` (a second load is a
// no-op). `symbol` may be the exported name or the bare function name. `signature`: the
// buffers it was compiled for (cpu/signature.h's text), which the handler checks before each
// call; empty for a library that checks its arguments itself. `origin` names the library in
// messages instead of `path` (which may be a throwaway file). Throws std::invalid_argument
// or std::runtime_error.
const Kernel& load_kernel(const std::string& key, const std::string& path,
                          const std::string& symbol, int64_t num_blocks, int64_t alignment,
                          const std::string& signature, const std::string& origin = {});

}  // namespace jaxtile
