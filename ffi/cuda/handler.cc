#include "cuda/handler.h"

#include "common/gpu_handler.h"
#include "cuda/driver.h"
#include "cuda/kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxtile::cuda {

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileCudaInitialize, (gpu::initialize<CUstream, load>),
                              gpu::call_binding<CUstream>(ffi::Ffi::BindInitialize()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileCudaCall, (gpu::call<CUstream, launch>),
                              gpu::call_binding<CUstream>(ffi::Ffi::Bind()),
                              {ffi::Traits::kCmdBufferCompatible});

void* handler() { return reinterpret_cast<void*>(&JaxtileCudaCall); }

void* initialize_handler() { return reinterpret_cast<void*>(&JaxtileCudaInitialize); }

}  // namespace jaxtile::cuda
