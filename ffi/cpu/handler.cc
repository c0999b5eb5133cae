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

// The call frame's buffers, read in place: `RemainingArgs::get<AnyBuffer>` builds an
// ErrorOr and a diagnostic engine for each, which with a dtype switch and an element count
// in passes of their own came to a third of a small call's cost over XLA's custom-call floor
// (benchmarks/README.md, "Session end (2026-12-04)"). Null: not a buffer (a token).
class ArgBuffers : public ffi::RemainingArgs {
 public:
  explicit ArgBuffers(const ffi::RemainingArgs& a) : ffi::RemainingArgs(a) {}
  const XLA_FFI_Buffer* at(size_t i) const {
    const size_t idx = offset() + i;
    if (args()->types[idx] != XLA_FFI_ArgType_BUFFER) return nullptr;
    return static_cast<const XLA_FFI_Buffer*>(args()->args[idx]);
  }
};

class RetBuffers : public ffi::RemainingRets {
 public:
  explicit RetBuffers(const ffi::RemainingRets& r) : ffi::RemainingRets(r) {}
  const XLA_FFI_Buffer* at(size_t i) const {
    const size_t idx = offset() + i;
    if (rets()->types[idx] != XLA_FFI_RetType_BUFFER) return nullptr;
    return static_cast<const XLA_FFI_Buffer*>(rets()->rets[idx]);
  }
};

// False if `buf` is not a buffer or has an element type kernels do not take.
bool to_tensor(const XLA_FFI_Buffer* buf, DLTensor* t) {
  if (buf == nullptr || !to_dl_dtype(static_cast<ffi::DataType>(buf->dtype), &t->dtype)) {
    return false;
  }
  bool empty = false;
  for (int64_t d = 0; d < buf->rank; ++d) empty |= buf->dims[d] == 0;
  t->data = empty ? g_empty_buffer : buf->data;
  t->device = DLDevice{kDLCPU, 0};
  t->ndim = static_cast<int32_t>(buf->rank);
  t->shape = buf->dims;
  t->strides = nullptr;
  t->byte_offset = 0;
  return true;
}

// Why to_tensor refused buffer #`index`.
[[gnu::cold, gnu::noinline]] ffi::Error bad_buffer(const Kernel& k, const XLA_FFI_Buffer* buf,
                                                   size_t index) {
  if (buf == nullptr) {
    return ffi::Error::InvalidArgument(describe(k) + ": operand or result #" +
                                       std::to_string(index) + " is not an array");
  }
  return ffi::Error::InvalidArgument(describe(k) + ": buffer #" + std::to_string(index) +
                                     " has an element type jaxtile does not support (XLA "
                                     "type " + std::to_string(int(buf->dtype)) + ")");
}

// The size of a result in bytes (its tensor was filled by to_tensor).
size_t result_bytes(const DLTensor& t) {
  size_t count = 1;
  for (int32_t d = 0; d < t.ndim; ++d) count *= static_cast<size_t>(t.shape[d]);
  return count * ((t.dtype.bits * t.dtype.lanes + 7) / 8);
}

// XLA's intra-op pool as the launch's HostPool.
struct XlaPool {
  ffi::ThreadPool& pool;

  static void schedule(void* self, void (*fn)(void*), void* arg) {
    static_cast<XlaPool*>(self)->pool.Schedule([fn, arg] { fn(arg); });
  }
};

// Where a call's buffers are packed for the kernel: `num_buffers` tensors, types and dims,
// and two more packed arguments (the block range) before the tensors.
struct CallArrays {
  DLTensor* tensors;
  TVMFFIAny* packed;
  ffi::DataType* types;  // what the signature check reads
  BufferDims* dims;
};

// Cold paths, out of line: a small kernel's call costs about as much as XLA's own custom-call
// path, so the code it runs through is kept to a few cache lines.
[[gnu::cold, gnu::noinline]] ffi::Error call_refused(const Kernel& k, const std::string& msg) {
  return ffi::Error::InvalidArgument(describe(k) + ": " + msg);
}

[[gnu::cold, gnu::noinline]] ffi::Error kernel_failed(const Kernel& k, const std::string& msg) {
  return ffi::Error::Internal(describe(k) + " failed: " + msg);
}

ffi::Error run_with(const Kernel& k, ffi::ThreadPool& xla_pool, ffi::RemainingArgs args,
                    ffi::RemainingRets rets, const CallArrays& c) {
  const ArgBuffers in(args);
  const RetBuffers out(rets);
  const size_t num_args = args.size();
  const size_t num_buffers = num_args + rets.size();
  // The kernel itself checks nothing (it is built without TVM's entry assertions): a call
  // that does not match what it was compiled for must stop here. Each buffer is checked as it
  // is packed; check_call, which says what is wrong, runs only on a misfit or for the sizes
  // that are expressions over several buffers.
  const Signature* sig = k.signature.get();
  bool fits = sig == nullptr || sig->buffers.size() == num_buffers;
  for (size_t i = 0; i < num_buffers; ++i) {
    const bool result = i >= num_args;
    const XLA_FFI_Buffer* buf = result ? out.at(i - num_args) : in.at(i);
    if (!to_tensor(buf, &c.tensors[i])) return bad_buffer(k, buf, i);
    const auto type = static_cast<ffi::DataType>(buf->dtype);
    const auto rank = static_cast<size_t>(buf->rank);
    c.types[i] = type;
    c.dims[i] = BufferDims{buf->dims, rank};
    fits = fits && (sig == nullptr || buffer_fits(*sig, i, type, buf->dims, rank));
    if (result) prefer_huge_pages(buf->data, result_bytes(c.tensors[i]));
    TVMFFIAny& a = c.packed[i + 2];
    a.type_index = kTVMFFIDLTensorPtr;
    a.zero_padding = 0;
    a.v_ptr = &c.tensors[i];
  }
  if (sig != nullptr && (!fits || !sig->exprs.empty())) {
    std::string msg = check_call(*sig, c.types, c.dims, num_buffers);
    if (!msg.empty()) return call_refused(k, msg);
  }

  // The pool's size is asked only for a call with blocks to share.
  XlaPool xla{xla_pool};
  const HostPool host{&xla, &XlaPool::schedule, k.num_blocks > 1 ? xla_pool.num_threads() : 0};
  std::string msg =
      run_blocks(k, c.packed, static_cast<int32_t>(num_buffers + 2), 0, k.num_blocks, &host);
  if (!msg.empty()) return kernel_failed(k, msg);
  return ffi::Error::Success();
}

// A call of more buffers than the handler keeps on its stack.
[[gnu::cold, gnu::noinline]] ffi::Error run_on_heap(const Kernel& k, ffi::ThreadPool& xla_pool,
                                                    ffi::RemainingArgs args,
                                                    ffi::RemainingRets rets) {
  const size_t n = args.size() + rets.size();
  std::vector<DLTensor> tensors(n);
  std::vector<TVMFFIAny> packed(n + 2);
  std::vector<ffi::DataType> types(n);
  std::vector<BufferDims> dims(n);
  return run_with(k, xla_pool, args, rets,
                  CallArrays{tensors.data(), packed.data(), types.data(), dims.data()});
}

ffi::Error run(const Kernel& k, ffi::ThreadPool& xla_pool, ffi::RemainingArgs args,
               ffi::RemainingRets rets) {
  if (args.size() + rets.size() > kInlineBuffers) return run_on_heap(k, xla_pool, args, rets);
  DLTensor tensors[kInlineBuffers];
  TVMFFIAny packed[kInlineBuffers + 2];
  ffi::DataType types[kInlineBuffers];
  BufferDims dims[kInlineBuffers];
  return run_with(k, xla_pool, args, rets, CallArrays{tensors, packed, types, dims});
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
