// Loaded CUDA kernels: a module and function per (context, content key), made on first use
// from the cubin in the call's payload, and their launch.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "cuda/driver.h"
#include "common/launch_spec.h"

namespace jaxtile::cuda {

// Launches the kernel `key` on `stream` with `buffers` (device addresses of the operands,
// then the results). On the first call for `key` in the stream's context (XLA keeps one
// context per device) the payload is verified and its cubin loaded; later calls find it in
// the cache. `dims` (one entry per buffer, or null) gives their shapes, which a kernel with
// dynamic sizes takes its grid and size parameters from. Returns "" on success, else a
// message naming the kernel ("jaxtile: CUDA kernel 'name' ...") for the caller to raise;
// throws nothing.
std::string launch(CUstream stream, std::string_view key, std::string_view payload,
                   void* const* buffers, size_t num_buffers,
                   const BufferDims* dims = nullptr);

// Loads the kernel into the stream's context if it is not there yet, launching nothing: the
// handler's initialize stage, which XLA runs before executing (and before capturing a
// command buffer, during which loading a module may not be allowed). Same messages.
std::string load(CUstream stream, std::string_view key, std::string_view payload);

}  // namespace jaxtile::cuda
