#include "cuda/driver.h"

#include <dlfcn.h>

#include <mutex>
#include <utility>

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
                  resolve(lib, "cuDriverGetVersion", &d.cuDriverGetVersion, &l.error) &&
                  resolve(lib, "cuStreamGetCtx", &d.cuStreamGetCtx, &l.error) &&
                  resolve(lib, "cuCtxPushCurrent_v2", &d.cuCtxPushCurrent, &l.error) &&
                  resolve(lib, "cuCtxPopCurrent_v2", &d.cuCtxPopCurrent, &l.error) &&
                  resolve(lib, "cuCtxGetCurrent", &d.cuCtxGetCurrent, &l.error) &&
                  resolve(lib, "cuModuleLoadData", &d.cuModuleLoadData, &l.error) &&
                  resolve(lib, "cuModuleGetFunction", &d.cuModuleGetFunction, &l.error) &&
                  resolve(lib, "cuFuncSetAttribute", &d.cuFuncSetAttribute, &l.error) &&
                  resolve(lib, "cuLaunchKernel", &d.cuLaunchKernel, &l.error);
  if (!ok) return l;
  d.cuTensorMapEncodeTiled = reinterpret_cast<decltype(d.cuTensorMapEncodeTiled)>(
      dlsym(lib, "cuTensorMapEncodeTiled"));
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

int Driver::cuda_version() const {
  int v = 0;
  return cuDriverGetVersion(&v) == kCudaSuccess ? v : 0;
}

std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

int cuda_version_for_ptx_isa(int major, int minor) {
  // CUDA 12.6 kept ISA 8.5, so 8.6 onwards is one CUDA minor ahead.
  if (major == 8 && minor >= 6) return 12000 + 10 * (minor + 1);
  return 1000 * (major + 4) + 10 * minor;
}

int driver_release_for_cuda(int version) {
  // CUDA version -> first Linux driver branch that supports it (CUDA's release notes).
  static constexpr std::pair<int, int> kReleases[] = {
      {13010, 590}, {13000, 580}, {12090, 575}, {12080, 570}, {12060, 560},
      {12050, 555}, {12040, 550}, {12030, 545}, {12020, 535}, {12010, 530}, {12000, 525}};
  for (const auto& [cuda, release] : kReleases) {
    if (version == cuda) return release;
  }
  return 0;
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
