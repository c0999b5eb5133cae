#include "registry.h"

#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <unordered_map>

#include "library.h"

namespace jaxtile {
namespace {

constexpr std::string_view kSymbolPrefix = "__tvm_ffi_";

struct Registry {
  std::shared_mutex mu;
  // Keys view into the Kernel they map to, so lookups from the hot path never allocate.
  std::unordered_map<std::string_view, std::unique_ptr<Kernel>> kernels;
  std::mutex load_mu;  // serialises dlopen + binding without blocking lookups
};

Registry& registry() {
  // Leaked on purpose: XLA may run a kernel from another thread during interpreter shutdown.
  static auto* r = new Registry;
  return *r;
}

KernelFn find_symbol(void* handle, const std::string& path, const std::string& symbol) {
  std::string tried = symbol;
  void* fn = dlsym(handle, symbol.c_str());
  if (fn == nullptr && symbol.rfind(kSymbolPrefix, 0) != 0) {
    tried = std::string(kSymbolPrefix) + symbol;
    fn = dlsym(handle, tried.c_str());
  }
  if (fn == nullptr) {
    throw std::runtime_error("jaxtile: kernel library '" + path + "' has no symbol '" + tried +
                             "'");
  }
  return reinterpret_cast<KernelFn>(fn);
}

}  // namespace

const Kernel& load_kernel(const std::string& key, const std::string& path,
                          const std::string& symbol, int64_t num_blocks, int64_t alignment,
                          const std::string& origin) {
  if (key.empty()) throw std::invalid_argument("jaxtile: kernel key must not be empty");
  if (num_blocks < 0) throw std::invalid_argument("jaxtile: num_blocks must be >= 0");
  if (alignment < 1 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("jaxtile: alignment must be a power of two");
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> load_lock(r.load_mu);
  if (const Kernel* k = find_kernel(key)) return *k;

  void* handle = open_kernel_library(path);
  const std::string& where = origin.empty() ? path : origin;
  auto kernel = std::make_unique<Kernel>(
      Kernel{key, where, symbol, find_symbol(handle, where, symbol), num_blocks, alignment});
  const Kernel& ref = *kernel;
  std::unique_lock<std::shared_mutex> lock(r.mu);
  r.kernels.emplace(ref.key, std::move(kernel));
  return ref;
}

const Kernel* find_kernel(std::string_view key) {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mu);
  auto it = r.kernels.find(key);
  return it == r.kernels.end() ? nullptr : it->second.get();
}

std::vector<std::string> loaded_keys() {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mu);
  std::vector<std::string> keys;
  keys.reserve(r.kernels.size());
  for (const auto& entry : r.kernels) keys.emplace_back(entry.first);
  return keys;
}

}  // namespace jaxtile
