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

// Another runtime's pool that a call may lend threads from: XLA's intra-op pool, which XLA
// gives a CPU custom call. `schedule(pool, fn, arg)` must run fn(arg) once, on any thread
// and at any later time (possibly on the calling thread at once).
struct HostPool {
  void* pool;
  void (*schedule)(void* pool, void (*fn)(void*), void* arg);
  int64_t num_threads;  // threads in that pool; 0 when there is none
};

// How a kernel call spreads its blocks: over `threads` threads counting the calling one,
// the others borrowed from the host's pool (`on_host_pool`) or jaxtile's own.
struct ThreadPlan {
  int threads;
  bool on_host_pool;
};

// The plan for a call: `own` is num_threads(), `requested` whether set_num_threads chose it
// (JAXTILE_NUM_THREADS), `host_threads` the host pool's size (0: none). A requested count
// wins and runs on jaxtile's own pool, as before. Otherwise the call borrows the host's
// threads, at most `own` in all: XLA's intra-op threads and jaxtile's own pool would each
// size themselves to the cores and, under a jitted step that mixes jaxtile kernels with
// XLA ops, take turns on them (issue 20); XLA's idle threads, spinning for work, also take
// the chunks at once where a sleeping worker must be woken.
ThreadPlan plan_threads(int own, bool requested, int64_t host_threads);

// Whether set_num_threads chose the thread count (reads num_threads(), fixing it).
bool threads_requested();

// As parallel_run, with up to `helpers` tasks of the host's pool taking part. The calling
// thread claims chunks too, so the call completes whether or not the host ever runs them.
void host_parallel_run(const HostPool& host, int helpers, int64_t num_tasks,
                       void (*task)(void* ctx, int64_t i), void* ctx);

// Whether jaxtile's own worker threads have been started in this process.
bool own_pool_started();

}  // namespace jaxtile
