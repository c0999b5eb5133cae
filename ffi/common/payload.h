// The kernel library an exported program carries: decoding and verifying its payload.
//
// jax.export lowers each kernel call to a "jaxtile_cpu_exported_call" custom call whose string
// attribute `payload` holds the compiled kernel (primitives/payload.py writes it). Format 3:
//
//   jaxtile-kernel-payload\n        magic          } these three lines keep their meaning in
//   format=3\n                      format         } every format, so that an old jaxtile can
//   jaxtile=<version>\n             writer         } name the version a newer payload needs
//   key=<content key>\n
//   name=<kernel name>\n
//   symbol=<function symbol>\n
//   num_blocks=<int>\n
//   alignment=<bytes>\n             buffer alignment the code assumes
//   arch=<uname -m>\n
//   isa=<flag>,<flag>,...\n         /proc/cpuinfo flags the code may use
//   signature=<buffers>\n           what the kernel was compiled for (cpu/signature.h)
//   size=<library bytes>\n
//   sha256=<hex>\n                  over every byte above and the library itself
//   <base64 of the library>
//
// In format 3 the library is a relocatable ELF object, linked in process (cpu/elf_object.h);
// a jaxtile that cannot link objects (kLinksObjects) writes format 2. Format 2 is the same
// header with a shared library, which is still read and opened with dlopen. Format 1 is format
// 2 without `signature`: its library checks its arguments itself (it was built with TVM's entry
// assertions), so it is still read.
//
// In every format the header ends with the sha256 line, which covers every byte before it and
// the decoded library: integrity is checked first, so that a damaged `format` digit reads as
// damage rather than as a payload from a newer jaxtile. The checksum catches damage and edits
// made without care, not a deliberate forgery: running an exported program means trusting
// whoever made it, as with any native code.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jaxtile {

// The newest CPU payload format this jaxtile reads.
constexpr int kPayloadFormat = 3;
// The first CPU payload format whose library is a relocatable object.
constexpr int kObjectPayloadFormat = 3;
// The newest CUDA payload format this jaxtile reads.
constexpr int kCudaPayloadFormat = 1;
// The one format of ROCm payloads this jaxtile reads: format 2 carries a code object per gfx
// architecture, and format 1 (a single code object) is no longer read.
constexpr int kHipPayloadFormat = 2;

// A payload that is malformed, altered, too new, or made for another kind of machine.
class PayloadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Payload {
  int format = 0;
  std::string jaxtile_version;
  std::string key;
  std::string name;
  std::string symbol;
  int64_t num_blocks = 0;
  int64_t alignment = 0;
  std::string arch;
  std::vector<std::string> isa;
  std::string signature;  // empty in format 1
  std::string library;    // the decoded object (format 3) or shared library (formats 1, 2)
};

// The payload of a CUDA kernel call ("jaxtile_cuda_call"), format 1: after the three lines
// every format shares,
//
//   platform=cuda\n
//   key=<content key>\n
//   name=<kernel name>\n
//   symbol=<the kernel's extern "C" name in the cubin>\n
//   arch=<sm_80, sm_90a, ...>\n
//   launch=<grid, block, shared memory, parameters: common/launch_spec.h>\n
//   ptx_size=<bytes of PTX after the cubin, possibly 0>\n
//   size=<cubin + PTX bytes>\n
//   sha256=<hex>\n                  over every byte above and the cubin and PTX
//   <base64 of the cubin followed by its PTX>
//
// The PTX (of a family-portable architecture such as sm_80) is what the driver compiles on a
// GPU the cubin cannot run on.
struct CudaPayload {
  int format = 0;
  std::string jaxtile_version;
  std::string key;
  std::string name;
  std::string symbol;
  std::string arch;
  std::string launch;
  std::string cubin;
  std::string ptx;  // empty when the payload has none
};

// The payload of a ROCm kernel call ("jaxtile_rocm_call"), format 2: after the three lines
// every format shares,
//
//   platform=rocm\n
//   key=<content key of the call>\n
//   name=<kernel name>\n
//   code_objects=<count, at least 1>\n
//   then for each code object:
//     arch=<gfx90a, gfx942>\n
//     symbol=<the kernel's extern "C" name in it>\n
//     launch=<grid, block, shared memory, parameters: common/launch_spec.h>\n
//     size=<its bytes>\n
//   sha256=<hex>\n                  over every byte above and the code objects
//   <base64 of the code objects (AMDGPU ELFs for hipModuleLoadData), in the order listed>
//
// A code object runs on the one gfx architecture it was compiled for, and a program exported
// without a device cannot know which one it will meet: it carries one per architecture and
// the handler loads the one for the device's (its gcnArchName without feature flags). Each has
// its own launch: the tiles, hence the grid and LDS bytes, may differ between architectures.
struct HipCodeObject {
  std::string arch;
  std::string symbol;
  std::string launch;
  std::string code_object;
};

struct HipPayload {
  int format = 0;
  std::string jaxtile_version;
  std::string key;
  std::string name;
  std::vector<HipCodeObject> code_objects;

  // The code object for `arch` (a gfx name without feature flags), or null.
  const HipCodeObject* for_arch(std::string_view arch) const;
  // "gfx90a, gfx942": the architectures it has code for, for messages.
  std::string archs() const;
};

// Decodes `text`, the payload of a call to the kernel `key`, and checks it: checksum, then
// format and key. Whether this machine can run the library is the platform loader's check
// (cpu/exported_kernel.cc). Throws PayloadError saying what is wrong.
Payload decode_payload(std::string_view key, std::string_view text);

// Decodes and checks the payload of a CUDA kernel call like decode_payload; whether the cubin
// suits the device is the driver's check when it loads it.
CudaPayload decode_cuda_payload(std::string_view key, std::string_view text);

// Decodes and checks the payload of a ROCm kernel call like decode_payload (a format-1 payload
// is an error saying to export again); which code object suits the device is the handler's
// choice.
HipPayload decode_hip_payload(std::string_view key, std::string_view text);

// The error for a payload of kernel `name` (may be empty) called as `key`: "jaxtile: cannot run
// the exported kernel ... : <why>".
PayloadError payload_error(std::string_view key, const std::string& name,
                           const std::string& why);

}  // namespace jaxtile
