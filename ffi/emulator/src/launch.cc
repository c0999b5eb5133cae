// Launching an emulated kernel through jaxtile's CPU kernel ABI: the tvm-ffi packed call
// (block_begin, block_end, then one DLTensor* per buffer) that jaxtile's FFI handler splits
// over its thread pool. Each CPU call runs its range of CUDA blocks one after another.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <tvm/ffi/c_api.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "block.h"

// Filled by jaxtile's kernel loader with its error hook (see ffi/library.cc).
extern "C" {
__attribute__((visibility("default"))) void (*__TVMFFIErrorSetRaisedFromCStr)(
    const char* kind, const char* message) = nullptr;
}

namespace jaxtile {
namespace emu {

thread_local int g_checks __attribute__((tls_model("initial-exec"))) = 1;

namespace {

// The watchdog's limit when neither the kernel nor $JAXTILE_EMULATOR_TIMEOUT sets one: far
// beyond any emulated kernel of the test suite, short of hanging a session forever.
constexpr double kDefaultTimeout = 600;

// Hardware limits (sm_80/sm_90): threads per block, block extents, grid extents, and the
// largest shared memory a block can opt in to.
constexpr uint32_t kMaxThreads = 1024;
constexpr uint64_t kMaxStaticShared = 48 * 1024;
constexpr uint64_t kMaxDynamicShared = 227 * 1024;

// GPUs keep f32 subnormals unless code is compiled with -ftz; XLA runs its computations (and
// so the threads that call kernels) with subnormals flushed. Blocks run with flushing off,
// and the caller's state is restored afterwards.
class GpuFloatingPoint {
 public:
#if defined(__x86_64__) || defined(__i386__)
  GpuFloatingPoint() : saved_(__builtin_ia32_stmxcsr()) {
    constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x40;
    __builtin_ia32_ldmxcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero));
  }
  ~GpuFloatingPoint() { __builtin_ia32_ldmxcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

int fail(const std::string& message) {
  if (__TVMFFIErrorSetRaisedFromCStr != nullptr) {
    __TVMFFIErrorSetRaisedFromCStr("RuntimeError", message.c_str());
  }
  return -1;
}

// The watchdog's limit in seconds for `spec` (0: none), or a message saying what is wrong with
// $JAXTILE_EMULATOR_TIMEOUT.
std::string time_limit(const KernelSpec& spec, double* seconds) {
  if (spec.settings != nullptr && spec.settings->timeout_s >= 0) {
    *seconds = spec.settings->timeout_s;
    return {};
  }
  *seconds = kDefaultTimeout;
  const char* env = std::getenv("JAXTILE_EMULATOR_TIMEOUT");
  if (env == nullptr || *env == '\0') return {};
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (*end != '\0' || !(v >= 0) || v > 1e9) {
    return std::string("$JAXTILE_EMULATOR_TIMEOUT must be a number of seconds (0: no limit), "
                       "got '") + env + "'";
  }
  *seconds = v;
  return {};
}

// Restores what a launch changed on its CPU thread, however it ends.
class LaunchScope {
 public:
  explicit LaunchScope(const KernelSpec* spec) : checks_(g_checks) {
    g_checks = spec->settings != nullptr ? spec->settings->checks != 0 : 1;
    use_reports_of(spec);
  }
  ~LaunchScope() {
    flush_counters();
    use_reports_of(nullptr);
    g_checks = checks_;
  }

 private:
  int checks_;
};

std::string check_geometry(const KernelSpec& s) {
  const DimSpec& b = s.block;
  const DimSpec& g = s.grid;
  const uint64_t threads = static_cast<uint64_t>(b.x) * b.y * b.z;
  if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) {
    return "grid and block extents must be positive";
  }
  if (threads > kMaxThreads || b.x > 1024 || b.y > 1024 || b.z > 64) {
    return "a block has at most 1024 threads, with x, y <= 1024 and z <= 64";
  }
  if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
    return "the grid is at most 2^31-1 x 65535 x 65535 blocks";
  }
  if (s.dynamic_smem > kMaxDynamicShared) {
    return "dynamic shared memory is at most 227 KiB per block";
  }
  return {};
}


// Runs blocks [begin, end) of the launch `b` is set up for, stopping at the first with an
// error (later blocks would mostly repeat it); `progress`, if given, follows the block running.
void run_blocks(Block& b, int64_t begin, int64_t end, volatile int64_t* progress) {
  const DimSpec grid = b.grid;
  for (int64_t lin = begin; lin < end; ++lin) {
    if (progress != nullptr) *progress = lin;
    const uint64_t u = static_cast<uint64_t>(lin);
    b.bidx = {static_cast<unsigned>(u % grid.x), static_cast<unsigned>((u / grid.x) % grid.y),
              static_cast<unsigned>(u / (static_cast<uint64_t>(grid.x) * grid.y))};
    reset_block_memory(b, kMaxStaticShared);
    run_block(b);
    add_counter(kBlockCount, 1);
    if (!first_error().empty()) break;
  }
}

// ---- isolated launches: blocks run in a forked worker process ----
//
// What cannot be contained by construction (a raw pointer dereferenced, an INT_MIN / -1, an
// endless loop that touches no memory) then ends the worker, not the caller's process. The
// worker shares one mapping with the parent: a header, then the buffers' final contents,
// then its report as text. Isolated launches take turns (one process-wide lock), so a worker
// starts from every earlier launch's results and the parent copies back only the bytes the
// worker changed.

// Whether `spec`'s launches are isolated, or a message saying what is wrong with
// $JAXTILE_EMULATOR_ISOLATE (read at each launch: the backend's launches come from XLA).
std::string isolation(const KernelSpec& spec, bool* on) {
  *on = false;
  if (spec.settings != nullptr && spec.settings->isolate >= 0) {
    *on = spec.settings->isolate != 0;
    return {};
  }
  const char* env = std::getenv("JAXTILE_EMULATOR_ISOLATE");
  if (env == nullptr || *env == '\0') return {};
  std::string v(env);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") {
    *on = true;
  } else if (!(v == "0" || v == "false" || v == "no" || v == "off")) {
    return std::string("$JAXTILE_EMULATOR_ISOLATE must be one of 1, true, yes, on or 0, "
                       "false, no, off, got '") + env + "'";
  }
  return {};
}

struct WorkerHeader {
  volatile int64_t block;       // the block it was running
  volatile int32_t signal;      // what stopped it (0: it finished)
  volatile int32_t tid;         // the CUDA thread running then (-1: none)
  volatile uint64_t pc;         // the instruction the signal interrupted
  uint64_t report_bytes;
  char first_error[16384];
};
constexpr size_t kWorkerReportBytes = 1 << 20;
// The worker's exit status after a signal it caught.
constexpr int kWorkerSignalled = 70;

WorkerHeader* g_worker = nullptr;  // in the worker only

void worker_signal(int sig, siginfo_t*, void* context) {
  g_worker->signal = sig;
  g_worker->tid = t_fiber != nullptr ? static_cast<int32_t>(t_fiber->tid) : -1;
#if defined(__x86_64__)
  g_worker->pc = static_cast<uint64_t>(
      static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#else
  (void)context;
#endif
  _exit(kWorkerSignalled);
}

[[noreturn]] void worker_main(Block& b, int64_t begin, int64_t end, WorkerHeader* h) {
  g_worker = h;
  // On an alternate stack: a stack overflow leaves the fiber's stack no room for a handler.
  stack_t alt{};
  alt.ss_size = 1 << 16;
  alt.ss_sp = std::malloc(alt.ss_size);
  sigaltstack(&alt, nullptr);
  struct sigaction sa{};
  sa.sa_sigaction = &worker_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  // The calling thread's signal mask is inherited: a fault under a blocked SIGSEGV would end
  // the worker without saying where.
  sigset_t caught;
  sigemptyset(&caught);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGUSR1}) {
    sigaction(sig, &sa, nullptr);
    sigaddset(&caught, sig);
  }
  sigprocmask(SIG_UNBLOCK, &caught, nullptr);
  use_fresh_reports();
  run_blocks(b, begin, end, &h->block);
  char* out = reinterpret_cast<char*>(h + 1);
  for (int32_t i = 0; i < b.spec->num_buffers; ++i) {
    std::memcpy(out, b.buffers[i].base, b.buffers[i].size);
    out += b.buffers[i].size;
  }
  const std::string report = export_reports();
  h->report_bytes = std::min(report.size(), kWorkerReportBytes);
  std::memcpy(out, report.data(), h->report_bytes);
  const std::string& error = first_error();
  std::memcpy(h->first_error, error.data(), std::min(error.size(), sizeof h->first_error - 1));
  _exit(0);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (an invalid memory access)";
    case SIGBUS: return "SIGBUS (an invalid memory access)";
    case SIGFPE: return "SIGFPE (an arithmetic fault, e.g. INT_MIN / -1)";
    case SIGILL: return "SIGILL (an illegal instruction)";
    case SIGABRT: return "SIGABRT (abort)";
    case SIGTRAP: return "SIGTRAP (a trap)";
    default: return "a signal";
  }
}

// The worker's thread and place when it stopped, as a report would name them.
std::string worker_where(Block& b, const WorkerHeader& h) {
  const uint64_t u = static_cast<uint64_t>(h.block);
  b.bidx = {static_cast<unsigned>(u % b.grid.x),
            static_cast<unsigned>((u / b.grid.x) % b.grid.y),
            static_cast<unsigned>(u / (static_cast<uint64_t>(b.grid.x) * b.grid.y))};
  std::string out;
  if (h.tid >= 0 && static_cast<uint32_t>(h.tid) < b.nthreads) {
    Fiber& f = b.fibers[static_cast<uint32_t>(h.tid)];
    f.tid = static_cast<uint32_t>(h.tid);
    f.tidx = {f.tid % b.bdim.x, (f.tid / b.bdim.x) % b.bdim.y, f.tid / (b.bdim.x * b.bdim.y)};
    out = thread_name(b, f.tid);
  } else {
    out = "block " + thread_name(b, UINT32_MAX);
  }
  // The kernel library is mapped where it was in the worker: the parent can name the line.
  const uint32_t line = source_line_of(reinterpret_cast<const void*>(h.pc + 1));
  return out + (line != 0 ? " at " + where(b, line) : "");
}

void run_isolated(Block& b, int64_t begin, int64_t end) {
  static std::mutex turns;
  std::lock_guard<std::mutex> lock(turns);
  size_t bytes = sizeof(WorkerHeader) + kWorkerReportBytes;
  for (int32_t i = 0; i < b.spec->num_buffers; ++i) bytes += b.buffers[i].size;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    report(kError, "isolate", "cannot map " + std::to_string(bytes) +
                                  " bytes to share with the worker process");
    return;
  }
  auto* h = new (p) WorkerHeader();
  h->block = begin;
  h->tid = -1;
  // The worker holds the write end of a pipe: its exit, however it ends, wakes the parent.
  int done[2];
  if (pipe2(done, O_CLOEXEC) != 0) {
    report(kError, "isolate", "cannot make a pipe to the worker process");
    munmap(p, bytes);
    return;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(done[0]);
    worker_main(b, begin, end, h);
  }
  close(done[1]);
  if (pid < 0) {
    report(kError, "isolate", "cannot start the worker process (fork failed)");
    close(done[0]);
    munmap(p, bytes);
    return;
  }
  // The watchdog's backstop: a worker stuck where it never polls (an endless loop touching no
  // memory) is asked where it is (SIGUSR1), then killed. Waits in slices of at most 100 ms,
  // in case a process forked elsewhere meanwhile holds a copy of the pipe.
  const uint64_t deadline = b.deadline_ns == 0 ? 0 : b.deadline_ns + 1000000000u;
  int status = 0;
  bool asked = false;
  uint64_t asked_at = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    const uint64_t now = now_ns();
    if (deadline != 0 && now > deadline && !asked) {
      kill(pid, SIGUSR1);
      asked = true;
      asked_at = now;
    } else if (asked && now > asked_at + 1000000000u) {
      kill(pid, SIGKILL);
    }
    pollfd wait_for{done[0], POLLIN, 0};
    if (poll(&wait_for, 1, 100) > 0) {  // the worker has exited: the pipe is at its end
      waitpid(pid, &status, 0);
      break;
    }
  }
  close(done[0]);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    // Copy back what the worker changed, 64 bytes at a time.
    const char* in = reinterpret_cast<const char*>(h + 1);
    for (int32_t i = 0; i < b.spec->num_buffers; ++i) {
      char* dst = b.buffers[i].base;
      const uint64_t n = b.buffers[i].size;
      for (uint64_t k = 0; k < n; k += 64) {
        const size_t m = static_cast<size_t>(std::min<uint64_t>(64, n - k));
        if (std::memcmp(dst + k, in + k, m) != 0) std::memcpy(dst + k, in + k, m);
      }
      in += n;
    }
    import_reports(std::string(in, h->report_bytes));
    first_error() = h->first_error;
  } else if (h->signal == SIGUSR1 || (asked && WIFSIGNALED(status))) {
    char limit[32];
    snprintf(limit, sizeof limit, "%g", b.timeout_s);
    report(kError, "timeout",
           std::string("the launch ran past its time limit of ") + limit +
               " s ($JAXTILE_EMULATOR_TIMEOUT; an endless loop?) and its worker process was "
               "stopped: " + worker_where(b, *h));
  } else {
    const int sig = h->signal != 0 ? h->signal : WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    report(kError, "worker-fault",
           std::string("the worker process running the launch stopped on ") +
               (sig != 0 ? signal_name(sig) : "exit status " +
                                                  std::to_string(WEXITSTATUS(status))) +
               " in " + worker_where(b, *h) +
               "; the kernel's outputs are unchanged (isolated launch, "
               "$JAXTILE_EMULATOR_ISOLATE)");
  }
  munmap(p, bytes);
}

}  // namespace

int launch(const KernelSpec* spec, const void* packed_args, int32_t num_args) {
  const auto* args = static_cast<const TVMFFIAny*>(packed_args);
  const std::string name = std::string("emulated kernel '") + spec->name + "': ";
  if (num_args != 2 + spec->num_buffers) {
    return fail(name + "expected " + std::to_string(spec->num_buffers) + " buffers, got " +
                std::to_string(num_args - 2));
  }
  std::vector<Region> buffers(static_cast<size_t>(spec->num_buffers));
  for (int32_t i = 0; i < spec->num_buffers; ++i) {
    const TVMFFIAny& a = args[2 + i];
    if (a.type_index != kTVMFFIDLTensorPtr) {
      return fail(name + "argument " + std::to_string(i) + " is not a tensor");
    }
    const auto* t = static_cast<const DLTensor*>(a.v_ptr);
    uint64_t count = 1;
    for (int32_t d = 0; d < t->ndim; ++d) count *= static_cast<uint64_t>(t->shape[d]);
    const uint64_t elem_bits = static_cast<uint64_t>(t->dtype.bits) * t->dtype.lanes;
    if (elem_bits != static_cast<uint64_t>(spec->buffer_elem_bytes[i]) * 8) {
      return fail(name + "buffer '" + spec->buffer_names[i] + "' has " +
                  std::to_string(elem_bits) + "-bit elements, the kernel expects " +
                  std::to_string(spec->buffer_elem_bytes[i] * 8));
    }
    buffers[i] = Region{static_cast<char*>(t->data) + t->byte_offset, count * elem_bits / 8,
                        spec->buffer_names[i], kGlobal, t->shape, t->ndim};
  }
  KernelSpec geometry = *spec;
  if (spec->grid_of != nullptr) geometry.grid = spec->grid_of(buffers.data());
  if (std::string why = check_geometry(geometry); !why.empty()) return fail(name + why);
  const DimSpec grid = geometry.grid;
  const int64_t begin = args[0].v_int64, end = args[1].v_int64;
  const int64_t num_blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (begin < 0 || begin > end || end > num_blocks) {
    return fail(name + "block range outside the grid");
  }

  double timeout = 0;
  if (std::string why = time_limit(*spec, &timeout); !why.empty()) return fail(name + why);
  bool isolate = false;
  if (std::string why = isolation(*spec, &isolate); !why.empty()) return fail(name + why);

  LaunchScope scope(spec);
  // Heap-held: this library's thread-local storage must stay small (see runtime.h).
  GpuFloatingPoint gpu_fp;
  static thread_local Block* block = nullptr;
  if (block == nullptr) block = new Block();
  Block& b = *block;
  b.spec = spec;
  b.buffers = buffers.data();
  b.bdim = {spec->block.x, spec->block.y, spec->block.z};
  b.grid = grid;
  b.nthreads = spec->block.x * spec->block.y * spec->block.z;
  b.warp_size = spec->warp_size;
  b.nwarps = (b.nthreads + b.warp_size - 1) / b.warp_size;
  b.fibers.resize(b.nthreads);
  b.collectives.assign(static_cast<size_t>(b.nwarps) * kCollectivesPerWarp, Collective{});
  b.stack_bytes = fiber_stack_bytes(*spec);
  b.timeout_s = timeout;
  b.deadline_ns = timeout > 0 ? now_ns() + static_cast<uint64_t>(timeout * 1e9) : 0;
  first_error().clear();
  if (isolate) {
    run_isolated(b, begin, end);
  } else {
    run_blocks(b, begin, end, nullptr);
    release_large_stacks();
  }
  if (!first_error().empty()) {
    std::string msg = name + first_error() +
                      " (all findings: the kernel's report(), or EmulatorError.report)";
    first_error().clear();
    return fail(msg);
  }
  return 0;
}

}  // namespace emu
}  // namespace jaxtile
