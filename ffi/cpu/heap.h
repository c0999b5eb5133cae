// How the C library's allocator keeps memory that kernel calls' buffers free.
#pragma once

#include <cstddef>

namespace jaxtile {

// Buffers from this size on are mapped afresh by glibc for each allocation once
// keep_freed_memory() has run (its mmap threshold).
constexpr size_t kFreshMappingBytes = size_t{32} << 20;

// Keeps freed buffers of under kFreshMappingBytes in the heap, and up to 256 MiB of free
// memory at the top of each arena's heap, instead of handing them back to the kernel after
// each call. Process-wide, so only on request (JAXTILE_KEEP_FREED_MEMORY=1), never by default.
// Returns false, changing nothing, where the C library is not glibc.
bool keep_freed_memory();

// Asks the kernel to back the whole 2 MiB pages inside a result buffer of at least
// kFreshMappingBytes with transparent huge pages (where the system lets a process ask):
// such a buffer is new memory on every call, and its first touch then takes one fault per
// 2 MiB instead of one per 4 KiB.
void prefer_huge_pages(void* data, size_t bytes);

}  // namespace jaxtile
