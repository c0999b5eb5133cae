#include "cuda/handler.h"

#include <memory>
#include <string>
#include <string_view>

#include "cuda/driver.h"
#include "cuda/kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxtile::cuda {
namespace {

// Operands + results handled without touching the heap.
constexpr size_t kInlineBuffers = 32;

ffi::Error call(CUstream stream, std::string_view key, std::string_view payload,
                ffi::RemainingArgs args, ffi::RemainingRets rets) {
  const size_t n = args.size() + rets.size();
  void* inline_buffers[kInlineBuffers];
  BufferDims inline_dims[kInlineBuffers];
  std::unique_ptr<void*[]> heap;
  std::unique_ptr<BufferDims[]> heap_dims;
  void** buffers = inline_buffers;
  BufferDims* dims = inline_dims;
  if (n > kInlineBuffers) {
    heap.reset(new void*[n]);
    heap_dims.reset(new BufferDims[n]);
    buffers = heap.get();
    dims = heap_dims.get();
  }
  // The shapes travel too: a kernel with dynamic sizes computes its grid from them.
  for (size_t i = 0; i < args.size(); ++i) {
    auto buf = args.get<ffi::AnyBuffer>(i);
    if (!buf.has_value()) return buf.error();
    buffers[i] = buf->untyped_data();
    dims[i] = BufferDims{buf->dimensions().begin(), buf->dimensions().size()};
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buf = rets.get<ffi::AnyBuffer>(i);
    if (!buf.has_value()) return buf.error();
    buffers[args.size() + i] = (*buf)->untyped_data();
    dims[args.size() + i] = BufferDims{(*buf)->dimensions().begin(),
                                       (*buf)->dimensions().size()};
  }
  const std::string error = launch(stream, key, payload, buffers, n, dims);
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
