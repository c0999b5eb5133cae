// The XLA FFI handler behind jaxtile's ROCm custom-call target "jaxtile_rocm_call".
#pragma once

namespace jaxtile::rocm {

// Address of the handler, an `XLA_FFI_Error* (XLA_FFI_CallFrame*)` function. It expects the
// string attributes `key` and `payload` (the code object and its launch, common/payload.h),
// the operands and the results as device buffers, and launches on the HIP stream XLA passes.
// Marked command-buffer compatible: it only enqueues a launch on that stream.
void* handler();

// The same target's initialize stage (same attributes): loads the kernel on the stream's
// device before XLA executes the call or captures it into a command buffer. The execute
// stage still loads it if this did not run.
void* initialize_handler();

}  // namespace jaxtile::rocm
