"""The bytes of HIP's device properties that ``ffi/rocm/runtime.h`` reads, against the struct
as ROCm declares it.

The handler calls ``hipGetDevicePropertiesR0600`` without HIP's headers, so it hard-codes the
size of ``hipDeviceProp_tR0600`` and where ``gcnArchName`` lies in it. The layout below is the
member list of ``hipDeviceProp_t`` (the ``R0600`` version) in ``include/hip/hip_runtime_api.h``,
written out here in order by type: checked against ROCm 6.3's header (ROCm/HIP, HIP_VERSION
6.3.0, commit c5e11fc) and ROCm 7's (ROCm/rocm-systems ``projects/hip``, commit 003a5d1),
which declare the same members. ctypes lays it out with the C rules of the x86-64 and AArch64
Linux ABIs ROCm runs on (LP64: 8-byte ``size_t`` and pointers, 4-byte ``int``); the
``hipDeviceArch_t`` member is 17 one-bit ``unsigned`` fields, one 4-byte word."""

import ctypes
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_INT, _UINT, _SIZE, _PTR = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p


def _ints(*names):
    """``int`` members; ``name:n`` is an array of n."""
    out = []
    for n in names:
        name, _, count = n.partition(":")
        out.append((name, _INT * int(count) if count else _INT))
    return out


class DevicePropR0600(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 256), ("uuid", ctypes.c_char * 16), ("luid", ctypes.c_char * 8),
        ("luidDeviceNodeMask", _UINT), ("totalGlobalMem", _SIZE), ("sharedMemPerBlock", _SIZE),
        *_ints("regsPerBlock", "warpSize"), ("memPitch", _SIZE),
        *_ints("maxThreadsPerBlock", "maxThreadsDim:3", "maxGridSize:3", "clockRate"),
        ("totalConstMem", _SIZE), *_ints("major", "minor"),
        ("textureAlignment", _SIZE), ("texturePitchAlignment", _SIZE),
        *_ints("deviceOverlap", "multiProcessorCount", "kernelExecTimeoutEnabled", "integrated",
               "canMapHostMemory", "computeMode", "maxTexture1D", "maxTexture1DMipmap",
               "maxTexture1DLinear", "maxTexture2D:2", "maxTexture2DMipmap:2",
               "maxTexture2DLinear:3", "maxTexture2DGather:2", "maxTexture3D:3",
               "maxTexture3DAlt:3", "maxTextureCubemap", "maxTexture1DLayered:2",
               "maxTexture2DLayered:3", "maxTextureCubemapLayered:2", "maxSurface1D",
               "maxSurface2D:2", "maxSurface3D:3", "maxSurface1DLayered:2",
               "maxSurface2DLayered:3", "maxSurfaceCubemap", "maxSurfaceCubemapLayered:2"),
        ("surfaceAlignment", _SIZE),
        *_ints("concurrentKernels", "ECCEnabled", "pciBusID", "pciDeviceID", "pciDomainID",
               "tccDriver", "asyncEngineCount", "unifiedAddressing", "memoryClockRate",
               "memoryBusWidth", "l2CacheSize", "persistingL2CacheMaxSize",
               "maxThreadsPerMultiProcessor", "streamPrioritiesSupported",
               "globalL1CacheSupported", "localL1CacheSupported"),
        ("sharedMemPerMultiprocessor", _SIZE),
        *_ints("regsPerMultiprocessor", "managedMemory", "isMultiGpuBoard",
               "multiGpuBoardGroupID", "hostNativeAtomicSupported",
               "singleToDoublePrecisionPerfRatio", "pageableMemoryAccess",
               "concurrentManagedAccess", "computePreemptionSupported",
               "canUseHostPointerForRegisteredMem", "cooperativeLaunch",
               "cooperativeMultiDeviceLaunch"),
        ("sharedMemPerBlockOptin", _SIZE),
        *_ints("pageableMemoryAccessUsesHostPageTables", "directManagedMemAccessFromHost",
               "maxBlocksPerMultiProcessor", "accessPolicyMaxWindowSize"),
        ("reservedSharedMemPerBlock", _SIZE),
        *_ints("hostRegisterSupported", "sparseHipArraySupported",
               "hostRegisterReadOnlySupported", "timelineSemaphoreInteropSupported",
               "memoryPoolsSupported", "gpuDirectRDMASupported"),
        ("gpuDirectRDMAFlushWritesOptions", _UINT), *_ints("gpuDirectRDMAWritesOrdering"),
        ("memoryPoolSupportedHandleTypes", _UINT),
        *_ints("deferredMappingHipArraySupported", "ipcEventSupported", "clusterLaunch",
               "unifiedFunctionPointers", "reserved:63", "hipReserved:32"),
        ("gcnArchName", ctypes.c_char * 256), ("maxSharedMemoryPerMultiProcessor", _SIZE),
        *_ints("clockInstructionRate"), ("arch", _UINT),
        ("hdpMemFlushCntl", _PTR), ("hdpRegFlushCntl", _PTR),
        *_ints("cooperativeMultiDeviceUnmatchedFunc", "cooperativeMultiDeviceUnmatchedGridDim",
               "cooperativeMultiDeviceUnmatchedBlockDim",
               "cooperativeMultiDeviceUnmatchedSharedMem", "isLargeBar", "asicRevision"),
    ]


def _constants(path: Path) -> dict[str, int]:
    """The integer ``constexpr`` constants a header defines."""
    return {name: int(value) for name, value in re.findall(
        r"constexpr\s+\w+\s+(k\w+)\s*=\s*(\d+)\s*;", path.read_text())}


def test_the_runtime_reads_the_arch_name_where_rocm_puts_it():
    assert ctypes.sizeof(ctypes.c_size_t) == ctypes.sizeof(ctypes.c_void_p) == 8  # LP64
    c = _constants(ROOT / "ffi" / "rocm" / "runtime.h")
    assert c["kDevicePropBytes"] == ctypes.sizeof(DevicePropR0600) == 1472
    assert c["kGcnArchNameOffset"] == DevicePropR0600.gcnArchName.offset == 1160
    assert c["kGcnArchNameBytes"] == DevicePropR0600.gcnArchName.size == 256
    # hip_runtime_api.h's hipError_t: hipSuccess = 0, hipErrorNoBinaryForGpu = 209.
    assert (c["kHipSuccess"], c["kHipErrorNoBinaryForGpu"]) == (0, 209)


def test_the_stand_in_runtime_writes_the_same_layout():
    # The recording stand-in the handler's tests load fills the properties as HIP does; its
    # offsets must be ROCm's too, or those tests would check the handler against itself.
    text = (Path(__file__).parent / "fake_libamdhip64.c").read_text()
    body = text[text.index("hipGetDevicePropertiesR0600"):]
    body = body[:body.index("\n}")]
    assert re.search(r"memset\(prop, 0, (\d+)\)", body).group(1) == "1472"
    offsets = re.findall(r"\((?:const )?char\s*\*\)\s*prop \+ (\d+)", body)
    assert len(offsets) == 2 and set(offsets) == {str(DevicePropR0600.gcnArchName.offset)}
