// The XLA FFI handler behind jaxtile's CUDA custom-call target "jaxtile_cuda_call".
#pragma once

namespace jaxtile::cuda {

// Address of the handler, an `XLA_FFI_Error* (XLA_FFI_CallFrame*)` function. It expects the
// string attributes `key` and `payload` (the cubin and its launch, common/payload.h), the
// operands and the results as device buffers, and launches on the stream XLA passes. It is
// marked command-buffer compatible: it only enqueues a launch on that stream, so XLA may
// capture it into a CUDA graph.
void* handler();

// The same target's initialize stage (same attributes): loads the kernel into the stream's
// context before XLA executes the call or captures it into a command buffer, where loading a
// module may not be allowed. The execute stage still loads it if this did not run.
void* initialize_handler();

}  // namespace jaxtile::cuda
