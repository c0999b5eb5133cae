#include "cpu/loader.h"

#include <dlfcn.h>

#include <memory>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "cpu/library.h"
#include "cpu/signature.h"

namespace jaxtile {
namespace {

constexpr std::string_view kSymbolPrefix = "__tvm_ffi_";

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
                          const std::string& signature, const std::string& origin) {
  if (key.empty()) throw std::invalid_argument("jaxtile: kernel key must not be empty");
  if (num_blocks < 0) throw std::invalid_argument("jaxtile: num_blocks must be >= 0");
  if (alignment < 1 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("jaxtile: alignment must be a power of two");
  }
  return register_kernel(key, [&] {
    // Parsed before the library is opened: a bad signature loads nothing.
    std::shared_ptr<const Signature> sig;
    if (!signature.empty()) sig = std::make_shared<const Signature>(parse_signature(signature));
    void* handle = open_kernel_library(path);
    const std::string& where = origin.empty() ? path : origin;
    return std::make_unique<Kernel>(Kernel{key, where, symbol,
                                           find_symbol(handle, where, symbol), num_blocks,
                                           alignment, std::move(sig)});
  });
}

}  // namespace jaxtile
