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
// CUDA_ERROR_UNSUPPORTED_PTX_VERSION: PTX of an ISA version newer than the driver knows.
constexpr CUresult kCudaErrorUnsupportedPtxVersion = 222;
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: the opt-in above 48 KiB.
constexpr int kFuncAttrMaxDynamicSharedBytes = 8;

struct Driver {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  // The CUDA version the driver supports, 1000 * major + 10 * minor (12040 for CUDA 12.4).
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void* image);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char* name);
  CUresult (*cuFuncSetAttribute)(CUfunction, int attribute, int value);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared_bytes, CUstream,
                             void** params, void** extra);
  // A TMA tensor map (CUDA 12 on; null in an older driver: only kernels that take tensor maps
  // need it). The enums are passed as their values (cuda.h's CUtensorMap* enums).
  CUresult (*cuTensorMapEncodeTiled)(void* map, int data_type, unsigned rank, void* address,
                                     const unsigned long long* dims,
                                     const unsigned long long* strides, const unsigned* box,
                                     const unsigned* element_strides, int interleave,
                                     int swizzle, int l2_promotion, int oob_fill);

  // "CUDA_ERROR_X: description" for a result code.
  std::string describe(CUresult r) const;
  // The CUDA version the driver supports, as cuDriverGetVersion reports it; 0 if unknown.
  int cuda_version() const;
};

// "12.4" for 12040.
std::string cuda_version_text(int version);

// The oldest CUDA version whose driver loads PTX of ISA version `major`.`minor` (the `.version`
// directive), from the PTX ISA release history: ISA 7.x came with CUDA 11.x, 8.0-8.5 with
// 12.0-12.5, 8.6-8.8 with 12.7-12.9, 9.x with 13.x. As cuDriverGetVersion counts (13000).
int cuda_version_for_ptx_isa(int major, int minor);

// The oldest Linux driver release for a CUDA version (580 for 13.0), for messages that say
// what to install; 0 where the table has none.
int driver_release_for_cuda(int version);

// The driver, loaded and initialised on the first call (thread-safe); null if it cannot be,
// with `*why` saying what failed (no libcuda.so.1, a missing symbol, cuInit's error).
const Driver* driver(std::string* why);

}  // namespace jaxtile::cuda
