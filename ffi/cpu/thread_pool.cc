#include "cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cfenv>
#include <condition_variable>
#include <cstdlib>
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
};

void run_tasks(Job& job) {
  for (int64_t i = job.next.fetch_add(1, std::memory_order_relaxed); i < job.num_tasks;
       i = job.next.fetch_add(1, std::memory_order_relaxed)) {
    job.task(job.ctx, i);
    job.done.fetch_add(1, std::memory_order_release);
  }
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
    spin_until([&] { return job.done.load(std::memory_order_acquire) == job.num_tasks; });
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

int detect_num_threads() {
  if (const int n = g_requested.load(); n > 0) return n;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

int num_threads() {
  g_fixed.store(true);
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

}  // namespace jaxtile
