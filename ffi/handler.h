// The XLA FFI handler behind the "jaxtile_cpu_call" custom-call target.
#pragma once

namespace jaxtile {

// Address of the handler, an `XLA_FFI_Error* (XLA_FFI_CallFrame*)` function. It expects a
// string attribute `key` naming a loaded kernel; operands then results follow as buffers.
void* cpu_handler();

}  // namespace jaxtile
