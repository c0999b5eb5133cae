#include "cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cfenv>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace jaxtile {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

template <typename Pred>
void spin_until(Pred done) {
  for (int i = 0; !done(); ++i) {
    if (i < 4096) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

// The floating-point control state of a thread: rounding mode and, on x86, whether subnormals
// are flushed (XLA runs its computations, and so our kernels' calling thread, with FTZ/DAZ on).
#if defined(__x86_64__) || defined(__i386__)
using FpState = unsigned;
FpState get_fp_state() { return __builtin_ia32_stmxcsr(); }
void set_fp_state(FpState s) { __builtin_ia32_ldmxcsr(s); }
#else
using FpState = std::fenv_t;
FpState get_fp_state() {
  std::fenv_t e;
  std::fegetenv(&e);
  return e;
}
void set_fp_state(const FpState& s) { std::fesetenv(&s); }
#endif

struct Job {
  void (*task)(void*, int64_t);
  void* ctx;
  int64_t num_tasks;
  // The caller's floating-point state: workers adopt it for the job, so a chunk computes the
  // same whichever thread runs it (a worker would otherwise keep the state of the thread that
  // happened to create the pool).
  FpState fp_state;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  // Set by a caller about to sleep until the last chunk is done; the worker finishing it
  // then wakes the caller (under done_mu, so the wake-up cannot fall between the caller's
  // check and its wait).
  std::atomic<bool> caller_asleep{false};
  std::mutex done_mu{};
  std::condition_variable done_cv{};
  // For a job on the host's pool, whose helpers may start after the call returned: the
  // holders of the job (the caller and each helper not yet finished); the last frees it.
  std::atomic<int> refs{0};
};

void release(Job* job) {
  if (job->refs.fetch_sub(1) == 1) delete job;
}

void run_tasks(Job& job) {
  for (int64_t i = job.next.fetch_add(1, std::memory_order_relaxed); i < job.num_tasks;
       i = job.next.fetch_add(1, std::memory_order_relaxed)) {
    job.task(job.ctx, i);
    if (job.done.fetch_add(1) + 1 == job.num_tasks && job.caller_asleep.load()) {
      std::lock_guard<std::mutex> lock(job.done_mu);
      job.done_cv.notify_one();
    }
  }
}

// Waits until every chunk of `job` is done. A short spin covers the common case (the other
// threads finish their last chunk within microseconds of the caller); past it the caller
// sleeps: in a jitted step XLA's own threads share the cores, and a caller spinning or
// yielding in a loop while a preempted worker finishes would take their time (issue 20).
void wait_done(Job& job) {
  // Sequentially consistent, against run_tasks's increment-then-load of caller_asleep.
  const auto finished = [&] { return job.done.load() == job.num_tasks; };
  for (int i = 0; i < 2048; ++i) {
    if (finished()) return;
    cpu_relax();
  }
  std::unique_lock<std::mutex> lock(job.done_mu);
  job.caller_asleep.store(true);
  job.done_cv.wait(lock, finished);
}

class Pool {
 public:
  explicit Pool(int num_workers) {
    // Workers are detached and the pool is never destroyed: joining threads during static
    // destruction at interpreter exit is a classic source of hangs.
    for (int i = 0; i < num_workers; ++i) std::thread([this] { worker_loop(); }).detach();
  }

  bool run(Job& job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    current_.store(&job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    run_tasks(job);
    wait_done(job);
    // `job` lives on the caller's stack: after unpublishing it, wait out workers that may
    // still hold the pointer. Sequentially consistent ordering against worker_loop's
    // increment-then-load makes this exact.
    current_.store(nullptr);
    spin_until([&] { return active_.load() == 0; });
    return true;
  }

 private:
  // Workers sleep rather than spin between jobs: they share the cores with XLA's own threads
  // and Python, and on a small machine a spinning worker made tiny kernels ~2x slower. A late
  // worker costs little because the caller claims chunks itself.
  void worker_loop() {
    uint64_t seen = generation_.load();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load() != seen; });
      }
      seen = generation_.load();
      active_.fetch_add(1);
      if (Job* job = current_.load()) {
        const FpState own = get_fp_state();
        set_fp_state(job->fp_state);
        run_tasks(*job);
        set_fp_state(own);
      }
      active_.fetch_sub(1);
    }
  }

  std::mutex busy_;  // held by the one caller whose job is current
  std::atomic<Job*> current_{nullptr};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};  // workers that may be touching *current_
  std::mutex mu_;  // pairs with cv_ so a bump of generation_ cannot slip past a waiter
  std::condition_variable cv_;
};

std::atomic<Pool*> g_pool{nullptr};
std::mutex* g_pool_mu = new std::mutex;

// The child of a fork() has none of the worker threads, and a lock held by one of the
// parent's threads stays locked forever; start from scratch there.
void reset_after_fork() {
  g_pool.store(nullptr);
  g_pool_mu = new std::mutex;
}

Pool& pool() {
  if (Pool* p = g_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lock(*g_pool_mu);
  if (Pool* p = g_pool.load()) return *p;
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, reset_after_fork); });
  auto* p = new Pool(num_threads() - 1);
  g_pool.store(p, std::memory_order_release);
  return *p;
}

std::atomic<int> g_requested{0};
std::atomic<bool> g_fixed{false};

// The CPUs a cgroup v2 CPU quota (`cpu.max`: "<quota> <period>" or "max <period>", as
// containers set it) lets this process use, rounded up; 0 when there is no quota. More
// threads than that only take turns on the quota, preempting XLA's threads and each other.
int cgroup_cpu_limit() {
#if defined(__linux__)
  std::FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r");
  if (f == nullptr) return 0;
  char quota[32] = {0};
  long long period = 0;
  const int got = std::fscanf(f, "%31s %lld", quota, &period);
  std::fclose(f);
  if (got != 2 || period <= 0 || std::strcmp(quota, "max") == 0) return 0;
  const long long q = std::atoll(quota);
  return q > 0 ? static_cast<int>((q + period - 1) / period) : 0;
#else
  return 0;
#endif
}

int detect_num_threads() {
  if (const int n = g_requested.load(); n > 0) return n;
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (const int limit = cgroup_cpu_limit(); limit > 0 && limit < n) n = limit;
  return n > 0 ? n : 1;
}

}  // namespace

int num_threads() {
  // Read first: a store on every kernel call would be a locked instruction on the hot path.
  if (!g_fixed.load(std::memory_order_relaxed)) g_fixed.store(true);
  static const int n = detect_num_threads();
  return n;
}

bool set_num_threads(int n) {
  if (n < 1 || g_fixed.load()) return false;
  g_requested.store(n);
  return true;
}

bool parallel_run(int64_t num_tasks, void (*task)(void* ctx, int64_t i), void* ctx) {
  Job job{task, ctx, num_tasks, get_fp_state()};
  return pool().run(job);
}

bool threads_requested() {
  num_threads();
  return g_requested.load() > 0;
}

ThreadPlan plan_threads(int own, bool requested, int64_t host_threads) {
  if (requested || host_threads <= 0) return ThreadPlan{own, false};
  // The calling thread plus at most one task per host thread.
  const int64_t threads = std::min<int64_t>(own, host_threads + 1);
  return ThreadPlan{static_cast<int>(threads), true};
}

void host_parallel_run(const HostPool& host, int helpers, int64_t num_tasks,
                       void (*task)(void* ctx, int64_t i), void* ctx) {
  auto* job = new Job{task, ctx, num_tasks, get_fp_state()};
  job->refs.store(helpers + 1);
  for (int h = 0; h < helpers; ++h) {
    host.schedule(host.pool, [](void* arg) {
      auto* j = static_cast<Job*>(arg);
      const FpState own = get_fp_state();
      set_fp_state(j->fp_state);
      run_tasks(*j);
      set_fp_state(own);
      release(j);
    }, job);
  }
  // A helper that starts late finds no chunk left: `ctx` (the caller's) is only touched for
  // a claimed chunk, and the caller returns once every claimed chunk is done.
  run_tasks(*job);
  wait_done(*job);
  release(job);
}

bool own_pool_started() { return g_pool.load() != nullptr; }

}  // namespace jaxtile
