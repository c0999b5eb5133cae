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

// Result buffers from this size on get transparent huge pages (prefer_huge_pages).
constexpr size_t kHugePageResultBytes = size_t{4} << 20;

// Asks the kernel to back the whole 2 MiB pages inside a result buffer of at least
// kHugePageResultBytes with transparent huge pages (where the system lets a process ask).
// A buffer of kFreshMappingBytes or more is new memory on every call; a smaller one is new
// memory whenever glibc has handed the heap's free memory back to the kernel (its adaptive
// trimming does so by the allocation history of the whole process). The first touch of new
// memory then takes one fault per 2 MiB instead of one per 4 KiB: 16 MiB written took
// 17-23 ms in 4 KiB faults on the VMs measured, 0.6-2.6 ms in huge pages, and the advice
// itself, a system call that changes nothing once given, 0.35 us.
void prefer_huge_pages(void* data, size_t bytes);

}  // namespace jaxtile
