// The XLA FFI side of CUDA's and ROCm's handlers, over the vendor's `launch` and `load`
// (cuda/kernels.h, rocm/kernels.h): both take the stream XLA passes, the string attributes
// `key` and `payload`, and the operands and results as device buffers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "common/call_buffers.h"
#include "common/launch_spec.h"
#include "xla/ffi/api/ffi.h"

namespace jaxtile::gpu {

template <typename Stream>
using LaunchFn = std::string (*)(Stream, std::string_view key, std::string_view payload,
                                 void* const* buffers, size_t num_buffers,
                                 const BufferDims* dims);
template <typename Stream>
using LoadFn = std::string (*)(Stream, std::string_view key, std::string_view payload);

// The execute stage: gathers XLA's buffers and launches on its stream.
template <typename Stream, LaunchFn<Stream> Launch>
xla::ffi::Error call(Stream stream, std::string_view key, std::string_view payload,
                     xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets) {
  const CallBuffers b(args, rets);
  if (b.error()) return *b.error();
  const std::string error = Launch(stream, key, payload, b.buffers(), b.size(), b.dims());
  if (!error.empty()) return xla::ffi::Error::Internal(error);
  return xla::ffi::Error::Success();
}

// The initialize stage: the kernel is loaded before XLA executes the call or captures it into
// a command buffer (where loading a module may not be allowed).
template <typename Stream, LoadFn<Stream> Load>
xla::ffi::Error initialize(Stream stream, std::string_view key, std::string_view payload,
                           xla::ffi::RemainingArgs, xla::ffi::RemainingRets) {
  const std::string error = Load(stream, key, payload);
  if (!error.empty()) return xla::ffi::Error::Internal(error);
  return xla::ffi::Error::Success();
}

// What both stages take, added to `binding` (Ffi::Bind() or Ffi::BindInitialize()): on each
// platform the stream XLA passes is its own stream type (PlatformStream).
template <typename Stream, typename Binding>
auto call_binding(Binding binding) {
  return std::move(binding)
      .template Ctx<xla::ffi::PlatformStream<Stream>>()
      .template Attr<std::string_view>("key")
      .template Attr<std::string_view>("payload")
      .RemainingArgs()
      .RemainingRets();
}

}  // namespace jaxtile::gpu
