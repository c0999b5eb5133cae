#include "rocm/handler.h"

#include <string>
#include <string_view>

#include "common/call_buffers.h"
#include "rocm/kernels.h"
#include "rocm/runtime.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxtile::rocm {
namespace {

ffi::Error call(hipStream_t stream, std::string_view key, std::string_view payload,
                ffi::RemainingArgs args, ffi::RemainingRets rets) {
  const CallBuffers b(args, rets);
  if (b.error()) return *b.error();
  const std::string error = launch(stream, key, payload, b.buffers(), b.size(), b.dims());
  if (!error.empty()) return ffi::Error::Internal(error);
  return ffi::Error::Success();
}

ffi::Error initialize(hipStream_t stream, std::string_view key, std::string_view payload,
                      ffi::RemainingArgs, ffi::RemainingRets) {
  const std::string error = load(stream, key, payload);
  if (!error.empty()) return ffi::Error::Internal(error);
  return ffi::Error::Success();
}

}  // namespace

// PlatformStream<hipStream_t>: on ROCm the stream XLA passes is its hipStream_t.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileRocmInitialize, initialize,
                              ffi::Ffi::BindInitialize()
                                  .Ctx<ffi::PlatformStream<hipStream_t>>()
                                  .Attr<std::string_view>("key")
                                  .Attr<std::string_view>("payload")
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileRocmCall, call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<hipStream_t>>()
                                  .Attr<std::string_view>("key")
                                  .Attr<std::string_view>("payload")
                                  .RemainingArgs()
                                  .RemainingRets(),
                              {ffi::Traits::kCmdBufferCompatible});

void* handler() { return reinterpret_cast<void*>(&JaxtileRocmCall); }

void* initialize_handler() { return reinterpret_cast<void*>(&JaxtileRocmInitialize); }

}  // namespace jaxtile::rocm
