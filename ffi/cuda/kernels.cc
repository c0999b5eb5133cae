#include "cuda/kernels.h"

#include <array>
#include <cstdio>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "common/gpu_kernels.h"
#include "common/launch_spec.h"
#include "common/payload.h"

namespace jaxtile::cuda {
namespace {

using Kernel = gpu::Kernel<CUfunction>;

std::string who(std::string_view name, std::string_view key) {
  return gpu::who("CUDA", name, key);
}

// The CUDA version whose driver the payload's PTX needs (from its `.version` directive); 0
// without PTX (an architecture-specific cubin) or a directive.
int ptx_cuda_version(const std::string& ptx) {
  size_t at = ptx.rfind(".version ", 0) == 0 ? 0 : ptx.find("\n.version ");
  if (at == std::string::npos) return 0;
  at = ptx.find(".version ", at) + 9;
  int major = 0, minor = 0;
  if (std::sscanf(ptx.c_str() + at, "%d.%d", &major, &minor) != 2) return 0;
  return cuda_version_for_ptx_isa(major, minor);
}

// What to do about a driver older than the CUDA version `needed`.
std::string too_old(int driver_version, int needed) {
  const int release = driver_release_for_cuda(needed);
  std::string msg = "the NVIDIA driver supports CUDA " + cuda_version_text(driver_version) +
                    ", but the kernel was compiled by CUDA " + cuda_version_text(needed) +
                    ": install an NVIDIA driver for CUDA " + cuda_version_text(needed) +
                    " or newer";
  if (release > 0) msg += " (release " + std::to_string(release) + " or later)";
  if (needed / 1000 > driver_version / 1000 && driver_version / 1000 >= 12) {
    msg += ", or compile kernels with CUDA " + std::to_string(driver_version / 1000) +
           ": pip install 'jaxtile[cuda" + std::to_string(driver_version / 1000) +
           "]' (with jax[cuda" + std::to_string(driver_version / 1000) + "])";
  }
  return msg;
}

// A TMA tensor map of `m` at `address`: elements moved as unsigned integers of their size
// (TMA copies bytes; the element type matters only to fills other than zero, which jaxtile
// does not use), no interleave, the box's swizzle, 128-byte L2 promotion, zeros out of
// bounds. Returns "" or what failed.
std::string encode_tensor_map(const Driver& d, const TensorMapDesc& m, void* address,
                              TensorMapBytes* out) {
  if (d.cuTensorMapEncodeTiled == nullptr) {
    return "libcuda.so.1 lacks cuTensorMapEncodeTiled (a driver for CUDA 12 or newer has it)";
  }
  // CU_TENSOR_MAP_DATA_TYPE_UINT8 / UINT16 / UINT32 / UINT64.
  const int type = m.elem_bytes == 1 ? 0 : m.elem_bytes == 2 ? 1 : m.elem_bytes == 4 ? 2 : 4;
  // CU_TENSOR_MAP_SWIZZLE_NONE / 32B / 64B / 128B.
  const int swizzle = m.swizzle == 0 ? 0 : m.swizzle == 32 ? 1 : m.swizzle == 64 ? 2 : 3;
  unsigned long long dims[5], strides[4];
  unsigned box[5], ones[5];
  unsigned long long stride = m.elem_bytes;
  for (uint32_t i = 0; i < m.rank; ++i) {
    dims[i] = m.dims[i];
    box[i] = m.box[i];
    ones[i] = 1;
    if (i > 0) strides[i - 1] = stride;  // bytes, of dimensions 1 .. rank - 1
    stride *= m.dims[i];
  }
  const CUresult r = d.cuTensorMapEncodeTiled(out->bytes, type, m.rank, address, dims, strides,
                                              box, ones, /*interleave=*/0, swizzle,
                                              /*l2_promotion=128B*/ 2, /*oob_fill=zeros*/ 0);
  return r == kCudaSuccess ? std::string() : "cuTensorMapEncodeTiled: " + d.describe(r);
}

// Encoded tensor maps, so that launches on the same buffers do not encode again: XLA hands a
// kernel the same addresses call after call (its buffer assignment is static per executable),
// and cuTensorMapEncodeTiled costs microseconds on every launch. A map's bytes are a function
// of the key alone (the address, the shape and the box, the swizzle and the element size: the
// other arguments are constants of encode_tensor_map), plus the context, so that two devices'
// maps never mix. Least recently used entries go past kCapacity; failures are not kept (the
// next launch reports them again). Thread-safe: XLA may launch from several threads.
class TensorMapCache {
 public:
  static constexpr size_t kCapacity = 256;

  std::string get(const Driver& d, CUcontext ctx, const TensorMapDesc& m, void* address,
                  TensorMapBytes* out) {
    Key key{ctx, address, m.elem_bytes, m.rank, m.dims, m.box, m.swizzle};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = index_.find(key); it != index_.end()) {
        order_.splice(order_.begin(), order_, it->second);  // now the most recent
        *out = it->second->second;
        return "";
      }
    }
    // Encoded outside the lock: two threads racing on one key both encode the same bytes.
    if (std::string why = encode_tensor_map(d, m, address, out); !why.empty()) return why;
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(key) == 0) {
      order_.emplace_front(key, *out);
      index_.emplace(key, order_.begin());
      if (order_.size() > kCapacity) {
        index_.erase(order_.back().first);
        order_.pop_back();
      }
    }
    return "";
  }

 private:
  using Key = std::tuple<CUcontext, void*, uint32_t, uint32_t, std::array<uint64_t, 5>,
                         std::array<uint32_t, 5>, uint32_t>;
  std::mutex mu_;
  std::list<std::pair<Key, TensorMapBytes>> order_;  // most recently used first
  std::map<Key, std::list<std::pair<Key, TensorMapBytes>>::iterator> index_;
};

// The handler's skeleton over CUDA's driver API: a module per context.
struct Cuda {
  static constexpr const char* kVendor = "CUDA";
  static constexpr const char* kWhere = "context";
  static constexpr bool kLaunchInScope = true;  // a launch on a stream of that context
  using Api = Driver;
  using Status = CUresult;
  static constexpr Status kSuccess = kCudaSuccess;
  using Stream = CUstream;
  using Where = CUcontext;
  using Function = CUfunction;

  static const Driver* api(std::string* why) { return driver(why); }
  static CUresult where_of(const Driver& d, CUstream stream, CUcontext* ctx) {
    return d.cuStreamGetCtx(stream, ctx);
  }
  static CUresult current(const Driver& d, CUcontext* ctx) { return d.cuCtxGetCurrent(ctx); }
  static CUresult make_current(const Driver& d, CUcontext ctx) {
    return d.cuCtxPushCurrent(ctx);
  }
  static void restore(const Driver& d, CUcontext) {
    CUcontext ignored;
    d.cuCtxPopCurrent(&ignored);
  }
  static std::string name_of(std::string_view key, std::string_view payload) {
    return decode_cuda_payload(key, payload).name;
  }
  // The payload's cubin loaded into `ctx`; throws std::runtime_error with the whole message.
  static std::unique_ptr<Kernel> load(const Driver& d, CUcontext ctx, std::string_view key,
                                      std::string_view payload);
  // The handler's tensor-map builder for `tmap` parameters in `ctx`: cuTensorMapEncodeTiled
  // through the process's cache.
  static TensorMapEncoder tensor_maps(const Driver& d, CUcontext ctx) {
    static TensorMapCache cache;
    return [&d, ctx](const TensorMapDesc& m, void* address, TensorMapBytes* out) {
      return cache.get(d, ctx, m, address, out);
    };
  }
  static CUresult launch(const Driver& d, CUfunction fn, const std::array<unsigned, 3>& grid,
                         const LaunchSpec& s, CUstream stream, void** params) {
    return d.cuLaunchKernel(fn, grid[0], grid[1], grid[2], s.block[0], s.block[1],
                            s.block[2], s.dynamic_smem, stream, params, nullptr);
  }
};

std::unique_ptr<Kernel> Cuda::load(const Driver& d, CUcontext ctx, std::string_view key,
                                   std::string_view payload) {
  CudaPayload p = decode_cuda_payload(key, payload);  // PayloadError names the kernel
  auto k = std::make_unique<Kernel>();
  k->name = p.name;
  try {
    k->spec = parse_launch(p.launch);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(who(p.name, key) + ": " + e.what());
  }
  auto check = [&](CUresult r, const std::string& what) {
    if (r != kCudaSuccess) {
      throw std::runtime_error(who(p.name, key) + ": " + what + " failed: " + d.describe(r));
    }
  };
  gpu::CurrentScope<Cuda> scope(d, ctx);
  check(scope.status(), "making the stream's context current");
  // A cubin runs on drivers of its toolkit's CUDA major version (minor version
  // compatibility), its PTX on drivers of the PTX's CUDA version or newer.
  const int driver_version = d.cuda_version();
  const int ptx_needs = ptx_cuda_version(p.ptx);
  if (driver_version > 0 && ptx_needs / 1000 > driver_version / 1000) {
    throw std::runtime_error(who(p.name, key) + " cannot run: " +
                             too_old(driver_version, ptx_needs));
  }
  CUmodule module = nullptr;
  CUresult loaded = d.cuModuleLoadData(&module, p.cubin.data());
  std::string what = "loading its cubin (compiled for " + p.arch + ") into the device's context";
  if (loaded == kCudaErrorNoBinaryForGpu && !p.ptx.empty()) {
    // A GPU of a newer family: the driver compiles the PTX for it (once per process).
    if (driver_version > 0 && ptx_needs > driver_version) {
      throw std::runtime_error(who(p.name, key) + ": its cubin (" + p.arch + ") is not for " +
                               "this GPU and its PTX cannot be compiled here: " +
                               too_old(driver_version, ptx_needs));
    }
    loaded = d.cuModuleLoadData(&module, p.ptx.c_str());
    what = "compiling its PTX (for " + p.arch + " and later) for this GPU, whose family the " +
           "cubin is not for,";
  } else if (loaded == kCudaErrorNoBinaryForGpu) {
    what += " (it carries no PTX: compiled for an architecture-specific target)";
  }
  if (loaded != kCudaSuccess && driver_version > 0) {
    what += " with a driver for CUDA " + cuda_version_text(driver_version);
  }
  check(loaded, what);
  check(d.cuModuleGetFunction(&k->fn, module, p.symbol.c_str()),
        "finding its function '" + p.symbol + "' in the cubin");
  if (k->spec.dynamic_smem > 48 * 1024) {
    check(d.cuFuncSetAttribute(k->fn, kFuncAttrMaxDynamicSharedBytes,
                               static_cast<int>(k->spec.dynamic_smem)),
          "opting into " + std::to_string(k->spec.dynamic_smem) +
              " bytes of dynamic shared memory");
  }
  return k;
}

}  // namespace

std::string launch(CUstream stream, std::string_view key, std::string_view payload,
                   void* const* buffers, size_t num_buffers, const BufferDims* dims) {
  return gpu::Handler<Cuda>::launch(stream, key, payload, buffers, num_buffers, dims);
}

std::string load(CUstream stream, std::string_view key, std::string_view payload) {
  return gpu::Handler<Cuda>::load(stream, key, payload);
}

}  // namespace jaxtile::cuda
