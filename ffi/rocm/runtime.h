// The few HIP runtime entry points jaxtile's ROCm handler needs, resolved at run time.
//
// libamdhip64.so is opened on first use, never at import: a machine without ROCm imports
// jaxtile and runs CPU kernels as usual, and a ROCm launch there fails with a message saying
// so. The types are declared here (the module API's signatures mirror CUDA's driver API and
// have been stable since ROCm 5), so no HIP header is needed to build.
#pragma once

#include <cstddef>
#include <string>

namespace jaxtile::rocm {

using hipError_t = int;
using hipDevice_t = int;
using hipModule_t = struct ihipModule_t*;
using hipFunction_t = struct ihipModuleSymbol_t*;
using hipStream_t = struct ihipStream_t*;

constexpr hipError_t kHipSuccess = 0;
// hipErrorNoBinaryForGpu: a code object for another gfx architecture.
constexpr hipError_t kHipErrorNoBinaryForGpu = 209;

// hipDeviceProp_tR0600, the device properties' layout since ROCm 6 (hip_runtime_api.h; the
// versioned name keeps it fixed), of which only the ISA's name is read: `char
// gcnArchName[256]` after name[256], the UUID, the LUID and the limits up to hipReserved[32].
// The same in ROCm 6.3's and ROCm 7's headers (LP64); tests/ffi/rocm/
// test_hip_device_prop_layout.py lays the struct out member by member and checks these.
constexpr size_t kDevicePropBytes = 1472;
constexpr size_t kGcnArchNameOffset = 1160;
constexpr size_t kGcnArchNameBytes = 256;

struct Runtime {
  hipError_t (*hipInit)(unsigned flags);
  const char* (*hipGetErrorName)(hipError_t);
  const char* (*hipGetErrorString)(hipError_t);
  hipError_t (*hipGetDevice)(hipDevice_t*);
  hipError_t (*hipSetDevice)(hipDevice_t);
  hipError_t (*hipStreamGetDevice)(hipStream_t, hipDevice_t*);
  // Fills kDevicePropBytes bytes at `prop` (hipDeviceProp_tR0600).
  hipError_t (*hipGetDevicePropertiesR0600)(void* prop, hipDevice_t);
  hipError_t (*hipModuleLoadData)(hipModule_t*, const void* image);
  hipError_t (*hipModuleGetFunction)(hipFunction_t*, hipModule_t, const char* name);
  hipError_t (*hipModuleLaunchKernel)(hipFunction_t, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz,
                                      unsigned shared_bytes, hipStream_t, void** params,
                                      void** extra);

  // "hipErrorX: description" for a result code.
  std::string describe(hipError_t r) const;
  // The device's ISA as HIP names it, with its feature flags ("gfx942:sramecc+:xnack-").
  hipError_t arch_name(hipDevice_t device, std::string* name) const;
};

// Where the runtime is looked for: $JAXTILE_HIP_RUNTIME (a path or a library name) if set,
// else the names ROCm installs (libamdhip64.so, .so.7, .so.6) on the loader's path, then
// /opt/rocm/lib. Inside a process where JAX's ROCm plugin runs, the plugin has loaded it
// already and the same library is found.
constexpr const char* kRuntimeEnv = "JAXTILE_HIP_RUNTIME";

// The runtime, loaded and initialised on the first call (thread-safe); null if it cannot be,
// with `*why` saying what failed (no libamdhip64, a missing symbol, hipInit's error).
const Runtime* runtime(std::string* why);

}  // namespace jaxtile::rocm
