// The XLA FFI handlers behind jaxtile's CPU custom-call targets.
#pragma once

namespace jaxtile {

// Address of the handler, an `XLA_FFI_Error* (XLA_FFI_CallFrame*)` function. It expects a
// string attribute `key` naming a loaded kernel; operands then results follow as buffers.
void* cpu_handler();

// The handler of "jaxtile_cpu_exported_call", what jax.export lowers a kernel call to: like
// cpu_handler, with a second string attribute `payload` holding the kernel's library (see
// payload.h), loaded on the first call in a process that does not have the kernel yet.
void* cpu_exported_handler();

}  // namespace jaxtile
