#include "cpu/host_cpu.h"

#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>

namespace jaxtile {
namespace {

std::optional<std::unordered_set<std::string>> read_cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0 && line.rfind("Features", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 1));
    std::unordered_set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return std::nullopt;
}

// The flags as /proc/cpuinfo lists them, read once.
const std::optional<std::unordered_set<std::string>>& cpuinfo_flags() {
  static const std::optional<std::unordered_set<std::string>> flags = read_cpu_flags();
  return flags;
}

const char* const kAmxFlags[] = {"amx_tile", "amx_bf16", "amx_int8"};

// Asks Linux for the AMX tile data state; see amx_permitted() in the header.
bool request_amx() {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023;  // arch/x86/include/uapi/asm/prctl.h
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

}  // namespace

const std::string& host_arch() {
  static const std::string arch = [] {
    utsname u{};
    return uname(&u) == 0 ? std::string(u.machine) : std::string();
  }();
  return arch;
}

bool amx_permitted() {
  static const bool permitted = [] {
    const auto& flags = cpuinfo_flags();
    return flags && flags->count("amx_tile") != 0 && request_amx();
  }();
  return permitted;
}

const std::unordered_set<std::string>* host_cpu_flags() {
  static const std::optional<std::unordered_set<std::string>> flags = [] {
    std::optional<std::unordered_set<std::string>> f = cpuinfo_flags();
    if (f && !amx_permitted()) {
      for (const char* amx : kAmxFlags) f->erase(amx);
    }
    return f;
  }();
  return flags ? &*flags : nullptr;
}

}  // namespace jaxtile
