#include "rocm/kernels.h"

#include <array>
#include <memory>
#include <stdexcept>

#include "common/gpu_kernels.h"
#include "common/payload.h"

namespace jaxtile::rocm {
namespace {

using Kernel = gpu::Kernel<hipFunction_t>;

std::string who(std::string_view name, std::string_view key) {
  return gpu::who("HIP", name, key);
}

// The handler's skeleton over HIP's module API: a module per device.
struct Hip {
  static constexpr const char* kVendor = "HIP";
  static constexpr const char* kWhere = "device";
  // A launch goes to the stream's device whatever device is current: nothing to switch.
  static constexpr bool kLaunchInScope = false;
  using Api = Runtime;
  using Status = hipError_t;
  static constexpr Status kSuccess = kHipSuccess;
  using Stream = hipStream_t;
  using Where = hipDevice_t;
  using Function = hipFunction_t;

  static const Runtime* api(std::string* why) { return runtime(why); }
  static hipError_t where_of(const Runtime& r, hipStream_t stream, hipDevice_t* device) {
    return r.hipStreamGetDevice(stream, device);
  }
  // HIP loads modules into the current device.
  static hipError_t current(const Runtime& r, hipDevice_t* device) {
    return r.hipGetDevice(device);
  }
  static hipError_t make_current(const Runtime& r, hipDevice_t device) {
    return r.hipSetDevice(device);
  }
  static void restore(const Runtime& r, hipDevice_t previous) { r.hipSetDevice(previous); }
  static std::string name_of(std::string_view key, std::string_view payload) {
    return decode_hip_payload(key, payload).name;
  }
  // The payload's code object for `device`'s architecture loaded there; throws
  // std::runtime_error with the whole message.
  static std::unique_ptr<Kernel> load(const Runtime& r, hipDevice_t device,
                                      std::string_view key, std::string_view payload);
  // AMD GPUs have no TMA: no kernel for them takes a tensor map.
  static TensorMapEncoder tensor_maps(const Runtime&, hipDevice_t) { return {}; }
  static hipError_t launch(const Runtime& r, hipFunction_t fn,
                           const std::array<unsigned, 3>& grid, const LaunchSpec& s,
                           hipStream_t stream, void** params) {
    return r.hipModuleLaunchKernel(fn, grid[0], grid[1], grid[2], s.block[0], s.block[1],
                                   s.block[2], s.dynamic_smem, stream, params, nullptr);
  }
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

std::unique_ptr<Kernel> Hip::load(const Runtime& r, hipDevice_t device, std::string_view key,
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
  gpu::CurrentScope<Hip> scope(r, device);
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

}  // namespace

std::string launch(hipStream_t stream, std::string_view key, std::string_view payload,
                   void* const* buffers, size_t num_buffers, const BufferDims* dims) {
  return gpu::Handler<Hip>::launch(stream, key, payload, buffers, num_buffers, dims);
}

std::string load(hipStream_t stream, std::string_view key, std::string_view payload) {
  return gpu::Handler<Hip>::load(stream, key, payload);
}

}  // namespace jaxtile::rocm
