#include "rocm/runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace jaxtile::rocm {
namespace {

struct Loaded {
  Runtime api{};
  std::string error;  // empty when `api` is usable
};

template <typename Fn>
bool resolve(void* lib, const std::string& from, const char* name, Fn* out,
             std::string* error) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr) *error = from + " lacks " + name + " (ROCm older than 6?)";
  return *out != nullptr;
}

// Opens the runtime; on failure says which names were tried and why the last one failed.
void* open_library(std::string* opened, std::string* error) {
  // RTLD_LOCAL: the symbols are ours to look up, not to interpose on anyone's.
  if (const char* env = std::getenv(kRuntimeEnv); env != nullptr && *env != '\0') {
    void* lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      *error = std::string("the HIP runtime $") + kRuntimeEnv + "=" + env +
               " could not be loaded (" + (e ? e : "unknown error") + ")";
    }
    *opened = env;
    return lib;
  }
  static constexpr const char* kNames[] = {"libamdhip64.so", "libamdhip64.so.7",
                                           "libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so"};
  std::string last;
  for (const char* name : kNames) {
    if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL); lib != nullptr) {
      *opened = name;
      return lib;
    }
    const char* e = dlerror();
    last = e ? e : "unknown error";
  }
  *error = "the AMD HIP runtime libamdhip64.so could not be loaded (" + last +
           "): this machine has no usable ROCm install (ROCm 6 or newer, with the GPU "
           "driver); set $" + kRuntimeEnv + " to the library's path if it is elsewhere";
  return nullptr;
}

Loaded load() {
  Loaded l;
  std::string from;
  void* lib = open_library(&from, &l.error);
  if (lib == nullptr) return l;
  Runtime& r = l.api;
  const bool ok =
      resolve(lib, from, "hipInit", &r.hipInit, &l.error) &&
      resolve(lib, from, "hipGetErrorName", &r.hipGetErrorName, &l.error) &&
      resolve(lib, from, "hipGetErrorString", &r.hipGetErrorString, &l.error) &&
      resolve(lib, from, "hipGetDevice", &r.hipGetDevice, &l.error) &&
      resolve(lib, from, "hipSetDevice", &r.hipSetDevice, &l.error) &&
      resolve(lib, from, "hipStreamGetDevice", &r.hipStreamGetDevice, &l.error) &&
      resolve(lib, from, "hipGetDevicePropertiesR0600", &r.hipGetDevicePropertiesR0600,
              &l.error) &&
      resolve(lib, from, "hipModuleLoadData", &r.hipModuleLoadData, &l.error) &&
      resolve(lib, from, "hipModuleGetFunction", &r.hipModuleGetFunction, &l.error) &&
      resolve(lib, from, "hipModuleLaunchKernel", &r.hipModuleLaunchKernel, &l.error);
  if (!ok) return l;
  if (hipError_t e = r.hipInit(0); e != kHipSuccess) {
    l.error = "hipInit failed: " + r.describe(e);
  }
  return l;
}

}  // namespace

std::string Runtime::describe(hipError_t r) const {
  const char* name = hipGetErrorName(r);
  const char* text = hipGetErrorString(r);
  return (name ? std::string(name) : "HIP error " + std::to_string(r)) + ": " +
         (text ? text : "(no description)");
}

hipError_t Runtime::arch_name(hipDevice_t device, std::string* name) const {
  // Zeroed, so that a name filling its whole field still ends.
  std::vector<char> prop(kDevicePropBytes + 1, '\0');
  const hipError_t e = hipGetDevicePropertiesR0600(prop.data(), device);
  if (e == kHipSuccess) {
    const char* text = prop.data() + kGcnArchNameOffset;
    *name = std::string(text, strnlen(text, kGcnArchNameBytes));
  }
  return e;
}

const Runtime* runtime(std::string* why) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.error.empty()) {
    *why = loaded.error;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace jaxtile::rocm
