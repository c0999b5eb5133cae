// Loaded HIP kernels: a module and function per (device, content key), made on first use from
// the code object in the call's payload, and their launch.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/launch_spec.h"
#include "rocm/runtime.h"

namespace jaxtile::rocm {

// Launches the kernel `key` on `stream` with `buffers` (device addresses of the operands,
// then the results). On the first call for `key` on the stream's device the payload is
// verified and its code object loaded there; later calls find it in the cache. `dims` (one
// entry per buffer, or null) gives their shapes, which a kernel with dynamic sizes takes its
// grid and size parameters from. Returns "" on success, else a message naming the kernel
// ("jaxtile: HIP kernel 'name' ...") for the caller to raise; throws nothing.
std::string launch(hipStream_t stream, std::string_view key, std::string_view payload,
                   void* const* buffers, size_t num_buffers,
                   const BufferDims* dims = nullptr);

// Loads the kernel on the stream's device if it is not there yet, launching nothing: the
// handler's initialize stage. Same messages.
std::string load(hipStream_t stream, std::string_view key, std::string_view payload);

}  // namespace jaxtile::rocm
