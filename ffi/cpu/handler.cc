#include "cpu/handler.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "common/payload.h"
#include "common/registry.h"
#include "cpu/exported_kernel.h"
#include "cpu/heap.h"
#include "cpu/launch.h"
#include "cpu/signature.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxtile {
namespace {

// Operands + results handled without touching the heap.
constexpr size_t kInlineBuffers = 30;

bool to_dl_dtype(ffi::DataType t, DLDataType* out) {
  auto set = [out](uint8_t code, uint8_t bits) {
    *out = DLDataType{code, bits, 1};
    return true;
  };
  switch (t) {
    case ffi::DataType::PRED: return set(kDLBool, 8);
    case ffi::DataType::S8: return set(kDLInt, 8);
    case ffi::DataType::S16: return set(kDLInt, 16);
    case ffi::DataType::S32: return set(kDLInt, 32);
    case ffi::DataType::S64: return set(kDLInt, 64);
    case ffi::DataType::U8: return set(kDLUInt, 8);
    case ffi::DataType::U16: return set(kDLUInt, 16);
    case ffi::DataType::U32: return set(kDLUInt, 32);
    case ffi::DataType::U64: return set(kDLUInt, 64);
    case ffi::DataType::F16: return set(kDLFloat, 16);
    case ffi::DataType::F32: return set(kDLFloat, 32);
    case ffi::DataType::F64: return set(kDLFloat, 64);
    case ffi::DataType::BF16: return set(kDLBfloat, 16);
    // 8-bit floats: bytes to the kernel, which declares them uint8 (the CPU converts them
    // with integer code, the GPUs with their device header) whatever DLPack version TVM has.
    case ffi::DataType::F8E4M3FN:
    case ffi::DataType::F8E5M2: return set(kDLUInt, 8);
    case ffi::DataType::C64: return set(kDLComplex, 64);
    case ffi::DataType::C128: return set(kDLComplex, 128);
    default: return false;
  }
}

std::string describe(const Kernel& k) {
  return "jaxtile: kernel '" + k.key + "' (" + k.symbol + " in " + k.path + ")";
}

// Zero-element buffers may come with a null pointer, which generated code rejects even though
// it never dereferences it.
alignas(256) char g_empty_buffer[256];

ffi::Error to_tensor(const Kernel& k, const ffi::AnyBuffer& buf, size_t index, DLTensor* t) {
  if (!to_dl_dtype(buf.element_type(), &t->dtype)) {
    return ffi::Error::InvalidArgument(describe(k) + ": buffer #" + std::to_string(index) +
                                       " has an element type jaxtile does not support (XLA "
                                       "type " + std::to_string(int(buf.element_type())) + ")");
  }
  void* data = buf.untyped_data();
  if (buf.element_count() == 0) data = g_empty_buffer;
  auto dims = buf.dimensions();
  t->data = data;
  t->device = DLDevice{kDLCPU, 0};
  t->ndim = static_cast<int32_t>(dims.size());
  t->shape = const_cast<int64_t*>(dims.begin());
  t->strides = nullptr;
  t->byte_offset = 0;
  return ffi::Error::Success();
}

// XLA's intra-op pool as the launch's HostPool.
struct XlaPool {
  ffi::ThreadPool& pool;

  static void schedule(void* self, void (*fn)(void*), void* arg) {
    static_cast<XlaPool*>(self)->pool.Schedule([fn, arg] { fn(arg); });
  }
};

ffi::Error run(const Kernel& k, ffi::ThreadPool& xla_pool, ffi::RemainingArgs args,
               ffi::RemainingRets rets) {
  const size_t num_buffers = args.size() + rets.size();
  DLTensor inline_tensors[kInlineBuffers];
  TVMFFIAny inline_packed[kInlineBuffers + 2];
  // What the signature check reads: each buffer's XLA element type and dimensions.
  ffi::DataType inline_types[kInlineBuffers];
  BufferDims inline_dims[kInlineBuffers];
  std::vector<DLTensor> heap_tensors;
  std::vector<TVMFFIAny> heap_packed;
  std::vector<ffi::DataType> heap_types;
  std::vector<BufferDims> heap_dims;
  DLTensor* tensors = inline_tensors;
  TVMFFIAny* packed = inline_packed;
  ffi::DataType* types = inline_types;
  BufferDims* dims = inline_dims;
  if (num_buffers > kInlineBuffers) {
    heap_tensors.resize(num_buffers);
    heap_packed.resize(num_buffers + 2);
    heap_types.resize(num_buffers);
    heap_dims.resize(num_buffers);
    tensors = heap_tensors.data();
    packed = heap_packed.data();
    types = heap_types.data();
    dims = heap_dims.data();
  }

  for (size_t i = 0; i < num_buffers; ++i) {
    ffi::Error err;
    if (i < args.size()) {
      auto buf = args.get<ffi::AnyBuffer>(i);
      if (!buf.has_value()) return buf.error();
      types[i] = buf->element_type();
      err = to_tensor(k, *buf, i, &tensors[i]);
    } else {
      auto buf = rets.get<ffi::AnyBuffer>(i - args.size());
      if (!buf.has_value()) return buf.error();
      types[i] = (*buf)->element_type();
      err = to_tensor(k, **buf, i, &tensors[i]);
      prefer_huge_pages((*buf)->untyped_data(), (*buf)->size_bytes());
    }
    if (err.failure()) return err;
    dims[i] = BufferDims{tensors[i].shape, static_cast<size_t>(tensors[i].ndim)};
    TVMFFIAny& a = packed[i + 2];
    a.type_index = kTVMFFIDLTensorPtr;
    a.zero_padding = 0;
    a.v_ptr = &tensors[i];
  }
  // The kernel itself checks nothing (it is built without TVM's entry assertions): a call
  // that does not match what it was compiled for must stop here.
  if (k.signature != nullptr) {
    std::string msg = check_call(*k.signature, types, dims, num_buffers);
    if (!msg.empty()) return ffi::Error::InvalidArgument(describe(k) + ": " + msg);
  }

  // The pool's size is asked only for a call with blocks to share.
  XlaPool xla{xla_pool};
  const HostPool host{&xla, &XlaPool::schedule, k.num_blocks > 1 ? xla_pool.num_threads() : 0};
  std::string msg =
      run_blocks(k, packed, static_cast<int32_t>(num_buffers + 2), 0, k.num_blocks, &host);
  if (!msg.empty()) return ffi::Error::Internal(describe(k) + " failed: " + msg);
  return ffi::Error::Success();
}

// An exception escaping into XLA's C API would abort the process.
template <typename F>
ffi::Error guarded(F&& body) {
  try {
    return body();
  } catch (const PayloadError& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    const std::string_view what = e.what();
    const bool ours = what.substr(0, 8) == "jaxtile:";
    return ffi::Error::Internal((ours ? "" : "jaxtile: ") + std::string(what));
  }
}

ffi::Error call(ffi::ThreadPool xla_pool, std::string_view key, ffi::RemainingArgs args,
                ffi::RemainingRets rets) {
  return guarded([&] {
    const Kernel* k = find_kernel(key);
    if (k == nullptr) {
      return ffi::Error::InvalidArgument(
          "jaxtile: no kernel is loaded for key '" + std::string(key) +
          "' in this process (jaxtile._ffi.load_kernel must run in every process that executes "
          "the compiled computation, e.g. after deserialising a cached executable; a program "
          "made with jax.export carries its kernels instead)");
    }
    return run(*k, xla_pool, args, rets);
  });
}

// The call of an exported program: the kernel comes with it, loaded on first use.
ffi::Error call_exported(ffi::ThreadPool xla_pool, std::string_view key,
                         std::string_view payload, ffi::RemainingArgs args,
                         ffi::RemainingRets rets) {
  return guarded([&] {
    const Kernel* k = find_kernel(key);
    return run(k != nullptr ? *k : load_exported_kernel(key, payload), xla_pool, args, rets);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileCpuCall, call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<std::string_view>("key")
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileCpuExportedCall, call_exported,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<std::string_view>("key")
                                  .Attr<std::string_view>("payload")
                                  .RemainingArgs()
                                  .RemainingRets());

void* cpu_handler() { return reinterpret_cast<void*>(&JaxtileCpuCall); }

void* cpu_exported_handler() { return reinterpret_cast<void*>(&JaxtileCpuExportedCall); }

}  // namespace jaxtile
