// Persistent worker threads for splitting a kernel's grid blocks across cores.
#pragma once

#include <cstdint>

namespace jaxtile {

// Threads used per kernel call, counting the calling thread: what set_num_threads() chose
// before the first call, else the number of CPUs this process may run on (its affinity mask,
// capped by a cgroup v2 CPU quota). Fixed once read.
int num_threads();

// Sets the number of threads (jaxtile/_config.py parses $JAXTILE_NUM_THREADS and calls this
// at import). Returns false, changing nothing, once num_threads() has been read or if n < 1.
bool set_num_threads(int n);

// Calls task(ctx, i) for every i in [0, num_tasks), spread over the pool with the calling
// thread taking part, and returns once all are done. Returns false without running anything
// when another caller is using the pool, so the caller can run the work itself instead of
// waiting (XLA may execute independent custom calls concurrently).
bool parallel_run(int64_t num_tasks, void (*task)(void* ctx, int64_t i), void* ctx);

}  // namespace jaxtile
