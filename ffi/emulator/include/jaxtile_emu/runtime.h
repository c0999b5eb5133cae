// The emulator runtime's interface to device code: what device_emu.h's inline operations call.
//
// A CUDA block runs on one CPU thread; its CUDA threads are fibers switched cooperatively at
// barriers and warp collectives, so nothing here needs locks except the report sink.
#pragma once

#include <stddef.h>
#include <stdint.h>

// The runtime is one shared library that every emulated kernel library links to, so its
// thread-local state (the current fiber, counted with the initial-exec model on the hot path)
// exists once per process and fits the static TLS a dlopen()ed library may use.
#pragma GCC visibility push(default)

namespace jaxtile {
struct idx3;
namespace emu {

enum Space : uint8_t { kGlobal = 0, kShared = 1, kNull = 2 };
// kNoBankLog: an access already counted for bank conflicts as part of a warp-wide one.
enum AccessKind : int { kRead = 1, kWrite = 2, kAtomic = 4, kNoBankLog = 8 };

// One allocation device code can reach: a kernel buffer, a shared array or the dynamic shared
// buffer. Checked pointers carry it so that every access is bounds-checked against it.
struct Region {
  char* base;
  uint64_t size;
  const char* name;
  uint8_t space;
  const int64_t* shape = nullptr;  // a global buffer's dimensions (DLTensor shape)
  int32_t ndim = 0;
};

// The region of default-constructed (null) pointers: every access through it is reported.
extern const Region kNullRegion;

// Non-zero while the costly checks (races, uninitialised reads, cp.async hazards, bank
// conflicts) are on. Bounds checks are always on: an out-of-bounds access never touches memory.
// Per CPU thread: each launch sets it from its own kernel's settings, so that one kernel's
// `set_checks` leaves the kernels launched beside it alone.
extern thread_local int g_checks __attribute__((tls_model("initial-exec")));

// Memory accesses made by device code on this CPU thread (the benchmark's operation count).
extern thread_local uint64_t t_accesses __attribute__((tls_model("initial-exec")));

// Reports an access outside `r` (or through a null pointer) and returns false: the caller
// skips the access (reads yield zero).
bool access_out_of_bounds(const Region* r, const void* addr, uint32_t bytes, int kind,
                          uint32_t line);
// Reports an access whose address is not a multiple of its natural alignment (the GPU faults
// on it) and returns false: the caller skips it.
bool access_misaligned(const Region* r, const void* addr, uint32_t bytes, int kind,
                       uint32_t line);
// Race, uninitialised-read, cp.async-hazard and bank bookkeeping of a shared access by the
// current thread. Returns true (the access goes ahead).
bool access_shared(const Region* r, const void* addr, uint32_t bytes, int kind, uint32_t line);

// Every 2^16 accesses of a CPU thread: stops the block if the launch ran past its time limit
// (an infinite loop that reads or writes memory). Never returns in that case.
void poll_watchdog(uint32_t line);

inline bool access(const Region* r, const void* addr, uint32_t bytes, int kind, uint32_t line) {
  if (__builtin_expect((++t_accesses & 0xffff) == 0, 0)) poll_watchdog(line);
  const uintptr_t off = reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(r->base);
  if (off > r->size || bytes > r->size - off) {
    return access_out_of_bounds(r, addr, bytes, kind, line);
  }
  if (g_checks && r->space == kShared) return access_shared(r, addr, bytes, kind, line);
  return true;
}

// Geometry of the current thread.
idx3 cur_thread_idx();
idx3 cur_block_idx();
idx3 cur_block_dim();
idx3 cur_grid_dim();
unsigned cur_lane();
unsigned cur_warp();

// Barriers: `sync_threads` is barrier 0 over the whole block, whose arrivals must all come
// from the same source line.
void barrier(unsigned id, unsigned nthreads, bool whole_block, uint32_t line);
// `bar.arrive`: counts the calling thread toward named barrier `id`'s `nthreads` without
// waiting; the arrival that completes the count releases the threads waiting in `barrier`.
void barrier_arrive(unsigned id, unsigned nthreads, uint32_t line);

// Warp collectives: every lane named in `mask` must arrive with the same op; the last arrival
// computes every lane's result from all lanes' inputs. Masks have a bit per lane of the
// kernel's warp (32 lanes, or 64 for AMD's waves); a ballot's result is a uint64_t.
enum CollectiveKind : int {
  kShflXor,
  kShflDown,
  kShflUp,
  kShflIdx,
  kVoteAll,
  kVoteAny,
  kBallot,
  kSyncWarp,
  kLdmatrix,  // arg = count (1, 2, 4) | 16 when transposed
  kMmaF16,
  kMmaBf16,
  kMmaTf32,
  // AMD's MFMA (wave64 mode only; lane layouts in warp_ops.cc): in = MmaIn, out = float[].
  kMfma16x16x16F16,
  kMfma16x16x16Bf16,
  kMfma32x32x8F16,
  kMfma32x32x8Bf16,
  kMfma32x32x4Xf32,  // gfx942: float32 operands (their bits in MmaIn's a and b)
  kMfma16x16x8Xf32,
};
struct LdmatrixIn {
  const char* addr;
  const Region* region;
};
struct MmaIn {
  const uint32_t* a;
  const uint32_t* b;
  const float* c;
};
void collective(int kind, uint64_t mask, const void* in, void* out, int arg, uint32_t line);

// cp.async: the copy is read now and lands in shared memory at the wait_group that retires it.
void cp_async(const Region* dst_r, void* dst, const Region* src_r, const void* src, int bytes,
              int src_bytes, uint32_t line);
void cp_async_commit();
void cp_async_wait(int pending, uint32_t line);
// LDS-direct load (wave64): `bytes` read now at `src` land at `dst` when a wait_vmcnt retires
// the load; lds_vm_wait(N) retires all of this lane's but its newest N.
// `src_bytes` of the `bytes` come from `src`, the rest are zeros (a buffer load past its end).
void lds_direct_load(const Region* dst_r, void* dst, const Region* src_r, const void* src,
                     int bytes, uint32_t line, int src_bytes = -1);
void lds_vm_wait(int pending, uint32_t line);

// Ordering between blocks. A block's global writes are remembered (global_write); a thread
// whose last flag read (volatile_load, or load_acquire) was relaxed, with no fence since,
// is ordered after no other block's writes, and its reads of global memory its own block did
// not write are reported (global_read). An acquire read or a fence clears that state; a
// barrier spreads it to its participants.
void global_write(const void* addr, uint32_t bytes);
void global_read(const Region* r, const void* addr, uint32_t bytes, uint32_t line);
void flag_read(const Region* r, bool acquire, uint32_t line);
void fence();

// Atomic read-modify-write of 4 bytes at `addr`; op is one of the AtomicOp values.
enum AtomicOp : int { kAddF32, kAddI32, kAddU32, kMaxI32, kMinI32, kExchI32 };
uint32_t atomic_rmw(const Region* r, void* addr, int op, uint32_t value, uint32_t line);
// Compare-and-swap of `bytes` (4 or 8) at `addr`: stores `value` if it holds `compare`;
// returns what it held. A real CPU compare-and-swap, since blocks run on several threads.
uint64_t atomic_cas(const Region* r, void* addr, int bytes, uint64_t compare, uint64_t value,
                    uint32_t line);

// A per-block shared array of `bytes`, the same for every thread of the block: the k-th
// declaration a thread executes maps to the k-th allocation of its block.
void* shared_array(uint64_t bytes, const char* name, const Region** region, uint32_t line);
void* dynamic_shared(const Region** region);
// A named view of `bytes` at `offset` in the dynamic shared buffer (declared in the same order
// by every thread, like shared_array): accesses through it are bounds-checked against the
// view and reported under its name; views may overlap (buffers reusing bytes), and races are
// tracked per byte of the block's shared memory whatever view reaches it.
void* shared_view(uint64_t offset, uint64_t bytes, const char* name, const Region** region,
                  uint32_t line);

// ---- Hopper (sm_90a): mbarriers, TMA, wgmma, proxy fences, setmaxnreg ----
// (src/mbarrier.cc, src/wgmma.cc)
// kAsyncProxy marks an access made by the async proxy (TMA, wgmma): checked against generic
// writes not followed by fence.proxy.async.
constexpr int kAsyncProxy = 16;

// The emulator's tensor map: what a CUtensorMap holds on the GPU (128 bytes), built by the
// host and passed to the kernel in a global buffer. `buffer` names the kernel's buffer
// parameter (counting buffers only) the map describes.
constexpr uint32_t kTensorMapMagic = 0x4a544d31u;  // "JTM1"
struct TensorMap {
  uint32_t magic;
  uint32_t buffer;
  uint32_t rank;          // 1..5
  uint32_t elem_bytes;    // 1, 2, 4 or 8
  uint64_t dims[5];       // elements, innermost first
  uint64_t strides[4];    // bytes between consecutive indices of dims 1..4 (multiples of 16)
  uint32_t box[5];        // the box a copy moves, innermost first (each at most 256)
  uint32_t swizzle;       // 0 (none), 32, 64 or 128 bytes
  uint32_t reserved[4];
};
static_assert(sizeof(TensorMap) == 128, "a tensor map is 128 bytes, as CUtensorMap");

// The shared-window address of `p` (its byte offset in the block's shared memory).
uint32_t smem_address(const Region* r, const void* p, uint32_t line);
void mbarrier_init(const Region* r, void* bar, uint32_t count, uint32_t line);
// An arrival; with `expect`, first raises the phase's transaction count by `tx_bytes`.
void mbarrier_arrive(const Region* r, void* bar, bool expect, uint32_t tx_bytes, uint32_t line);
// Suspends the thread until the phase of parity `parity` has completed; returns true.
bool mbarrier_try_wait(const Region* r, void* bar, uint32_t parity, uint32_t line);
void fence_proxy_async();
void fence_mbarrier_init();
// cp.async.bulk.tensor global -> shared: the box at `coords` (innermost first) completes
// its bytes on `bar`; the data lands when the barrier's phase completes.
void tma_load(const Region* dst_r, void* dst, const Region* map_r, const void* map,
              const Region* bar_r, void* bar, const int32_t* coords, int rank, uint32_t line);
// cp.async.bulk.tensor shared -> global (bulk group): read now, written at the wait.
void tma_store(const Region* map_r, const void* map, const Region* src_r, const void* src,
               const int32_t* coords, int rank, uint32_t line);
void bulk_commit();
void bulk_wait(int pending, uint32_t line);
enum WgmmaType : int { kWgmmaF16, kWgmmaBf16, kWgmmaTf32, kWgmmaE4m3, kWgmmaE5m2 };
struct WgmmaIn {
  float* acc;             // the thread's N/2 accumulator registers
  uint32_t* in_flight;    // the accumulator's "result not retired" mark (the issuing line)
  int n;
  int type;
  uint64_t desc_a, desc_b;
  const uint32_t* a;      // the register-A form's 4 registers, or null (A from desc_a)
  int scale_d;            // 0: D = A*B, else D = A*B + D
  bool trans_a, trans_b;  // imm-trans-a / imm-trans-b: that operand is MN-major
};
void wgmma(const WgmmaIn* in, uint32_t line);
void wgmma_fence();
void wgmma_commit();
void wgmma_wait(int pending, uint32_t line);
// An access to an accumulator (`in_flight` is its mark): reported while a wgmma writing it
// is not retired; remembered until the next wgmma_fence.
void wgmma_acc_access(uint32_t in_flight, uint32_t line);
// An accumulator register index outside [0, N/2): reported, and the block stops.
[[noreturn]] void wgmma_acc_out_of_range(int64_t index, int n, uint32_t line);
void setmaxnreg(bool inc, uint32_t regs, uint32_t line);

// ---- faults device code cannot be allowed to take (see the launch shim) ----
// A failed device `assert`: reports the expression, thread and line, and fails the launch.
[[noreturn]] void device_assert_failed(const char* expr, uint32_t line);
// An integer division or remainder by zero at `line` of `file` (found by g++'s divide-by-zero
// instrumentation): reported, and the block stops before the division traps.
[[noreturn]] void divide_by_zero(const char* file, uint32_t line);
// Called on entry to every device function: fails the block, naming the call at `call_site`,
// when the thread's stack is nearly used up (deep recursion), before it overflows.
void check_stack(void* call_site);

// ---- launching ----
struct DimSpec {
  unsigned x, y, z;
};

// What one kernel library's launches use, set from Python through the shim's
// `jaxtile_emu_kernel_settings` (one instance per library, so per kernel).
struct KernelSettings {
  int32_t checks = 1;          // the costly checks (g_checks) for this kernel's launches
  int32_t isolate = -1;        // run launches in a worker process; -1: $JAXTILE_EMULATOR_ISOLATE
  double timeout_s = -1;       // watchdog limit in seconds (0: none); -1: $JAXTILE_EMULATOR_TIMEOUT
  uint64_t stack_bytes = 0;    // what the kernel's frames need per CUDA thread (build.py)
  void* sink = nullptr;        // this kernel's findings (report.cc), made on first use
};
struct KernelSpec {
  const char* name;
  const char* file;
  DimSpec grid, block;
  uint32_t dynamic_smem;
  int32_t num_buffers;
  const char* const* buffer_names;
  const int32_t* buffer_elem_bytes;
  // Calls the kernel with its arguments; run by every thread of every block.
  void (*entry)(const Region* buffers);
  // For a grid that depends on dynamic sizes: the grid for these buffers (else `grid`).
  DimSpec (*grid_of)(const Region* buffers) = nullptr;
  KernelSettings* settings = nullptr;
  // Lanes per warp: 32 (CUDA), or 64 for AMD's waves (the hip-emulator's wave64 mode).
  uint32_t warp_size = 32;
};

// Runs blocks [begin, end) of a kernel from a tvm-ffi packed argument list (block_begin,
// block_end, then one DLTensor* per buffer). Returns 0, or -1 with the error message set
// through the tvm-ffi error hook (and kept in the kernel's report, see take_report).
int launch(const KernelSpec* spec, const void* packed_args, int32_t num_args);

// Takes `spec`'s findings, bank statistics and counters gathered since the last call, as
// JSON (see report.cc for the fields). Returns the text's length; copies it (NUL-terminated)
// only if `cap` is larger, and only then clears them.
size_t take_report(const KernelSpec* spec, char* buf, size_t cap);

}  // namespace emu
}  // namespace jaxtile

#pragma GCC visibility pop
