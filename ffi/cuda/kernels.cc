#include "cuda/kernels.h"

#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "common/payload.h"
#include "common/launch_spec.h"

namespace jaxtile::cuda {
namespace {

struct Kernel {
  std::string name;
  CUfunction fn;
  LaunchSpec spec;
};

// Orders (context, key) pairs, looked up without copying the key.
struct Less {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return a.first != b.first ? a.first < b.first
                              : std::string_view(a.second) < std::string_view(b.second);
  }
};

// Kernels are never unloaded (keys name immutable cubins), so pointers stay valid.
std::mutex g_mutex;
std::map<std::pair<CUcontext, std::string>, std::unique_ptr<Kernel>, Less> g_kernels;

std::string who(std::string_view name, std::string_view key) {
  return "jaxtile: CUDA kernel '" + std::string(name) + "' (key " +
         std::string(key.substr(0, 16)) + "...)";
}

// The kernel's name from its payload, for messages where loading failed before decoding.
std::string name_in(std::string_view key, std::string_view payload) {
  try {
    return decode_cuda_payload(key, payload).name;
  } catch (const std::exception&) {
    return "?";
  }
}

// Makes `ctx` current for the scope, as loading a module, setting a function's attribute and
// launching on a stream of `ctx` need: XLA usually has it current on its thread already (then
// nothing is pushed), but a thread of another runtime or a call after a context switch may not.
class ContextScope {
 public:
  ContextScope(const Driver& d, CUcontext ctx) : d_(d) {
    CUcontext current = nullptr;
    status_ = d.cuCtxGetCurrent(&current);
    if (status_ == kCudaSuccess && current != ctx) {
      status_ = d.cuCtxPushCurrent(ctx);
      pushed_ = status_ == kCudaSuccess;
    }
  }
  ~ContextScope() {
    CUcontext ignored;
    if (pushed_) d_.cuCtxPopCurrent(&ignored);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  CUresult status() const { return status_; }

 private:
  const Driver& d_;
  CUresult status_;
  bool pushed_ = false;
};

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

// Loads the payload's cubin into `ctx`; throws std::runtime_error with the whole message.
std::unique_ptr<Kernel> load(const Driver& d, CUcontext ctx, std::string_view key,
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
  ContextScope scope(d, ctx);
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

const Kernel& find_or_load(const Driver& d, CUcontext ctx, std::string_view key,
                           std::string_view payload) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_kernels.find(std::make_pair(ctx, key));
  if (it == g_kernels.end()) {
    it = g_kernels.emplace(std::make_pair(ctx, std::string(key)), load(d, ctx, key, payload))
             .first;
  }
  return *it->second;
}

std::string run(const Driver& d, CUcontext ctx, const Kernel& k, std::string_view key,
                CUstream stream, void* const* buffers, size_t num_buffers,
                const BufferDims* dims) {
  const LaunchSpec& s = k.spec;
  if (num_buffers < s.buffers_needed) {
    return who(k.name, key) + ": called with " + std::to_string(num_buffers) +
           " buffers, but its parameters use " + std::to_string(s.buffers_needed);
  }
  std::optional<LaunchArgs> args;
  try {
    args.emplace(s, buffers, dims, num_buffers);
  } catch (const std::invalid_argument& e) {
    return who(k.name, key) + ": " + e.what();
  }
  if (args->empty()) return "";  // no blocks (an empty batch): nothing to run
  // After the empty-grid exit: the buffers of an empty batch may be anywhere.
  if (std::string bad = misaligned(s, buffers); !bad.empty()) {
    return who(k.name, key) + ": " + bad;
  }
  ContextScope scope(d, ctx);
  if (scope.status() != kCudaSuccess) {
    return who(k.name, key) + ": making the stream's context current failed: " +
           d.describe(scope.status());
  }
  const auto& grid = args->grid();
  const CUresult r = d.cuLaunchKernel(k.fn, grid[0], grid[1], grid[2], s.block[0],
                                      s.block[1], s.block[2], s.dynamic_smem, stream,
                                      args->pointers(), nullptr);
  if (r != kCudaSuccess) {
    return who(k.name, key) + " failed to launch (" + s.describe() + "): " + d.describe(r);
  }
  return "";
}

struct Resolved {
  const Driver* driver;
  CUcontext ctx;
  const Kernel* kernel;
};

// The driver, the stream's context and the kernel loaded in it; throws with the whole message.
Resolved resolve(CUstream stream, std::string_view key,
                                                std::string_view payload) {
  std::string why;
  const Driver* d = driver(&why);
  if (d == nullptr) {
    throw std::runtime_error(who(name_in(key, payload), key) + " cannot run: " + why);
  }
  CUcontext ctx = nullptr;
  if (CUresult r = d->cuStreamGetCtx(stream, &ctx); r != kCudaSuccess) {
    throw std::runtime_error(who(name_in(key, payload), key) +
                             ": cannot find the context of the stream XLA passed: " +
                             d->describe(r));
  }
  return {d, ctx, &find_or_load(*d, ctx, key, payload)};
}

}  // namespace

std::string launch(CUstream stream, std::string_view key, std::string_view payload,
                   void* const* buffers, size_t num_buffers, const BufferDims* dims) {
  try {
    const Resolved r = resolve(stream, key, payload);
    return run(*r.driver, r.ctx, *r.kernel, key, stream, buffers, num_buffers, dims);
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string load(CUstream stream, std::string_view key, std::string_view payload) {
  try {
    resolve(stream, key, payload);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace jaxtile::cuda
