#include "cpu/host_cpu.h"

#include <sys/utsname.h>

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

}  // namespace

const std::string& host_arch() {
  static const std::string arch = [] {
    utsname u{};
    return uname(&u) == 0 ? std::string(u.machine) : std::string();
  }();
  return arch;
}

const std::unordered_set<std::string>* host_cpu_flags() {
  static const std::optional<std::unordered_set<std::string>> flags = read_cpu_flags();
  return flags ? &*flags : nullptr;
}

}  // namespace jaxtile
