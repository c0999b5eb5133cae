#include "cpu/heap.h"

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <cstdint>

namespace jaxtile {

// XLA:CPU runs a computation whose cost analysis finds under 1000 flops on the calling
// thread, and a custom call counts as none, so a jit of one kernel allocates its outputs in
// glibc's main arena. There, freeing two 16 MiB outputs in a row leaves more free memory at
// the top of the heap than glibc's adaptive trim threshold (twice its adaptive mmap
// threshold, at most 2 x 32 MiB), so it is returned to the kernel, and the next call's
// output is fresh memory: a page fault per 4 KiB page, 1.2 us each on the VMs measured, which
// tripled the time of a 16 MiB RMS norm (benchmarks/README.md). The values fix the adaptive
// scheme at its ceiling for mmap and raise the trim threshold above it. glibc applies the
// trim threshold to every arena, so a many-threaded program keeps up to 256 MiB per arena
// after freeing: the Python side calls this only when the user opts in.
bool keep_freed_memory() {
#if defined(__GLIBC__)
  // glibc's largest allowed mmap threshold.
  static_assert(kFreshMappingBytes == size_t{32} << 20);
  constexpr int kMmapThreshold = static_cast<int>(kFreshMappingBytes);
  constexpr int kTrimThreshold = 256 << 20;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

void prefer_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kHugePageResultBytes) return;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace jaxtile
