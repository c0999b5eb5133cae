#include "cpu/loader.h"

#include <dlfcn.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu/elf_object.h"
#include "cpu/library.h"
#include "cpu/signature.h"

namespace jaxtile {
namespace {

constexpr std::string_view kSymbolPrefix = "__tvm_ffi_";

// The names to look the entry point up by: `symbol`, then `__tvm_ffi_<symbol>`.
std::vector<std::string> entry_names(const std::string& symbol) {
  if (symbol.rfind(kSymbolPrefix, 0) == 0) return {symbol};
  return {symbol, std::string(kSymbolPrefix) + symbol};
}

KernelFn find_symbol(void* handle, const std::string& where, const std::string& symbol) {
  const std::vector<std::string> names = entry_names(symbol);
  for (const std::string& name : names) {
    if (void* fn = dlsym(handle, name.c_str())) return reinterpret_cast<KernelFn>(fn);
  }
  throw std::runtime_error("jaxtile: kernel library '" + where + "' has no symbol '" +
                           names.back() + "'");
}

void check_arguments(const std::string& key, int64_t num_blocks, int64_t alignment) {
  if (key.empty()) throw std::invalid_argument("jaxtile: kernel key must not be empty");
  if (num_blocks < 0) throw std::invalid_argument("jaxtile: num_blocks must be >= 0");
  if (alignment < 1 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("jaxtile: alignment must be a power of two");
  }
}

// Parsed before anything is loaded: a bad signature loads nothing.
std::shared_ptr<const Signature> parse(const std::string& signature) {
  if (signature.empty()) return nullptr;
  return std::make_shared<const Signature>(parse_signature(signature));
}

KernelFn link(std::string_view object, const std::string& where, const std::string& symbol) {
  return reinterpret_cast<KernelFn>(link_object(object, entry_names(symbol), where));
}

// The file's contents if it is a relocatable object; empty for anything else.
std::string read_if_object(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char header[18] = {};
  if (!in.read(header, sizeof(header)) ||
      !is_relocatable_object(std::string_view(header, sizeof(header)))) {
    return {};
  }
  in.seekg(0);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw std::runtime_error("jaxtile: cannot read kernel object '" + path + "'");
  return bytes;
}

}  // namespace

const Kernel& load_kernel(const std::string& key, const std::string& path,
                          const std::string& symbol, int64_t num_blocks, int64_t alignment,
                          const std::string& signature, const std::string& origin) {
  check_arguments(key, num_blocks, alignment);
  return register_kernel(key, [&] {
    std::shared_ptr<const Signature> sig = parse(signature);
    const std::string& where = origin.empty() ? path : origin;
    KernelFn fn = nullptr;
    if (const std::string object = read_if_object(path); !object.empty()) {
      fn = link(object, where, symbol);
    } else {
      fn = find_symbol(open_kernel_library(path), where, symbol);
    }
    return std::make_unique<Kernel>(
        Kernel{key, where, symbol, fn, num_blocks, alignment, std::move(sig)});
  });
}

const Kernel& load_object_kernel(const std::string& key, std::string_view object,
                                 const std::string& symbol, int64_t num_blocks,
                                 int64_t alignment, const std::string& signature,
                                 const std::string& origin) {
  check_arguments(key, num_blocks, alignment);
  return register_kernel(key, [&] {
    std::shared_ptr<const Signature> sig = parse(signature);
    KernelFn fn = link(object, origin, symbol);
    return std::make_unique<Kernel>(
        Kernel{key, origin, symbol, fn, num_blocks, alignment, std::move(sig)});
  });
}

}  // namespace jaxtile
