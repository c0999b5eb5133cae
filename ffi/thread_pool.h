// Persistent worker threads for splitting a kernel's grid blocks across cores.
#pragma once

#include <cstdint>

namespace jaxtile {

// Threads used per kernel call, counting the calling thread: $JAXTILE_NUM_THREADS if it is a
// positive integer, else the number of CPUs this process may run on.
int num_threads();

// Calls task(ctx, i) for every i in [0, num_tasks), spread over the pool with the calling
// thread taking part, and returns once all are done. Returns false without running anything
// when another caller is using the pool, so the caller can run the work itself instead of
// waiting (XLA may execute independent custom calls concurrently).
bool parallel_run(int64_t num_tasks, void (*task)(void* ctx, int64_t i), void* ctx);

}  // namespace jaxtile
