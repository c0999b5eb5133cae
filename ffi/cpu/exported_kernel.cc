#include "cpu/exported_kernel.h"

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/payload.h"
#include "cpu/host_cpu.h"
#include "cpu/library_file.h"
#include "cpu/loader.h"

namespace jaxtile {
namespace {

[[noreturn]] void fail(const Payload& p, const std::string& why) {
  throw payload_error(p.key, p.name, "its embedded payload " + why);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Fails unless this machine has the architecture and instruction-set extensions the library
// was compiled for: running it anyway could die on an illegal instruction.
void check_machine(const Payload& p) {
  if (p.arch != host_arch()) {
    fail(p, "was compiled for " + p.arch + " but this machine is " + host_arch() +
           "; export the program again on a machine of this kind");
  }
  const auto* flags = host_cpu_flags();
  if (flags == nullptr) return;  // no /proc/cpuinfo: nothing to check against
  std::vector<std::string> missing;
  for (const std::string& f : p.isa) {
    if (!f.empty() && flags->count(f) == 0) missing.push_back(f);
  }
  if (!missing.empty()) {
    fail(p, "was compiled for a CPU with instruction-set extensions this machine lacks (" +
           join(missing) + "); export the program again on a machine of this kind");
  }
}

}  // namespace

const Kernel& load_exported_kernel(std::string_view key, std::string_view payload) {
  // Leaked on purpose, like the registry: XLA may call in during interpreter shutdown.
  static auto* mu = new std::mutex;
  std::lock_guard<std::mutex> lock(*mu);
  if (const Kernel* k = find_kernel(key)) return *k;

  const Payload p = decode_payload(key, payload);
  check_machine(p);
  const std::string origin = "the library of kernel '" + p.name + "' in an exported program";
  const std::string what =
      "jaxtile: cannot load the exported kernel '" + p.name + "' (key " + p.key.substr(0, 16) +
      "...): ";
  if (p.format >= kObjectPayloadFormat) {
    // Linked straight from memory: no file, no dlopen.
    try {
      return load_object_kernel(p.key, p.library, p.symbol, p.num_blocks, p.alignment,
                                p.signature, origin);
    } catch (const std::exception& e) {
      throw std::runtime_error(what + e.what());
    }
  }
  // Formats 1 and 2 hold a shared library, which dlopen() needs as a file.
  // A memory file leaves nothing on disk; a temporary file is the fallback where memory files
  // are unavailable or not executable (e.g. a vm.memfd_noexec sysctl).
  std::string errors;
  for (FileKind kind : {FileKind::kMemory, FileKind::kTemporary}) {
    try {
      LibraryFile file(p.library, p.key, kind);
      // The file is closed on leaving this scope; the loaded library stays mapped.
      return load_kernel(p.key, file.path(), p.symbol, p.num_blocks, p.alignment,
                         p.signature, origin);
    } catch (const std::exception& e) {
      errors += errors.empty() ? "" : "; then ";
      errors += e.what();
    }
  }
  throw std::runtime_error(what + errors);
}

}  // namespace jaxtile
