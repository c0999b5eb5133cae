// Linking a kernel's relocatable ELF object into the process ourselves, without `ld`.
//
// jaxtile's CPU kernels are single LLVM objects that need little of a linker: their code and
// constants, calls to a few C library functions (expf, memcpy) and to jaxtile's TVM runtime
// stand-ins (cpu/runtime_env.h), and the pointer slots that runtime fills. Linking them here
// takes a fraction of a millisecond where `ld -shared` took several and needed binutils
// installed. Only x86-64 objects are linked; other machines keep `ld` + dlopen
// (kLinksObjects says which).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace jaxtile {

// Whether this build links relocatable objects in process (x86-64 Linux).
#if defined(__linux__) && defined(__x86_64__)
inline constexpr bool kLinksObjects = true;
#else
inline constexpr bool kLinksObjects = false;
#endif

// Whether `bytes` begins with the identification of a 64-bit ELF relocatable object (ET_REL),
// as opposed to a shared library or anything else; nothing beyond the header is checked.
bool is_relocatable_object(std::string_view bytes);

// Maps the allocated sections of the relocatable object `bytes` into fresh pages, resolves its
// undefined symbols (jaxtile's TVM runtime functions first, then the process's C libraries
// through dlsym), applies its relocations through a GOT and call stubs of its own, fills the
// runtime's pointer slots the object defines, and then makes code read+execute and constants
// read-only (never writable and executable at once). Returns the address of the first of
// `entry_names` that the object defines as a global symbol in its code. Nothing in the object
// runs: an object with constructors is refused. The pages are never unmapped (XLA executables
// may call the kernel for the life of the process). `origin` names the kernel in messages.
// Throws std::invalid_argument for a malformed or truncated object and std::runtime_error for
// one this loader does not support (another machine, an unknown relocation, an undefined
// symbol, constructors, thread-local data), one without the entry, or if memory cannot be
// mapped; a failure leaves nothing mapped.
void* link_object(std::string_view bytes, const std::vector<std::string>& entry_names,
                  const std::string& origin);

}  // namespace jaxtile
