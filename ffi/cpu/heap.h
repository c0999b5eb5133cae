// How the C library's allocator keeps memory that kernel calls' buffers free.
#pragma once

namespace jaxtile {

// Keeps freed buffers of up to 32 MiB in the heap, and up to 256 MiB of free memory at the
// heap's top, instead of handing them back to the kernel after each call. Returns false,
// changing nothing, where the C library is not glibc.
bool keep_freed_memory();

}  // namespace jaxtile
