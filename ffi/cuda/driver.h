// The few CUDA driver API entry points jaxtile's CUDA handler needs, resolved at run time.
//
// libcuda.so.1 is opened on first use, never at import: a machine without an NVIDIA driver
// imports jaxtile and runs CPU kernels as usual, and a CUDA launch there fails with a message
// saying so. The types are declared here (their ABI has been stable since CUDA 4), so no CUDA
// toolkit header is needed to build.
#pragma once

#include <string>

namespace jaxtile::cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

constexpr CUresult kCudaSuccess = 0;
// CUDA_ERROR_NO_BINARY_FOR_GPU: a cubin of another architecture family.
constexpr CUresult kCudaErrorNoBinaryForGpu = 209;
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: the opt-in above 48 KiB.
constexpr int kFuncAttrMaxDynamicSharedBytes = 8;

struct Driver {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void* image);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char* name);
  CUresult (*cuFuncSetAttribute)(CUfunction, int attribute, int value);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared_bytes, CUstream,
                             void** params, void** extra);

  // "CUDA_ERROR_X: description" for a result code.
  std::string describe(CUresult r) const;
};

// The driver, loaded and initialised on the first call (thread-safe); null if it cannot be,
// with `*why` saying what failed (no libcuda.so.1, a missing symbol, cuInit's error).
const Driver* driver(std::string* why);

}  // namespace jaxtile::cuda
