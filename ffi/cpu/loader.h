// Loading CPU kernels: a TVM-compiled relocatable object linked in process (cpu/elf_object.h),
// or a TVM-exported shared library opened with dlopen, registered under its key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/registry.h"

namespace jaxtile {

// Loads a kernel, or returns the one already registered under `key` (a second load is a
// no-op). `path` holds a relocatable object, which is linked in process, or a shared library
// (what jaxtile wrote before objects, and still writes where kLinksObjects is false), which
// is dlopen()ed: the file's ELF header says which. `symbol` may be the exported name or the
// bare function name. `signature`: the buffers it was compiled for (cpu/signature.h's text),
// which the handler checks before each call; empty for a library that checks its arguments
// itself. `origin` names the kernel in messages instead of `path` (which may be a throwaway
// file). Throws std::invalid_argument or std::runtime_error.
const Kernel& load_kernel(const std::string& key, const std::string& path,
                          const std::string& symbol, int64_t num_blocks, int64_t alignment,
                          const std::string& signature, const std::string& origin = {});

// load_kernel for a relocatable object held in memory (an exported program's payload).
const Kernel& load_object_kernel(const std::string& key, std::string_view object,
                                 const std::string& symbol, int64_t num_blocks,
                                 int64_t alignment, const std::string& signature,
                                 const std::string& origin);

}  // namespace jaxtile
