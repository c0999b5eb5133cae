#include "rocm/kernels.h"

#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "common/payload.h"

namespace jaxtile::rocm {
namespace {

struct Kernel {
  std::string name;
  hipFunction_t fn;
  LaunchSpec spec;
};

// Orders (device, key) pairs, looked up without copying the key.
struct Less {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return a.first != b.first ? a.first < b.first
                              : std::string_view(a.second) < std::string_view(b.second);
  }
};

// Kernels are never unloaded (keys name immutable code objects), so pointers stay valid.
std::mutex g_mutex;
std::map<std::pair<hipDevice_t, std::string>, std::unique_ptr<Kernel>, Less> g_kernels;

std::string who(std::string_view name, std::string_view key) {
  return "jaxtile: HIP kernel '" + std::string(name) + "' (key " +
         std::string(key.substr(0, 16)) + "...)";
}

// The kernel's name from its payload, for messages where loading failed before decoding.
std::string name_in(std::string_view key, std::string_view payload) {
  try {
    return decode_hip_payload(key, payload).name;
  } catch (const std::exception&) {
    return "?";
  }
}

// Makes `device` the calling thread's current one for the scope, as loading a module into it
// needs (HIP loads modules into the current device): XLA has the stream's device current on
// its thread already (then nothing changes), but a thread of another runtime may not.
class DeviceScope {
 public:
  DeviceScope(const Runtime& r, hipDevice_t device) : r_(r) {
    status_ = r.hipGetDevice(&previous_);
    if (status_ == kHipSuccess && previous_ != device) {
      status_ = r.hipSetDevice(device);
      switched_ = status_ == kHipSuccess;
    }
  }
  ~DeviceScope() {
    if (switched_) r_.hipSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  hipError_t status() const { return status_; }

 private:
  const Runtime& r_;
  hipDevice_t previous_ = 0;
  hipError_t status_;
  bool switched_ = false;
};

// The code object in `p` for `device`'s architecture (its gcnArchName without the feature
// flags); throws std::runtime_error naming both when there is none.
const HipCodeObject& code_for(const Runtime& r, hipDevice_t device, const HipPayload& p,
                              std::string_view key) {
  std::string isa;
  if (hipError_t e = r.arch_name(device, &isa); e != kHipSuccess) {
    throw std::runtime_error(who(p.name, key) + ": asking device " + std::to_string(device) +
                             " for its architecture failed: " + r.describe(e));
  }
  const std::string arch = isa.substr(0, isa.find(':'));
  if (const HipCodeObject* c = p.for_arch(arch)) return *c;
  throw std::runtime_error(
      who(p.name, key) + ": it has no code object for device " + std::to_string(device) +
      ", a " + arch + " (" + isa + "): it carries code for " + p.archs() + " only; run it on " +
      "a GPU of one of those, or lower or export it again for " + arch + " if jaxtile " +
      "supports it (JAXTILE_ROCM_ARCHS names the architectures an export compiles for)");
}

// Loads the payload's code object for `device`'s architecture there; throws
// std::runtime_error with the whole message.
std::unique_ptr<Kernel> load_kernel(const Runtime& r, hipDevice_t device, std::string_view key,
                                    std::string_view payload) {
  const HipPayload p = decode_hip_payload(key, payload);  // PayloadError names the kernel
  const HipCodeObject& code = code_for(r, device, p, key);
  auto k = std::make_unique<Kernel>();
  k->name = p.name;
  try {
    k->spec = parse_launch(code.launch);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(who(p.name, key) + ": " + e.what());
  }
  auto check = [&](hipError_t e, const std::string& what) {
    if (e != kHipSuccess) {
      throw std::runtime_error(who(p.name, key) + ": " + what + " failed: " + r.describe(e));
    }
  };
  DeviceScope scope(r, device);
  check(scope.status(), "making the stream's device " + std::to_string(device) + " current");
  hipModule_t module = nullptr;
  std::string what = "loading its code object (compiled for " + code.arch + ") on device " +
                     std::to_string(device);
  const hipError_t loaded = r.hipModuleLoadData(&module, code.code_object.data());
  if (loaded == kHipErrorNoBinaryForGpu) {
    // The architecture matched: the runtime refused something finer (the code object's
    // xnack or sramecc setting against the device's).
    what += " (the device's architecture matches: its feature flags may not)";
  }
  check(loaded, what);
  check(r.hipModuleGetFunction(&k->fn, module, code.symbol.c_str()),
        "finding its function '" + code.symbol + "' in the code object");
  return k;
}

const Kernel& find_or_load(const Runtime& r, hipDevice_t device, std::string_view key,
                           std::string_view payload) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_kernels.find(std::make_pair(device, key));
  if (it == g_kernels.end()) {
    it = g_kernels
             .emplace(std::make_pair(device, std::string(key)),
                      load_kernel(r, device, key, payload))
             .first;
  }
  return *it->second;
}

std::string run(const Runtime& r, const Kernel& k, std::string_view key, hipStream_t stream,
                void* const* buffers, size_t num_buffers, const BufferDims* dims) {
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
  // A launch goes to the stream's device whatever device is current: nothing to switch.
  const auto& grid = args->grid();
  const hipError_t e = r.hipModuleLaunchKernel(k.fn, grid[0], grid[1], grid[2], s.block[0],
                                               s.block[1], s.block[2], s.dynamic_smem, stream,
                                               args->pointers(), nullptr);
  if (e != kHipSuccess) {
    return who(k.name, key) + " failed to launch (" + s.describe() + "): " + r.describe(e);
  }
  return "";
}

struct Resolved {
  const Runtime* runtime;
  const Kernel* kernel;
};

// The runtime and the kernel loaded on the stream's device; throws with the whole message.
Resolved resolve(hipStream_t stream, std::string_view key, std::string_view payload) {
  std::string why;
  const Runtime* r = runtime(&why);
  if (r == nullptr) {
    throw std::runtime_error(who(name_in(key, payload), key) + " cannot run: " + why);
  }
  hipDevice_t device = 0;
  if (hipError_t e = r->hipStreamGetDevice(stream, &device); e != kHipSuccess) {
    throw std::runtime_error(who(name_in(key, payload), key) +
                             ": cannot find the device of the stream XLA passed: " +
                             r->describe(e));
  }
  return {r, &find_or_load(*r, device, key, payload)};
}

}  // namespace

std::string launch(hipStream_t stream, std::string_view key, std::string_view payload,
                   void* const* buffers, size_t num_buffers, const BufferDims* dims) {
  try {
    const Resolved r = resolve(stream, key, payload);
    return run(*r.runtime, *r.kernel, key, stream, buffers, num_buffers, dims);
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string load(hipStream_t stream, std::string_view key, std::string_view payload) {
  try {
    resolve(stream, key, payload);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace jaxtile::rocm
