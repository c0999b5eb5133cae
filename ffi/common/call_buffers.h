// The device buffers of one XLA FFI call, gathered for a GPU launch (CUDA's and ROCm's
// handlers): operands then results, their addresses and shapes.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "common/launch_spec.h"
#include "xla/ffi/api/ffi.h"

namespace jaxtile {

class CallBuffers {
 public:
  // Fails (see `error()`) when XLA passes an argument that is not a buffer.
  CallBuffers(xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets)
      : size_(args.size() + rets.size()) {
    if (size_ > kInline) {
      heap_.reset(new void*[size_]);
      heap_dims_.reset(new BufferDims[size_]);
      buffers_ = heap_.get();
      dims_ = heap_dims_.get();
    }
    // The shapes travel too: a kernel with dynamic sizes computes its grid from them.
    for (size_t i = 0; i < args.size(); ++i) {
      auto buf = args.get<xla::ffi::AnyBuffer>(i);
      if (!buf.has_value()) {
        error_ = buf.error();
        return;
      }
      buffers_[i] = buf->untyped_data();
      dims_[i] = BufferDims{buf->dimensions().begin(), buf->dimensions().size()};
    }
    for (size_t i = 0; i < rets.size(); ++i) {
      auto buf = rets.get<xla::ffi::AnyBuffer>(i);
      if (!buf.has_value()) {
        error_ = buf.error();
        return;
      }
      buffers_[args.size() + i] = (*buf)->untyped_data();
      dims_[args.size() + i] =
          BufferDims{(*buf)->dimensions().begin(), (*buf)->dimensions().size()};
    }
  }
  CallBuffers(const CallBuffers&) = delete;
  CallBuffers& operator=(const CallBuffers&) = delete;

  const std::optional<xla::ffi::Error>& error() const { return error_; }
  void* const* buffers() const { return buffers_; }
  const BufferDims* dims() const { return dims_; }
  size_t size() const { return size_; }

 private:
  // Operands + results handled without touching the heap.
  static constexpr size_t kInline = 32;
  size_t size_;
  void* inline_buffers_[kInline];
  BufferDims inline_dims_[kInline];
  std::unique_ptr<void*[]> heap_;
  std::unique_ptr<BufferDims[]> heap_dims_;
  void** buffers_ = inline_buffers_;
  BufferDims* dims_ = inline_dims_;
  std::optional<xla::ffi::Error> error_;
};

}  // namespace jaxtile
