// Launching an emulated kernel through jaxtile's CPU kernel ABI: the tvm-ffi packed call
// (block_begin, block_end, then one DLTensor* per buffer) that jaxtile's FFI handler splits
// over its thread pool. Each CPU call runs its range of CUDA blocks one after another.
#include <tvm/ffi/c_api.h>

#include <cstdlib>
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
  b.nwarps = (b.nthreads + 31) / 32;
  b.fibers.resize(b.nthreads);
  b.collectives.assign(static_cast<size_t>(b.nwarps) * kCollectivesPerWarp, Collective{});
  b.stack_bytes = fiber_stack_bytes(*spec);
  b.timeout_s = timeout;
  b.deadline_ns = timeout > 0 ? now_ns() + static_cast<uint64_t>(timeout * 1e9) : 0;
  first_error().clear();
  for (int64_t lin = begin; lin < end; ++lin) {
    const uint64_t u = static_cast<uint64_t>(lin);
    b.bidx = {static_cast<unsigned>(u % grid.x), static_cast<unsigned>((u / grid.x) % grid.y),
              static_cast<unsigned>(u / (static_cast<uint64_t>(grid.x) * grid.y))};
    reset_block_memory(b, kMaxStaticShared);
    run_block(b);
    add_counter(kBlockCount, 1);
    // Stop at the first block with an error: later blocks would mostly repeat it.
    if (!first_error().empty()) break;
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
