// Opening TVM-exported kernel libraries without the TVM runtime.
#pragma once

#include <string>

namespace jaxtile {

// dlopen()s `path` privately (RTLD_LOCAL) and points every runtime hook its generated code
// uses at jaxtile's implementations. Libraries are never closed: compiled XLA executables may
// keep calling into them for the life of the process. Throws std::runtime_error naming the
// path on failure.
void* open_kernel_library(const std::string& path);

}  // namespace jaxtile
