// Internal state of the emulator: one Block per CPU thread at a time, its CUDA threads as
// fibers, and the shadow state the checks keep for its shared memory.
#pragma once

#include <stdint.h>

#include <string>
#include <utility>
#include <vector>

#include "jaxtile/device.h"

namespace jaxtile {
namespace emu {

struct Block;

// One lane's part of a warp-wide shared access, for bank-conflict counting.
struct BankAccess {
  uint32_t line;
  uint32_t lane;
  uint64_t offset;  // from the start of the block's shared memory
  uint32_t bytes;
};

// A copy issued by cp.async, waiting for the wait_group that retires its group.
struct PendingCopy {
  char* dst;
  const Region* region;
  uint32_t bytes;
  uint32_t line;
  uint64_t group;
  unsigned char data[16];
};

// A wgmma's result for one thread, written to its accumulator at the wait_group retiring it.
struct PendingWgmma {
  float* acc;
  uint32_t* in_flight;
  uint64_t group;
  uint32_t line;
  std::vector<float> values;
};

// The shared bytes (2-byte elements) a wgmma's group reads: the async proxy may read them
// until the wait that retires the group, so they are checked again as read there.
struct PendingRead {
  uint64_t group;
  uint32_t line;
  std::vector<uint32_t> offsets;
};

// A TMA store's data (read from shared memory at issue), written at the bulk wait.
struct PendingStore {
  uint64_t group;
  uint32_t line;
  uint64_t smem_offset, smem_bytes;  // the shared tile it reads until its group retires
  std::vector<std::pair<char*, std::vector<char>>> rows;  // global destination, bytes
};

// A TMA load waiting for its mbarrier's phase to complete.
struct PendingTma {
  uint32_t tid;          // the issuing thread
  uint32_t line;
  const Region* region;  // the destination's
  uint64_t offset;       // of the destination in shared memory
  std::vector<char> data;
};

// An mbarrier's state, keyed by its shared-memory offset. Each phase's arrivals join their
// clocks into `arrivals`; a thread that sees the phase complete joins `completed`.
struct Mbarrier {
  uint64_t offset = 0;
  const Region* region = nullptr;
  uint32_t init_line = 0, init_tid = 0, init_clock = 0, init_gen = 0;
  uint32_t count = 0;      // arrivals per phase
  uint32_t pending = 0;    // arrivals still missing in the current phase
  int64_t tx = 0;          // transaction bytes still expected in the current phase
  uint32_t phase = 0;      // phases completed
  uint32_t expect_line = 0;
  std::vector<PendingTma> loads;  // bound to the current phase
  uint32_t clock_gen = 0;
  std::vector<uint32_t> arrivals, completed;
  std::vector<uint32_t> waiters;
};

// The rendezvous of a warpgroup's 128 threads at a .sync.aligned operation.
struct WarpgroupSync {
  int kind = 0;  // a WarpgroupOp; kWgNone while none is open
  uint32_t line = 0;
  uint32_t arrived = 0;
  const void* in[128];
};
enum WarpgroupOp : int { kWgNone, kWgWgmma, kWgSetmaxnreg };

enum FiberState : uint8_t { kReady, kBlocked, kDone };
enum WaitKind : uint8_t {
  kNoWait,
  kWaitBarrier,
  kWaitCollective,
  kWaitMbarrier,   // wait_id: index in Block::mbarriers
  kWaitWarpgroup,  // wait_id: the WarpgroupOp
  kWaitRegisters,  // setmaxnreg.inc waiting for registers (wait_id: the count asked)
};

struct Fiber {
  void* sp = nullptr;
  char* stack_low = nullptr;  // the lowest usable byte of its stack (the guard page is below)
  Block* block = nullptr;
  uint32_t tid = 0;
  idx3 tidx{0, 0, 0};
  uint8_t state = kReady;
  // What a blocked fiber waits for, for deadlock reports.
  uint8_t wait_kind = kNoWait;
  uint32_t wait_id = 0;
  uint32_t wait_line = 0;
  uint32_t shared_decls = 0;
  uint64_t open_group = 0;  // id of the cp.async group not yet committed
  std::vector<PendingCopy> copies;  // in issue order, hence in group order
  size_t copies_head = 0;
  // LDS-direct loads (wave64) in flight, in issue order; `group` is the load's number among
  // this lane's LDS-direct loads, of which `lds_loads_issued` were issued.
  std::vector<PendingCopy> lds_loads;
  size_t lds_loads_head = 0;
  uint64_t lds_loads_issued = 0;
  // The last flag read of global memory, while it was relaxed (volatile) and no fence has
  // followed: reads of other blocks' data are not ordered after it (null otherwise).
  const Region* relaxed_flag = nullptr;
  uint32_t relaxed_flag_line = 0;
  // Hopper (mbarrier.cc, wgmma.cc). The fence.proxy.async calls so far (shared bytes keep
  // their generic writer's count at the write: it is fenced once the count has grown).
  uint32_t proxy_fences = 0;
  uint32_t acc_access_line = 0;  // the last accumulator access not followed by wgmma_fence
  uint64_t wgmma_group = 0;      // id of the wgmma group not yet committed
  std::vector<PendingWgmma> wgmmas;
  std::vector<PendingRead> wgmma_reads;
  uint64_t bulk_group = 0;       // id of the bulk (TMA store) group not yet committed
  std::vector<PendingStore> stores;
  uint32_t wait_parity = 0;      // for a thread waiting on an mbarrier: the parity it waits for
};

// Shadow state of one byte of shared memory. `gen` is the block-wide barrier generation the
// access epochs belong to: a whole-block barrier orders everything before it, so an older
// generation means "no concurrent access". Generations and block serial numbers only grow
// on a CPU thread, so the shadow is reused from block to block without clearing.
// Reads are kept as a set of up to kReadSlots epochs not ordered with each other (a read
// ordered after an earlier one replaces it: a write ordered after the later read is ordered
// after both); beyond that the oldest is forgotten.
constexpr int kReadSlots = 4;
struct Cell {
  uint32_t gen;
  uint32_t wclk;           // vector-clock epoch of the last write in this generation
  uint32_t wline;          // its source line
  uint16_t wtid;           // its thread (kNoThread if none)
  uint16_t nreads;         // read epochs held
  uint32_t written;        // serial number of the last block that wrote it
  uint32_t pending;        // copies in flight to it: cp.async ones + kTmaPending x TMA ones
  uint16_t gtid;           // its last generic-proxy writer in this block (kNoThread if none)
  uint32_t gline;          // that write's line
  uint32_t gfences;        // the writer's fence.proxy.async count at the write
  uint16_t store_reads;    // TMA stores reading it that no bulk_wait_group has retired yet
  uint16_t rtid[kReadSlots];
  uint32_t rclk[kReadSlots];
  uint32_t rline[kReadSlots];
};
constexpr uint16_t kNoThread = 0xffff;
constexpr uint32_t kTmaPending = 1u << 16;

struct Barrier {
  uint32_t expected = 0;
  uint32_t line = 0;
  bool whole_block = false;
  std::vector<uint32_t> arrived;      // every arrival of the open instance, in order
  std::vector<uint32_t> arrive_only;  // those by bar.arrive (they do not wait)
  std::vector<uint32_t> arrive_clock; // the arrive-only threads' clocks when they arrived
};

// Sized for the widest warp (AMD's 64-lane waves); a CUDA warp uses the first 32 lanes.
constexpr uint32_t kMaxWarpSize = 64;
struct Collective {
  bool open = false;
  int kind = 0;
  uint64_t mask = 0;
  uint32_t line = 0;
  uint64_t arrived = 0;
  const void* in[kMaxWarpSize];
  void* out[kMaxWarpSize];
  int arg[kMaxWarpSize];
  uint32_t lines[kMaxWarpSize];
};
constexpr int kCollectivesPerWarp = 4;

struct SharedDecl {
  uint64_t offset, bytes;
  const char* name;
  uint32_t line;
};

struct Block {
  const KernelSpec* spec = nullptr;
  const Region* buffers = nullptr;  // the kernel's global buffers, in parameter order
  idx3 bidx{0, 0, 0};
  idx3 bdim{1, 1, 1};
  DimSpec grid{1, 1, 1};  // the launch grid (a kernel with dynamic sizes computes it)
  uint32_t nthreads = 0;
  uint32_t nwarps = 0;
  uint32_t warp_size = 32;  // the kernel's (KernelSpec::warp_size)

  std::vector<Fiber> fibers;
  std::vector<uint32_t> ready;  // ring buffer of fiber ids
  size_t ready_head = 0, ready_count = 0;
  void* main_sp = nullptr;
  uint32_t done = 0;
  bool aborted = false;
  bool ended_clean = false;  // the last block run had every thread exit (set by run_block)
  size_t stack_bytes = 0;     // per fiber, for this launch

  // The watchdog: the launch's time limit, checked every so many accesses and barriers.
  double timeout_s = 0;       // 0: none
  uint64_t deadline_ns = 0;   // CLOCK_MONOTONIC; 0: none
  uint32_t sync_ops = 0;

  // Shared memory: static arrays from offset 0, then the dynamic buffer.
  std::vector<char> smem_storage;
  char* smem = nullptr;
  uint64_t smem_capacity = 0, smem_static = 0;
  std::vector<SharedDecl> decls;
  std::vector<Region> regions;  // reserved up front: checked pointers keep their addresses
  Region dynamic_region{};

  // Checks.
  std::vector<Cell> shadow;
  uint32_t gen = 0;
  uint32_t serial = 0;  // of the block on this CPU thread, from 1
  std::vector<uint32_t> vc;  // nthreads x nthreads vector clocks, row per thread
  std::vector<std::vector<BankAccess>> bank_log;  // per thread, since the warp converged

  // Byte ranges [begin, end) of global memory this block wrote, in write order; sorted and
  // merged up to `writes_merged` entries when a check looks them up.
  std::vector<std::pair<uintptr_t, uintptr_t>> global_writes;
  size_t writes_merged = 0;

  Barrier barriers[16];
  // Hopper (mbarrier.cc, wgmma.cc).
  std::vector<Mbarrier> mbarriers;
  std::vector<WarpgroupSync> warpgroups;
  std::vector<uint32_t> regs;  // setmaxnreg: registers per thread of each warpgroup
  uint32_t reg_pool = 0;       // the block's registers (what it launched with): the CTA pool
  std::vector<uint32_t> pending_inc;  // a setmaxnreg.inc waiting for registers (0: none)
  std::vector<Collective> collectives;  // kCollectivesPerWarp per warp

  uint32_t* clock_of(uint32_t tid) { return vc.data() + static_cast<size_t>(tid) * nthreads; }
};

// The fiber running on this CPU thread (null outside a block).
extern thread_local Fiber* t_fiber __attribute__((tls_model("initial-exec")));

// ---- scheduling (scheduler.cc) ----
void park(Fiber* me);       // blocks `me` and runs someone else
void wake(Fiber* f);        // makes a blocked fiber runnable
[[noreturn]] void abort_block(Fiber* me);  // after a fatal report: abandon the block
// Runs one block to completion (or to a reported deadlock or fatal error).
void run_block(Block& b);
// Nanoseconds on the monotonic clock, for the watchdog's deadline.
uint64_t now_ns();

// ---- fibers (fiber.cc) ----
// What a thread's stack keeps free below the deepest device frame allowed, for the runtime
// functions device code calls (reports included): check_stack fails the block past it.
constexpr size_t kStackReserve = 64 * 1024;
// Bytes of stack each CUDA thread of `spec` gets: its frames' needs or the default, if larger.
size_t fiber_stack_bytes(const KernelSpec& spec);
// Gives back the memory this CPU thread's stacks touched if they are larger than the default
// (a kernel with large per-thread arrays), so that it does not stay committed after the launch.
void release_large_stacks();
// Prepares `f` to start in fiber_main on stack `stack_index` of `count` stacks of
// `stack_bytes` each; false if they cannot be mapped.
bool fiber_init(Fiber& f, uint32_t stack_index, uint32_t count, size_t stack_bytes);
void fiber_switch(void** save_sp, void* to_sp);
void fiber_main(Fiber* f);

// ---- warp operations (warp_ops.cc) ----
void complete_collective(Block& b, uint32_t warp, Collective& c);
// The mask naming every lane of a warp of `warp_size` lanes.
inline uint64_t full_mask(uint32_t warp_size) {
  return warp_size >= 64 ? ~0ull : (1ull << warp_size) - 1;
}

// ---- memory (memory.cc) ----
void reset_block_memory(Block& b, uint64_t static_capacity);
// Lands the copies of `f` in groups below `before_group` (in issue order).
void land_copies(Fiber& f, uint64_t before_group);
// Lands the LDS-direct loads of `f` numbered below `before` (in issue order).
void land_lds_loads(Fiber& f, uint64_t before);
// The participants `tids` of a completed barrier see each other's accesses before it, and
// those of `arrivals` (the clocks of threads that only arrived, see `arrive_clock`).
void sync_clocks(Block& b, const uint32_t* tids, size_t n,
                 const std::vector<uint32_t>* arrivals = nullptr);
// A `bar.arrive` by `tid`: its accesses so far join `into`; its later ones are not ordered
// before anything the barrier's waiters do.
void arrive_clock(Block& b, uint32_t tid, std::vector<uint32_t>& into);
void reset_clocks(Block& b);
bool check_shared(Fiber& f, const Region* r, const char* addr, uint32_t bytes, int kind,
                  uint32_t line);
// Counts the wavefronts of one warp-wide access (all entries belong to the same instruction
// instance) of a warp of `warp_size` lanes under its source line.
void count_banks(BankAccess* accesses, size_t n, uint32_t warp_size);
// Pairs up the logged shared accesses of warp `warp` since its last convergence point (the
// k-th access of each lane at a line is one instruction) and counts their bank conflicts.
void flush_bank_log(Block& b, uint32_t warp);
// Logs one shared access of `f` for flush_bank_log.
void log_bank_access(Fiber& f, const char* addr, uint32_t bytes, uint32_t line);

// Where each of `tids` is stuck (or that it exited), grouped by place (scheduler.cc).
std::string whereabouts(const Block& b, const std::vector<uint32_t>& tids);

// ---- Hopper (wgmma.cc; mbarriers and TMA in mbarrier.cc) ----
void reset_hopper(Block& b);
// At the block's end: TMA loads that never landed, wgmma and TMA stores never waited for.
void finish_hopper(Block& b);
void finish_hopper_thread(Fiber& f);
// Where a thread blocked in a Hopper operation waits, for deadlock reports.
std::string describe_hopper_wait(const Block& b, const Fiber& f);
// The open warpgroup rendezvous, for deadlock reports ("" if none).
std::string describe_warpgroups(const Block& b, std::string* key);

// ---- reports (report.cc) ----
enum Severity : int { kWarning = 0, kError = 1 };
// Records a finding. Findings with the same key are counted, and only the first is kept in
// full. Thread-safe.
void report(Severity sev, const std::string& key, const std::string& message);
std::string thread_name(const Block& b, uint32_t tid);
std::string describe_threads(const Block& b, const std::vector<uint32_t>& tids);
std::string where(const Block& b, uint32_t line);
// The source line of the device code at `pc` (a return address in a kernel library compiled
// with line tables), found by addr2line on the library's file; 0 when unknown.
uint32_t source_line_of(const void* pc);
void record_banks(uint32_t line, uint64_t wavefronts, uint64_t ideal);
void flush_counters();
// Sends this CPU thread's findings and counters to `spec`'s own report until the next call
// (null: to no kernel's).
void use_reports_of(const KernelSpec* spec);
// In an isolated launch's worker process: findings go to a new sink (another thread of the
// parent may have held the kernel's sink's lock when it forked).
void use_fresh_reports();
// This CPU thread's findings, bank statistics and counters as text, for the parent process;
// and the parent's side: adds a worker's text to the current kernel's report.
std::string export_reports();
void import_reports(const std::string& text);
// The first error reported on this CPU thread since it was last cleared (by launch).
std::string& first_error();
enum Counter : int { kSharedAccessCount, kCollectiveCount, kBlockCount, kNumCounters };
extern thread_local uint64_t t_counters[kNumCounters];
inline void add_counter(Counter c, uint64_t n) { t_counters[c] += n; }

}  // namespace emu
}  // namespace jaxtile
