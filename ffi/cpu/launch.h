// Running a kernel's grid blocks, split across the thread pool.
#pragma once

#include <cstdint>
#include <string>

#include "common/registry.h"

namespace jaxtile {

// Runs blocks [begin, end) of `kernel`. `args` holds the full packed argument list; args[0]
// and args[1] (the block range) are filled in here. Returns the error message of a failing
// call or of a misaligned buffer, or an empty string.
std::string run_blocks(const Kernel& kernel, TVMFFIAny* args, int32_t num_args, int64_t begin,
                       int64_t end);

}  // namespace jaxtile
