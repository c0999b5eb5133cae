#include "cpu/elf_object.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__linux__)
#include <dlfcn.h>
#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "cpu/library.h"
#include "cpu/runtime_env.h"

namespace jaxtile {

bool is_relocatable_object(std::string_view bytes) {
  // e_ident (16 bytes), then e_type as a little-endian 16-bit value.
  return bytes.size() >= 18 && bytes.substr(0, 4) == "\x7f" "ELF" && bytes[4] == 2 &&
         bytes[5] == 1 && bytes[16] == 1 && bytes[17] == 0;
}

#if defined(__linux__) && defined(__x86_64__)

namespace {

[[noreturn]] void malformed(const std::string& origin, const std::string& why) {
  throw std::invalid_argument("jaxtile: cannot link " + origin + ": it is malformed (" + why +
                              ")");
}

[[noreturn]] void unsupported(const std::string& origin, const std::string& why) {
  throw std::runtime_error("jaxtile: cannot link " + origin + ": " + why);
}

// Whether [offset, offset + size) lies within [0, total), without overflow.
bool within(uint64_t offset, uint64_t size, uint64_t total) {
  return offset <= total && size <= total - offset;
}

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

// The object's bytes, read through copies: a header field may point anywhere, aligned or not.
class Reader {
 public:
  Reader(std::string_view bytes, const std::string& origin) : bytes_(bytes), origin_(origin) {}

  template <typename T>
  T at(uint64_t offset, const char* what) const {
    if (!within(offset, sizeof(T), bytes_.size())) {
      malformed(origin_, std::string(what) + " lies beyond the end of the file");
    }
    T value;
    std::memcpy(&value, bytes_.data() + offset, sizeof(T));
    return value;
  }

  std::string_view bytes() const { return bytes_; }

 private:
  std::string_view bytes_;
  const std::string& origin_;
};

// Where the image's three regions put what: code (read+execute), constants and the GOT
// (read-only once linked), data (read+write).
enum Region { kCode, kConstants, kData, kRegions };

struct Placement {
  Region region = kData;
  uint64_t offset = 0;  // within its region
  bool loaded = false;
};

// The call stub for an undefined function: `jmp *slot(%rip)`, padded to 8 bytes.
constexpr uint64_t kStubBytes = 8;

class Linker {
 public:
  Linker(std::string_view bytes, const std::string& origin)
      : in_(bytes, origin), origin_(origin) {}

  void* link(const std::vector<std::string>& entry_names) {
    read_header();
    read_sections();
    read_symbols();
    plan();
    map();
    try {
      copy_sections();
      resolve_symbols();
      apply_relocations();
      fill_slots();
      void* entry = find_entry(entry_names);
      protect();
      return entry;
    } catch (...) {
      munmap(image_, image_size_);
      throw;
    }
  }

 private:
  void read_header() {
    const std::string_view bytes = in_.bytes();
    if (bytes.size() < sizeof(Elf64_Ehdr)) malformed(origin_, "shorter than an ELF header");
    eh_ = in_.at<Elf64_Ehdr>(0, "the ELF header");
    if (std::memcmp(eh_.e_ident, ELFMAG, SELFMAG) != 0) malformed(origin_, "not an ELF file");
    if (eh_.e_ident[EI_CLASS] != ELFCLASS64 || eh_.e_ident[EI_DATA] != ELFDATA2LSB) {
      unsupported(origin_, "it is not a 64-bit little-endian ELF object");
    }
    if (eh_.e_type != ET_REL) unsupported(origin_, "it is not a relocatable object (ET_REL)");
    if (eh_.e_machine != EM_X86_64) {
      unsupported(origin_, "it is for ELF machine " + std::to_string(eh_.e_machine) +
                               ", not x86-64 (62)");
    }
    if (eh_.e_shentsize != sizeof(Elf64_Shdr)) malformed(origin_, "bad section header size");
    if (eh_.e_shnum == 0 || eh_.e_shstrndx >= eh_.e_shnum) {
      malformed(origin_, "no section headers, or a bad section name table index");
    }
    if (!within(eh_.e_shoff, uint64_t{eh_.e_shnum} * sizeof(Elf64_Shdr), bytes.size())) {
      malformed(origin_, "the section headers lie beyond the end of the file");
    }
  }

  // The NUL-terminated string at `offset` of string table section `index`.
  std::string_view string_at(uint64_t index, uint64_t offset, const char* what) const {
    if (index >= sections_.size() || sections_[index].sh_type != SHT_STRTAB) {
      malformed(origin_, std::string(what) + " refers to a section that is no string table");
    }
    const Elf64_Shdr& s = sections_[index];
    if (offset >= s.sh_size) malformed(origin_, std::string(what) + " lies outside its table");
    const char* begin = in_.bytes().data() + s.sh_offset + offset;
    const void* end = std::memchr(begin, '\0', s.sh_size - offset);
    if (end == nullptr) malformed(origin_, std::string(what) + " is not terminated");
    return {begin, static_cast<size_t>(static_cast<const char*>(end) - begin)};
  }

  std::string section_name(uint64_t index) const {
    return std::string(string_at(eh_.e_shstrndx, sections_[index].sh_name, "a section name"));
  }

  void read_sections() {
    sections_.resize(eh_.e_shnum);
    for (uint64_t i = 0; i < sections_.size(); ++i) {
      sections_[i] = in_.at<Elf64_Shdr>(eh_.e_shoff + i * sizeof(Elf64_Shdr), "a section header");
      const Elf64_Shdr& s = sections_[i];
      if (s.sh_type != SHT_NOBITS && s.sh_type != SHT_NULL &&
          !within(s.sh_offset, s.sh_size, in_.bytes().size())) {
        malformed(origin_, "section " + std::to_string(i) + " lies beyond the end of the file");
      }
      if (s.sh_addralign > 1 && (s.sh_addralign & (s.sh_addralign - 1)) != 0) {
        malformed(origin_, "section " + std::to_string(i) + " has a bad alignment");
      }
    }
    placements_.resize(sections_.size());
    for (uint64_t i = 0; i < sections_.size(); ++i) {
      const Elf64_Shdr& s = sections_[i];
      const std::string name = section_name(i);
      const bool constructors = s.sh_type == SHT_INIT_ARRAY || s.sh_type == SHT_FINI_ARRAY ||
                                s.sh_type == SHT_PREINIT_ARRAY || name.rfind(".ctors", 0) == 0 ||
                                name.rfind(".dtors", 0) == 0;
      if (constructors && s.sh_size != 0) {
        unsupported(origin_, "it has constructors or destructors (section " + name +
                                 "), which a kernel object never needs and this loader does "
                                 "not run");
      }
      if (s.sh_type == SHT_SYMTAB) {
        if (symtab_ != 0) unsupported(origin_, "it has more than one symbol table");
        symtab_ = i;
      }
      if ((s.sh_flags & SHF_ALLOC) == 0 || s.sh_size == 0) continue;
      if ((s.sh_flags & SHF_TLS) != 0) {
        unsupported(origin_, "it has thread-local data (section " + name + ")");
      }
      if (s.sh_type != SHT_PROGBITS && s.sh_type != SHT_NOBITS && s.sh_type != SHT_NOTE &&
          s.sh_type != SHT_X86_64_UNWIND) {
        unsupported(origin_, "allocated section " + name + " has unsupported type " +
                                 std::to_string(s.sh_type));
      }
      if (s.sh_addralign > kMaxAlignment) {
        unsupported(origin_, "section " + name + " asks for an alignment above a page");
      }
      Placement& p = placements_[i];
      p.region = (s.sh_flags & SHF_EXECINSTR) != 0 ? kCode
                 : (s.sh_flags & SHF_WRITE) != 0  ? kData
                                                  : kConstants;
      p.offset = reserve(p.region, s.sh_size, s.sh_addralign);
      p.loaded = true;
    }
    if (symtab_ == 0) malformed(origin_, "it has no symbol table");
  }

  uint64_t reserve(Region region, uint64_t size, uint64_t alignment) {
    uint64_t& used = region_size_[region];
    const uint64_t at = align_up(used, alignment < 1 ? 1 : alignment);
    if (size > kMaxImage || at > kMaxImage - size) unsupported(origin_, "it is too large");
    used = at + size;
    return at;
  }

  void read_symbols() {
    const Elf64_Shdr& st = sections_[symtab_];
    if (st.sh_entsize != sizeof(Elf64_Sym) || st.sh_size % sizeof(Elf64_Sym) != 0) {
      malformed(origin_, "bad symbol table entry size");
    }
    const uint64_t count = st.sh_size / sizeof(Elf64_Sym);
    symbols_.resize(count);
    names_.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      symbols_[i] = in_.at<Elf64_Sym>(st.sh_offset + i * sizeof(Elf64_Sym), "a symbol");
      names_[i] = symbols_[i].st_name == 0
                      ? std::string_view{}
                      : string_at(st.sh_link, symbols_[i].st_name, "a symbol name");
      const Elf64_Sym& s = symbols_[i];
      const uint16_t shndx = s.st_shndx;
      if (shndx == SHN_COMMON) {
        // Uninitialised data not yet given a section: st_value is its alignment.
        const uint64_t alignment = s.st_value;
        if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kMaxAlignment) {
          malformed(origin_, "common symbol '" + std::string(names_[i]) + "' has a bad alignment");
        }
        commons_.push_back({i, reserve(kData, s.st_size, alignment)});
      } else if (shndx != SHN_UNDEF && shndx != SHN_ABS) {
        if (shndx >= SHN_LORESERVE) {
          unsupported(origin_, "symbol '" + std::string(names_[i]) +
                                   "' is in a special section " + std::to_string(shndx));
        }
        if (shndx >= sections_.size()) {
          malformed(origin_, "symbol '" + std::string(names_[i]) + "' has a bad section index");
        }
      }
    }
  }

  // Relocation sections that apply to an allocated section, and which symbols their entries
  // need a GOT entry (an address the code loads) or a call stub (an undefined function, which
  // may lie beyond a 32-bit displacement from the image) for.
  void plan() {
    got_index_.assign(symbols_.size(), -1);
    stub_index_.assign(symbols_.size(), -1);
    for (uint64_t i = 0; i < sections_.size(); ++i) {
      const Elf64_Shdr& s = sections_[i];
      if (s.sh_type == SHT_REL && s.sh_info < sections_.size() &&
          placements_[s.sh_info].loaded) {
        unsupported(origin_, "it has REL relocations without addends, which x86-64 never uses");
      }
      if (s.sh_type != SHT_RELA) continue;
      if (s.sh_info >= sections_.size()) malformed(origin_, "a relocation section's target");
      if (!placements_[s.sh_info].loaded) continue;  // debug info: not loaded, not relocated
      if (s.sh_link != symtab_) malformed(origin_, "relocations against another symbol table");
      if (s.sh_entsize != sizeof(Elf64_Rela) || s.sh_size % sizeof(Elf64_Rela) != 0) {
        malformed(origin_, "bad relocation entry size");
      }
      relocation_sections_.push_back(i);
      for (uint64_t r = 0; r < s.sh_size / sizeof(Elf64_Rela); ++r) {
        const auto rela = in_.at<Elf64_Rela>(s.sh_offset + r * sizeof(Elf64_Rela), "a relocation");
        const uint64_t sym = ELF64_R_SYM(rela.r_info);
        if (sym >= symbols_.size()) malformed(origin_, "a relocation's symbol index");
        switch (ELF64_R_TYPE(rela.r_info)) {
          case R_X86_64_GOTPCREL:
          case R_X86_64_GOTPCRELX:
          case R_X86_64_REX_GOTPCRELX:
            if (got_index_[sym] < 0) got_index_[sym] = got_count_++;
            break;
          case R_X86_64_PLT32:
            if (symbols_[sym].st_shndx == SHN_UNDEF && stub_index_[sym] < 0) {
              if (got_index_[sym] < 0) got_index_[sym] = got_count_++;
              stub_index_[sym] = stub_count_++;
            }
            break;
          default:
            break;
        }
      }
    }
    stubs_offset_ = reserve(kCode, stub_count_ * kStubBytes, 16);
    got_offset_ = reserve(kConstants, got_count_ * sizeof(uint64_t), 8);
  }

  void map() {
    page_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    uint64_t total = 0;
    for (int r = 0; r < kRegions; ++r) {
      region_offset_[r] = total;
      total += align_up(region_size_[r], page_);
    }
    if (total == 0) unsupported(origin_, "it has no code");
    void* image = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (image == MAP_FAILED) {
      unsupported(origin_, "cannot map " + std::to_string(total) + " bytes: " +
                               std::strerror(errno));
    }
    image_ = static_cast<char*>(image);
    image_size_ = total;
  }

  uint64_t address(Region region, uint64_t offset) const {
    return reinterpret_cast<uint64_t>(image_) + region_offset_[region] + offset;
  }

  uint64_t section_address(uint64_t index) const {
    return address(placements_[index].region, placements_[index].offset);
  }

  void copy_sections() {
    for (uint64_t i = 0; i < sections_.size(); ++i) {
      const Elf64_Shdr& s = sections_[i];
      if (!placements_[i].loaded || s.sh_type == SHT_NOBITS) continue;  // the pages are zero
      std::memcpy(reinterpret_cast<void*>(section_address(i)), in_.bytes().data() + s.sh_offset,
                  s.sh_size);
    }
  }

  // Every symbol's address in the process (0 for an absent weak one).
  void resolve_symbols() {
    values_.assign(symbols_.size(), 0);
    for (const auto& [sym, offset] : commons_) values_[sym] = address(kData, offset);
    std::string missing;
    for (uint64_t i = 0; i < symbols_.size(); ++i) {
      const Elf64_Sym& s = symbols_[i];
      if (s.st_shndx == SHN_COMMON) continue;
      if (s.st_shndx == SHN_ABS) {
        values_[i] = s.st_value;
      } else if (s.st_shndx != SHN_UNDEF) {
        if (!placements_[s.st_shndx].loaded) continue;  // a debug section: never referenced
        if (s.st_value > sections_[s.st_shndx].sh_size) {
          malformed(origin_, "symbol '" + std::string(names_[i]) + "' lies outside its section");
        }
        values_[i] = section_address(s.st_shndx) + s.st_value;
      } else if (i != 0) {
        values_[i] = resolve_undefined(i, &missing);
      }
    }
    if (!missing.empty()) unsupported(origin_, missing);
  }

  uint64_t resolve_undefined(uint64_t sym, std::string* missing) {
    const std::string name(names_[sym]);
    // jaxtile's runtime stand-ins win over whatever else is loaded (libtvm_ffi must not
    // capture a kernel's errors), as the shared-library path arranges by rebinding imports.
    if (void* fn = runtime_function(name)) return reinterpret_cast<uint64_t>(fn);
    std::string why;
    if (name.rfind("TVM", 0) == 0 || name.rfind("__TVM", 0) == 0) {
      why = "it needs the TVM runtime function '" + name + "', which jaxtile does not provide";
    } else if (void* found = dlsym(RTLD_DEFAULT, name.c_str())) {
      return reinterpret_cast<uint64_t>(found);
    } else if (ELF64_ST_BIND(symbols_[sym].st_info) == STB_WEAK) {
      return 0;
    } else {
      why = "undefined symbol '" + name + "' (not in the process's libraries)";
    }
    *missing += missing->empty() ? "" : "; ";
    *missing += why;
    return 0;
  }

  void apply_relocations() {
    for (uint64_t i : relocation_sections_) {
      const Elf64_Shdr& s = sections_[i];
      const uint64_t target = s.sh_info;
      const uint64_t target_size = sections_[target].sh_size;
      if (sections_[target].sh_type == SHT_NOBITS) {
        malformed(origin_, "relocations in a section without contents");
      }
      for (uint64_t r = 0; r < s.sh_size / sizeof(Elf64_Rela); ++r) {
        const auto rela = in_.at<Elf64_Rela>(s.sh_offset + r * sizeof(Elf64_Rela), "a relocation");
        apply(rela, target, target_size);
      }
    }
    for (uint64_t i = 0; i < symbols_.size(); ++i) {
      if (got_index_[i] >= 0) store<uint64_t>(got_slot(i), values_[i]);
      if (stub_index_[i] >= 0) {
        // jmp *disp32(%rip), the displacement counted from the end of the 6-byte instruction.
        const uint64_t at = stub(i);
        const uint8_t code[kStubBytes] = {0xff, 0x25, 0, 0, 0, 0, 0xcc, 0xcc};
        std::memcpy(reinterpret_cast<void*>(at), code, sizeof(code));
        store<int32_t>(at + 2, displacement(got_slot(i), at + 6, "a call stub"));
      }
    }
  }

  uint64_t got_slot(uint64_t sym) const {
    return address(kConstants, got_offset_ + static_cast<uint64_t>(got_index_[sym]) * 8);
  }
  uint64_t stub(uint64_t sym) const {
    return address(kCode, stubs_offset_ + static_cast<uint64_t>(stub_index_[sym]) * kStubBytes);
  }

  template <typename T>
  static void store(uint64_t at, T value) {
    std::memcpy(reinterpret_cast<void*>(at), &value, sizeof(T));
  }

  int32_t displacement(uint64_t to, uint64_t from, const std::string& what) const {
    const auto d = static_cast<int64_t>(to - from);
    if (d < std::numeric_limits<int32_t>::min() || d > std::numeric_limits<int32_t>::max()) {
      unsupported(origin_, what + " does not reach its target within 2 GiB");
    }
    return static_cast<int32_t>(d);
  }

  void apply(const Elf64_Rela& rela, uint64_t target, uint64_t target_size) {
    const uint32_t type = ELF64_R_TYPE(rela.r_info);
    const uint64_t sym = ELF64_R_SYM(rela.r_info);
    const Elf64_Sym& s = symbols_[sym];
    if (s.st_shndx != SHN_UNDEF && s.st_shndx != SHN_ABS && s.st_shndx != SHN_COMMON &&
        !placements_[s.st_shndx].loaded) {
      malformed(origin_, "a relocation refers to a section that is not loaded");
    }
    const uint64_t width = type == R_X86_64_64 || type == R_X86_64_PC64 ? 8 : 4;
    if (type != R_X86_64_NONE && !within(rela.r_offset, width, target_size)) {
      malformed(origin_, "a relocation lies outside its section");
    }
    const uint64_t place = section_address(target) + rela.r_offset;
    const auto addend = static_cast<uint64_t>(rela.r_addend);
    const uint64_t value = values_[sym] + addend;
    const std::string what = "relocation against '" + std::string(names_[sym]) + "'";
    switch (type) {
      case R_X86_64_NONE:
        break;
      case R_X86_64_64:
        store<uint64_t>(place, value);
        break;
      case R_X86_64_PC64:
        store<uint64_t>(place, value - place);
        break;
      case R_X86_64_PC32:
        store<int32_t>(place, displacement(value, place, what));
        break;
      case R_X86_64_PLT32: {
        const uint64_t callee = stub_index_[sym] >= 0 ? stub(sym) + addend : value;
        store<int32_t>(place, displacement(callee, place, what));
        break;
      }
      case R_X86_64_GOTPCREL:
      case R_X86_64_GOTPCRELX:
      case R_X86_64_REX_GOTPCRELX:
        // The instruction stays a load from the GOT entry (no relaxation): always correct.
        store<int32_t>(place, displacement(got_slot(sym) + addend, place, what));
        break;
      case R_X86_64_32:
        if (value > std::numeric_limits<uint32_t>::max()) {
          unsupported(origin_, what + " needs an address below 4 GiB (R_X86_64_32)");
        }
        store<uint32_t>(place, static_cast<uint32_t>(value));
        break;
      case R_X86_64_32S: {
        const auto v = static_cast<int64_t>(value);
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
          unsupported(origin_, what + " needs an address within 2 GiB of 0 (R_X86_64_32S)");
        }
        store<int32_t>(place, static_cast<int32_t>(v));
        break;
      }
      default:
        unsupported(origin_, "it has a relocation of type " + std::to_string(type) +
                                 ", which this loader does not support");
    }
  }

  // The runtime's pointer slots the object defines (e.g. __tvm_ffi__library_ctx), filled as
  // the shared-library path fills them after dlopen.
  void fill_slots() {
    for (uint64_t i = 0; i < symbols_.size(); ++i) {
      const Elf64_Sym& s = symbols_[i];
      if (ELF64_ST_BIND(s.st_info) == STB_LOCAL || names_[i].empty()) continue;
      void* value = runtime_slot(names_[i]);
      if (value == nullptr || s.st_shndx == SHN_UNDEF || s.st_shndx == SHN_ABS) continue;
      if (s.st_shndx != SHN_COMMON && !placements_[s.st_shndx].loaded) continue;
      const bool writable = s.st_shndx == SHN_COMMON || placements_[s.st_shndx].region == kData;
      const bool fits = s.st_shndx == SHN_COMMON
                            ? s.st_size >= sizeof(void*)
                            : within(s.st_value, sizeof(void*), sections_[s.st_shndx].sh_size);
      if (!writable || !fits) {
        unsupported(origin_, "runtime slot '" + std::string(names_[i]) +
                                 "' is not a writable pointer");
      }
      store<uint64_t>(values_[i], reinterpret_cast<uint64_t>(value));
    }
  }

  void protect() {
    const int modes[kRegions] = {PROT_READ | PROT_EXEC, PROT_READ, PROT_READ | PROT_WRITE};
    for (int r = 0; r < kRegions; ++r) {
      const uint64_t size = align_up(region_size_[r], page_);
      if (size == 0 || modes[r] == (PROT_READ | PROT_WRITE)) continue;
      if (mprotect(image_ + region_offset_[r], size, modes[r]) != 0) {
        unsupported(origin_, std::string("cannot protect its pages: ") + std::strerror(errno));
      }
    }
  }

  void* find_entry(const std::vector<std::string>& entry_names) const {
    for (const std::string& want : entry_names) {
      for (uint64_t i = 0; i < symbols_.size(); ++i) {
        const Elf64_Sym& s = symbols_[i];
        if (names_[i] != want || ELF64_ST_BIND(s.st_info) == STB_LOCAL ||
            s.st_shndx == SHN_UNDEF || s.st_shndx >= sections_.size() ||
            !placements_[s.st_shndx].loaded || placements_[s.st_shndx].region != kCode) {
          continue;
        }
        return reinterpret_cast<void*>(values_[i]);
      }
    }
    unsupported(origin_, "it defines no function '" + entry_names.back() + "'");
  }

  static constexpr uint64_t kMaxAlignment = 4096;
  static constexpr uint64_t kMaxImage = uint64_t{1} << 28;

  Reader in_;
  const std::string& origin_;
  Elf64_Ehdr eh_{};
  std::vector<Elf64_Shdr> sections_;
  std::vector<Placement> placements_;
  uint64_t symtab_ = 0;
  std::vector<Elf64_Sym> symbols_;
  std::vector<std::string_view> names_;
  std::vector<std::pair<uint64_t, uint64_t>> commons_;  // {symbol, offset in the data region}
  std::vector<uint64_t> relocation_sections_;
  std::vector<int64_t> got_index_, stub_index_;
  int64_t got_count_ = 0, stub_count_ = 0;
  uint64_t got_offset_ = 0, stubs_offset_ = 0;
  uint64_t region_size_[kRegions] = {};
  uint64_t region_offset_[kRegions] = {};
  uint64_t page_ = 4096;
  char* image_ = nullptr;
  uint64_t image_size_ = 0;
  std::vector<uint64_t> values_;
};

}  // namespace

void* link_object(std::string_view bytes, const std::vector<std::string>& entry_names,
                  const std::string& origin) {
  return Linker(bytes, origin).link(entry_names);
}

#else  // not x86-64 Linux

void* link_object(std::string_view, const std::vector<std::string>&, const std::string& origin) {
  throw std::runtime_error("jaxtile: cannot link " + origin +
                           ": linking objects in process is implemented for x86-64 Linux only");
}

#endif

}  // namespace jaxtile
