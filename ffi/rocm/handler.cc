#include "rocm/handler.h"

#include "common/gpu_handler.h"
#include "rocm/kernels.h"
#include "rocm/runtime.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxtile::rocm {

// On ROCm the stream XLA passes is its hipStream_t.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileRocmInitialize, (gpu::initialize<hipStream_t, load>),
                              gpu::call_binding<hipStream_t>(ffi::Ffi::BindInitialize()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileRocmCall, (gpu::call<hipStream_t, launch>),
                              gpu::call_binding<hipStream_t>(ffi::Ffi::Bind()),
                              {ffi::Traits::kCmdBufferCompatible});

void* handler() { return reinterpret_cast<void*>(&JaxtileRocmCall); }

void* initialize_handler() { return reinterpret_cast<void*>(&JaxtileRocmInitialize); }

}  // namespace jaxtile::rocm
