#include "cuda/driver.h"

#include <dlfcn.h>

#include <mutex>

namespace jaxtile::cuda {
namespace {

struct Loaded {
  Driver api{};
  std::string error;  // empty when `api` is usable
};

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* out, std::string* error) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr) *error = std::string("libcuda.so.1 lacks ") + name + " (driver too old?)";
  return *out != nullptr;
}

Loaded load() {
  Loaded l;
  // RTLD_LOCAL: the symbols are ours to look up, not to interpose on anyone's.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    l.error = std::string("the NVIDIA driver library libcuda.so.1 could not be loaded (") +
              (e ? e : "unknown error") + "): this machine has no usable NVIDIA driver";
    return l;
  }
  Driver& d = l.api;
  // The _v2 names are the current ABI of these entry points (cuda.h #defines them so).
  const bool ok = resolve(lib, "cuInit", &d.cuInit, &l.error) &&
                  resolve(lib, "cuGetErrorName", &d.cuGetErrorName, &l.error) &&
                  resolve(lib, "cuGetErrorString", &d.cuGetErrorString, &l.error) &&
                  resolve(lib, "cuStreamGetCtx", &d.cuStreamGetCtx, &l.error) &&
                  resolve(lib, "cuCtxPushCurrent_v2", &d.cuCtxPushCurrent, &l.error) &&
                  resolve(lib, "cuCtxPopCurrent_v2", &d.cuCtxPopCurrent, &l.error) &&
                  resolve(lib, "cuModuleLoadData", &d.cuModuleLoadData, &l.error) &&
                  resolve(lib, "cuModuleGetFunction", &d.cuModuleGetFunction, &l.error) &&
                  resolve(lib, "cuFuncSetAttribute", &d.cuFuncSetAttribute, &l.error) &&
                  resolve(lib, "cuLaunchKernel", &d.cuLaunchKernel, &l.error);
  if (!ok) return l;
  if (CUresult r = d.cuInit(0); r != kCudaSuccess) {
    l.error = "cuInit failed: " + d.describe(r);
  }
  return l;
}

}  // namespace

std::string Driver::describe(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(r, &name);
  cuGetErrorString(r, &text);
  return (name ? std::string(name) : "CUDA error " + std::to_string(r)) + ": " +
         (text ? text : "(no description)");
}

const Driver* driver(std::string* why) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.error.empty()) {
    *why = loaded.error;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace jaxtile::cuda
