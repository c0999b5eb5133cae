#include "exported_kernel.h"

#include <mutex>
#include <stdexcept>
#include <string>

#include "library_file.h"
#include "payload.h"

namespace jaxtile {

const Kernel& load_exported_kernel(std::string_view key, std::string_view payload) {
  // Leaked on purpose, like the registry: XLA may call in during interpreter shutdown.
  static auto* mu = new std::mutex;
  std::lock_guard<std::mutex> lock(*mu);
  if (const Kernel* k = find_kernel(key)) return *k;

  const Payload p = decode_payload(key, payload);
  const std::string origin = "the library of kernel '" + p.name + "' in an exported program";
  // A memory file leaves nothing on disk; a temporary file is the fallback where memory files
  // are unavailable or not executable (e.g. a vm.memfd_noexec sysctl).
  std::string errors;
  for (FileKind kind : {FileKind::kMemory, FileKind::kTemporary}) {
    try {
      LibraryFile file(p.library, p.key, kind);
      // The file is closed on leaving this scope; the loaded library stays mapped.
      return load_kernel(p.key, file.path(), p.symbol, p.num_blocks, p.alignment, origin);
    } catch (const std::exception& e) {
      errors += errors.empty() ? "" : "; then ";
      errors += e.what();
    }
  }
  throw std::runtime_error("jaxtile: cannot load the exported kernel '" + p.name + "' (key " +
                           p.key.substr(0, 16) + "...): " + errors);
}

}  // namespace jaxtile
