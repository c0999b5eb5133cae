#include "cpu/library.h"

#include <dlfcn.h>

#include <cstdint>
#include <utility>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "cpu/runtime_env.h"

#if defined(__linux__)
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace jaxtile {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("jaxtile: cannot load kernel library '" + path + "': " + why);
}

constexpr std::string_view kLibraryCtx = "__tvm_ffi__library_ctx";

void fill_slots_by_name(void* handle) {
  size_t count = 0;
  const RuntimeSymbol* fns = runtime_functions(&count);
  std::vector<std::string> names{std::string(kLibraryCtx)};
  for (size_t i = 0; i < count; ++i) names.push_back("__" + std::string(fns[i].name));
  for (const std::string& name : names) {
    if (void* slot = dlsym(handle, name.c_str())) {
      *static_cast<void**>(slot) = runtime_slot(name);
    }
  }
}

#if defined(__linux__)

#if defined(__x86_64__)
constexpr uint32_t kGlobDat = R_X86_64_GLOB_DAT;
constexpr uint32_t kJumpSlot = R_X86_64_JUMP_SLOT;
#elif defined(__aarch64__)
constexpr uint32_t kGlobDat = R_AARCH64_GLOB_DAT;
constexpr uint32_t kJumpSlot = R_AARCH64_JUMP_SLOT;
#else
#error "jaxtile: resolving kernel imports is only implemented for x86_64 and aarch64"
#endif

struct Range {
  uintptr_t begin, end;
};

struct ObjectInfo {
  uintptr_t base = 0;
  std::vector<Range> relro;
};

// GOT entries normally lie in the RELRO region, which the dynamic linker has made read-only.
std::vector<Range> relro_ranges(uintptr_t base) {
  ObjectInfo info{base, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* phdr, size_t, void* data) -> int {
        auto* out = static_cast<ObjectInfo*>(data);
        if (phdr->dlpi_addr != out->base) return 0;
        for (int i = 0; i < phdr->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = phdr->dlpi_phdr[i];
          if (ph.p_type == PT_GNU_RELRO) {
            uintptr_t start = out->base + ph.p_vaddr;
            out->relro.push_back({start, start + ph.p_memsz});
          }
        }
        return 1;
      },
      &info);
  return info.relro;
}

void write_pointer(void** where, void* value, const std::vector<Range>& relro) {
  auto addr = reinterpret_cast<uintptr_t>(where);
  bool protected_page = false;
  for (const Range& r : relro) protected_page |= addr >= r.begin && addr < r.end;
  if (!protected_page) {
    *where = value;
    return;
  }
  const uintptr_t page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* page = reinterpret_cast<void*>(addr & ~(page_size - 1));
  mprotect(page, page_size, PROT_READ | PROT_WRITE);
  *where = value;
  mprotect(page, page_size, PROT_READ);
}

// The generated code calls some runtime functions (e.g. TVMFFIErrorSetRaisedFromCStrParts)
// as plain undefined symbols and reaches slots through the GOT. Rewriting the library's own
// relocation targets binds them to jaxtile's implementations whatever else is loaded in the
// process: libtvm_ffi (pulled in by a TVM compile) must not capture a kernel's errors, and
// exporting these names globally ourselves would hijack libtvm_ffi's callers instead.
// Only lazily bound (PLT) imports can be rebound this way; an import taken by address would
// already have failed dlopen unless libtvm_ffi is loaded.
// Returns why the library cannot be used, or an empty string.
std::string bind_imports(void* handle) {
  link_map* lm = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || lm == nullptr) return "dlinfo failed";
  const uintptr_t base = lm->l_addr;
  // glibc relocates the dynamic section in place on these targets; other loaders may not.
  auto at = [base](uintptr_t p) { return p < base ? p + base : p; };

  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  // Dynamic relocations, then PLT relocations: {address, size in bytes} each.
  std::pair<uintptr_t, size_t> tables[2] = {};
  for (const ElfW(Dyn)* d = lm->l_ld; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = reinterpret_cast<const ElfW(Sym)*>(at(d->d_un.d_ptr)); break;
      case DT_STRTAB: strtab = reinterpret_cast<const char*>(at(d->d_un.d_ptr)); break;
      case DT_RELA: tables[0].first = at(d->d_un.d_ptr); break;
      case DT_RELASZ: tables[0].second = d->d_un.d_val; break;
      case DT_JMPREL: tables[1].first = at(d->d_un.d_ptr); break;
      case DT_PLTRELSZ: tables[1].second = d->d_un.d_val; break;
      default: break;
    }
  }
  if (symtab == nullptr || strtab == nullptr) return "it has no dynamic symbol table";

  const std::vector<Range> relro = relro_ranges(base);
  std::string missing;
  for (auto [address, size] : tables) {
    const auto* relocs = reinterpret_cast<const ElfW(Rela)*>(address);
    for (size_t i = 0; address != 0 && i < size / sizeof(ElfW(Rela)); ++i) {
      const uint32_t type = ELF64_R_TYPE(relocs[i].r_info);
      if (type != kGlobDat && type != kJumpSlot) continue;
      std::string_view name = strtab + symtab[ELF64_R_SYM(relocs[i].r_info)].st_name;
      auto** got = reinterpret_cast<void**>(base + relocs[i].r_offset);
      if (void* value = runtime_slot(name); value != nullptr && type == kGlobDat) {
        // The GOT holds the address of the slot the code really reads, which differs from
        // dlsym's answer if another object interposes the symbol.
        if (*got != nullptr) *static_cast<void**>(*got) = value;
      } else if (void* fn = runtime_function(name)) {
        write_pointer(got, fn, relro);
      } else if (name.substr(0, 3) == "TVM" || name.substr(0, 5) == "__TVM") {
        missing += missing.empty() ? "" : ", ";
        missing += name;
      }
    }
  }
  if (missing.empty()) return {};
  return "it needs TVM runtime functions jaxtile does not provide: " + missing;
}

#else  // !__linux__

std::string bind_imports(void*) { return {}; }

#endif

}  // namespace

void* runtime_slot(std::string_view name) {
  if (name == kLibraryCtx) return library_context();
  if (name.substr(0, 2) != "__") return nullptr;
  return runtime_function(name.substr(2));
}

void* open_kernel_library(const std::string& path) {
  // RTLD_LAZY so that imports we rebind ourselves need not resolve at load time.
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) fail(path, dlerror());
  fill_slots_by_name(handle);
  if (std::string why = bind_imports(handle); !why.empty()) {
    dlclose(handle);
    fail(path, why);
  }
  return handle;
}

}  // namespace jaxtile
