#include "cpu/heap.h"

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace jaxtile {

// XLA:CPU runs a computation whose cost analysis finds under 1000 flops on the calling
// thread, and a custom call counts as none, so a jit of one kernel allocates its outputs in
// glibc's main arena. There, freeing two 16 MiB outputs in a row leaves more free memory at
// the top of the heap than glibc's adaptive trim threshold (twice its adaptive mmap
// threshold, at most 2 x 32 MiB), so it is returned to the kernel, and the next call's
// output is fresh memory: a page fault per 4 KiB page, 1.2 us each on the VMs measured, which
// tripled the time of a 16 MiB RMS norm (benchmarks/README.md). The values fix the adaptive
// scheme at its ceiling for mmap and raise the trim threshold above it.
bool keep_freed_memory() {
#if defined(__GLIBC__)
  constexpr int kMmapThreshold = 32 << 20;  // glibc's largest allowed value
  constexpr int kTrimThreshold = 256 << 20;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace jaxtile
