// Loading the kernel library an exported program carries in its custom calls.
#pragma once

#include <string_view>

#include "common/registry.h"

namespace jaxtile {

// The kernel registered under `key`, loaded from `payload` (see payload.h) if it is not yet:
// decoded, verified, and its object linked from memory (format 3) or its shared library put
// in a process-private file and opened (formats 1 and 2), then registered like a cached one.
// Thread-safe; concurrent first calls load it once. Throws PayloadError for a bad payload
// and std::runtime_error if a verified library still cannot be loaded.
const Kernel& load_exported_kernel(std::string_view key, std::string_view payload);

}  // namespace jaxtile
