// Opening TVM-exported kernel libraries without the TVM runtime.
#pragma once

#include <string>
#include <string_view>

namespace jaxtile {

// dlopen()s `path` privately (RTLD_LOCAL) and points every runtime hook its generated code
// uses at jaxtile's implementations. Libraries are never closed: compiled XLA executables may
// keep calling into them for the life of the process. Throws std::runtime_error naming the
// path on failure.
void* open_kernel_library(const std::string& path);

// What a loader stores into the pointer slot `name` that generated code reads (e.g.
// "__tvm_ffi__library_ctx", "__TVMBackendAllocWorkspace"), or null if `name` is no slot.
void* runtime_slot(std::string_view name);

}  // namespace jaxtile
