#include "cuda/handler.h"

#include <string>
#include <string_view>

#include "common/call_buffers.h"
#include "cuda/driver.h"
#include "cuda/kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxtile::cuda {
namespace {

ffi::Error call(CUstream stream, std::string_view key, std::string_view payload,
                ffi::RemainingArgs args, ffi::RemainingRets rets) {
  const CallBuffers b(args, rets);
  if (b.error()) return *b.error();
  const std::string error = launch(stream, key, payload, b.buffers(), b.size(), b.dims());
  if (!error.empty()) return ffi::Error::Internal(error);
  return ffi::Error::Success();
}

// The initialize stage: the kernel is loaded before XLA executes, or captures, the call.
ffi::Error initialize(CUstream stream, std::string_view key, std::string_view payload,
                      ffi::RemainingArgs, ffi::RemainingRets) {
  const std::string error = load(stream, key, payload);
  if (!error.empty()) return ffi::Error::Internal(error);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileCudaInitialize, initialize,
                              ffi::Ffi::BindInitialize()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Attr<std::string_view>("key")
                                  .Attr<std::string_view>("payload")
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileCudaCall, call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Attr<std::string_view>("key")
                                  .Attr<std::string_view>("payload")
                                  .RemainingArgs()
                                  .RemainingRets(),
                              {ffi::Traits::kCmdBufferCompatible});

void* handler() { return reinterpret_cast<void*>(&JaxtileCudaCall); }

void* initialize_handler() { return reinterpret_cast<void*>(&JaxtileCudaInitialize); }

}  // namespace jaxtile::cuda
