// Memory of a block and its checks: bounds, shared-memory races (vector clocks within a
// whole-block barrier generation), uninitialised shared reads, cp.async that writes between
// its issue and the wait_group that retires it (where its data lands), atomics, and the
// ordering of reads of other blocks' data after the flags that publish it. Bank conflicts
// are in banks.cc.
#include <algorithm>
#include <cstring>
#include <string>

#include "block.h"

namespace jaxtile {
namespace emu {

// sm_90's opt-in maximum of static plus dynamic shared memory per block.
constexpr uint64_t kMaxSharedPerBlock = 227 * 1024;

const Region kNullRegion{nullptr, 0, "null pointer", kNull};

namespace {

const char* kind_name(int kind) {
  if (kind & kAtomic) return "atomic";
  return (kind & kWrite) ? "write" : "read";
}

std::string region_name(const Region* r) {
  if (r->space == kNull) return "a null pointer";
  return std::string(r->space == kShared ? "shared array '" : "global buffer '") + r->name +
         "' (" + std::to_string(r->size) + " bytes)";
}

void race(Block& b, const Region* r, const char* addr, const char* what, uint32_t tid_a,
          uint32_t line_a, const char* verb_a, uint32_t tid_b, uint32_t line_b,
          const char* verb_b) {
  const uint64_t off = static_cast<uint64_t>(addr - r->base);
  report(kError,
         std::string("race:") + what + ":" + r->name + ":" + std::to_string(line_a) + ":" +
             std::to_string(line_b),
         std::string("data race (") + what + ") on " + region_name(r) + " at byte offset " +
             std::to_string(off) + ": " + thread_name(b, tid_a) + " " + verb_a + " at " +
             where(b, line_a) + ", " + thread_name(b, tid_b) + " " + verb_b + " at " +
             where(b, line_b) + ", with no barrier between them");
}

}  // namespace

bool access_out_of_bounds(const Region* r, const void* addr, uint32_t bytes, int kind,
                          uint32_t line) {
  Fiber* f = t_fiber;
  std::string who, loc = "line " + std::to_string(line);
  if (f != nullptr) {
    who = " by " + thread_name(*f->block, f->tid);
    loc = where(*f->block, line);
  }
  const auto off = static_cast<int64_t>(static_cast<const char*>(addr) - r->base);
  report(kError, "oob:" + std::string(r->name) + ":" + std::to_string(line),
         std::string("out-of-bounds ") + kind_name(kind) + " of " + std::to_string(bytes) +
             " bytes at " + loc + who + ": " + region_name(r) +
             (r->space == kNull ? "" : " at byte offset " + std::to_string(off)));
  return false;
}

bool access_misaligned(const Region* r, const void* addr, uint32_t bytes, int,
                       uint32_t line) {
  Fiber* f = t_fiber;
  std::string who, loc = "line " + std::to_string(line);
  if (f != nullptr) {
    who = " by " + thread_name(*f->block, f->tid);
    loc = where(*f->block, line);
  }
  const auto off = static_cast<int64_t>(static_cast<const char*>(addr) - r->base);
  report(kError, "misaligned:" + std::string(r->name) + ":" + std::to_string(line),
         "misaligned " + std::to_string(bytes) + "-byte access at " + loc + who + ": " +
             region_name(r) + " at byte offset " + std::to_string(off) +
             ", not a multiple of " + std::to_string(bytes));
  return false;
}

bool access_shared(const Region* r, const void* addr, uint32_t bytes, int kind,
                   uint32_t line) {
  return check_shared(*t_fiber, r, static_cast<const char*>(addr), bytes, kind, line);
}

bool check_shared(Fiber& f, const Region* r, const char* addr, uint32_t bytes, int kind,
                  uint32_t line) {
  Block& b = *f.block;
  add_counter(kSharedAccessCount, 1);
  const uint64_t first = static_cast<uint64_t>(addr - b.smem);
  if (!(kind & kNoBankLog)) log_bank_access(f, addr, bytes, line);
  const uint32_t me = f.tid;
  const uint32_t* my_clock = b.clock_of(me);
  const uint32_t now = my_clock[me];
  for (uint32_t i = 0; i < bytes; ++i) {
    Cell& c = b.shadow[first + i];
    if (c.gen != b.gen) {
      c.gen = b.gen;
      c.wtid = kNoThread;
      c.nreads = 0;
    }
    if (c.pending >= kTmaPending && !(kind & kAsyncProxy)) {
      report(kError, "tma-hazard:" + std::to_string(line),
             std::string("TMA hazard: ") + thread_name(b, me) + " " + kind_name(kind) +
                 "s " + region_name(r) + " at byte offset " +
                 std::to_string(addr + i - r->base) + " at " + where(b, line) +
                 " while a TMA copy to it is in flight (its mbarrier's phase has not "
                 "completed)");
    } else if (c.pending >= kTmaPending) {
      report(kError, "tma-hazard:" + std::to_string(line),
             std::string("TMA hazard: the wgmma or TMA store at ") + where(b, line) +
                 " reads " + region_name(r) + " at byte offset " +
                 std::to_string(addr + i - r->base) +
                 " while a TMA copy to it is in flight (its mbarrier's phase has not "
                 "completed)");
    } else if (c.pending != 0) {
      report(kError, "cp.async-hazard:" + std::to_string(line),
             std::string("cp.async hazard: ") + thread_name(b, me) + " " + kind_name(kind) +
                 "s " + region_name(r) + " at byte offset " +
                 std::to_string(addr + i - r->base) + " at " + where(b, line) +
                 " while a cp.async copy (or LDS-direct load) to it is still in flight (not "
                 "yet retired by a cp_async_wait, or a wait_vmcnt for the LDS-direct load)");
    }
    if ((kind & (kWrite | kAtomic)) && c.store_reads != 0) {
      report(kError, "tma-store-source:" + std::to_string(line),
             std::string("TMA store source overwritten: ") + thread_name(b, me) + " " +
                 kind_name(kind) + "s " + region_name(r) + " at byte offset " +
                 std::to_string(addr + i - r->base) + " at " + where(b, line) +
                 " while a TMA store reading it is in flight (no bulk_wait_group of the "
                 "issuing thread has retired its bulk async-group yet)");
    }
    // The async proxy (TMA, wgmma) sees a generic-proxy write only after the writer's
    // fence.proxy.async (and whatever orders that fence before the async operation).
    if ((kind & kAsyncProxy) && (kind & kRead) && c.written == b.serial &&
        c.gtid != kNoThread && b.fibers[c.gtid].proxy_fences <= c.gfences) {
      report(kError, "proxy-fence:" + std::to_string(c.gline) + ":" + std::to_string(line),
             "missing fence.proxy.async: the async proxy (wgmma or TMA) at " + where(b, line) +
                 " reads " + region_name(r) + " at byte offset " +
                 std::to_string(addr + i - r->base) + ", which " + thread_name(b, c.gtid) +
                 " wrote at " + where(b, c.gline) +
                 " through the generic proxy with no fence_proxy_async after the write");
    }
    if (kind & kAtomic) {
      c.written = b.serial;
      c.gtid = static_cast<uint16_t>(me);
      c.gline = line;
      c.gfences = f.proxy_fences;
      continue;
    }
    const bool w_conflict = c.wtid != kNoThread && c.wtid != me && my_clock[c.wtid] < c.wclk;
    if (kind & kRead) {
      if (c.written != b.serial) {
        report(kWarning, "uninit:" + std::to_string(line),
               "uninitialised read: " + thread_name(b, me) + " reads " + region_name(r) +
                   " at byte offset " + std::to_string(addr + i - r->base) + " at " +
                   where(b, line) + ", which no thread of the block has written");
      }
      if (w_conflict) {
        race(b, r, addr + i, "read after write", me, line, "read", c.wtid, c.wline, "wrote");
      }
      // Keep only the reads this one is not ordered after, then add it.
      int kept = 0;
      for (int k = 0; k < c.nreads; ++k) {
        if (c.rtid[k] != me && my_clock[c.rtid[k]] < c.rclk[k]) {
          c.rtid[kept] = c.rtid[k];
          c.rclk[kept] = c.rclk[k];
          c.rline[kept] = c.rline[k];
          ++kept;
        }
      }
      if (kept == kReadSlots) {  // forget the oldest
        for (int k = 1; k < kReadSlots; ++k) {
          c.rtid[k - 1] = c.rtid[k];
          c.rclk[k - 1] = c.rclk[k];
          c.rline[k - 1] = c.rline[k];
        }
        --kept;
      }
      c.rtid[kept] = static_cast<uint16_t>(me);
      c.rclk[kept] = now;
      c.rline[kept] = line;
      c.nreads = static_cast<uint16_t>(kept + 1);
    } else {
      if (w_conflict) {
        race(b, r, addr + i, "write after write", me, line, "wrote", c.wtid, c.wline, "wrote");
      }
      for (int k = 0; k < c.nreads; ++k) {
        if (c.rtid[k] != me && my_clock[c.rtid[k]] < c.rclk[k]) {
          race(b, r, addr + i, "write after read", me, line, "wrote", c.rtid[k], c.rline[k],
               "read");
          break;
        }
      }
      c.wtid = static_cast<uint16_t>(me);
      c.wclk = now;
      c.wline = line;
      c.nreads = 0;
      c.written = b.serial;
      c.gtid = (kind & kAsyncProxy) ? kNoThread : static_cast<uint16_t>(me);
      c.gline = line;
      c.gfences = f.proxy_fences;
    }
  }
  return true;
}

// ---- vector clocks ----

namespace {

// A barrier orders its participants (`tids`, or the whole block if null) after each other's
// relaxed flag reads, but acquires nothing (that takes a fence or an acquire load at gpu
// scope): the state spreads to all of them.
void spread_relaxed_flag(Block& b, const uint32_t* tids, size_t n) {
  const Fiber* reader = nullptr;
  for (size_t i = 0; i < n && reader == nullptr; ++i) {
    const Fiber& f = b.fibers[tids != nullptr ? tids[i] : i];
    if (f.relaxed_flag != nullptr) reader = &f;
  }
  if (reader == nullptr) return;
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = b.fibers[tids != nullptr ? tids[i] : i];
    f.relaxed_flag = reader->relaxed_flag;
    f.relaxed_flag_line = reader->relaxed_flag_line;
  }
}

}  // namespace

void reset_clocks(Block& b) {
  ++b.gen;
  std::fill(b.vc.begin(), b.vc.end(), 0u);
  for (uint32_t t = 0; t < b.nthreads; ++t) b.clock_of(t)[t] = 1;
  // A whole-block barrier (or the block's start, before any flag read).
  spread_relaxed_flag(b, nullptr, b.nthreads);
}

void arrive_clock(Block& b, uint32_t tid, std::vector<uint32_t>& into) {
  if (into.size() != b.nthreads) into.assign(b.nthreads, 0);
  uint32_t* c = b.clock_of(tid);
  for (uint32_t k = 0; k < b.nthreads; ++k) into[k] = std::max(into[k], c[k]);
  ++c[tid];
}

void sync_clocks(Block& b, const uint32_t* tids, size_t n, const std::vector<uint32_t>* arrivals) {
  spread_relaxed_flag(b, tids, n);
  std::vector<uint32_t> joined(b.nthreads, 0);
  if (arrivals != nullptr && arrivals->size() == b.nthreads) joined = *arrivals;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t* c = b.clock_of(tids[i]);
    for (uint32_t k = 0; k < b.nthreads; ++k) joined[k] = std::max(joined[k], c[k]);
  }
  for (size_t i = 0; i < n; ++i) {
    uint32_t* c = b.clock_of(tids[i]);
    std::copy(joined.begin(), joined.end(), c);
    ++c[tids[i]];
  }
}

// ---- shared memory layout ----

void reset_block_memory(Block& b, uint64_t static_capacity) {
  const uint64_t dyn = b.spec->dynamic_smem;
  b.smem_capacity = static_capacity + dyn;
  if (b.smem_storage.size() < b.smem_capacity + 128) b.smem_storage.resize(b.smem_capacity + 128);
  // 128-byte alignment, like the base of a GPU's shared window, so bank math is the GPU's.
  const auto base = reinterpret_cast<uintptr_t>(b.smem_storage.data());
  b.smem = b.smem_storage.data() + ((128 - base % 128) % 128);
  // Garbage, not zeros: a kernel must not rely on shared memory starting cleared.
  std::memset(b.smem, 0xcd, b.smem_capacity);
  b.smem_static = 0;
  b.decls.clear();
  b.regions.clear();
  b.regions.reserve(64 + static_cast<size_t>(b.spec->num_buffers));
  b.dynamic_region = Region{b.smem + static_capacity, dyn, "dynamic shared memory", kShared};
  b.global_writes.clear();
  b.writes_merged = 0;
  for (Fiber& f : b.fibers) f.relaxed_flag = nullptr;
  if (g_checks) {
    // A block that was abandoned (fatal error, deadlock) may leave copies marked in flight.
    const bool clean = b.serial != 0 && b.ended_clean;
    if (!clean || b.serial == UINT32_MAX || b.gen > UINT32_MAX - (1u << 24)) {
      b.shadow.clear();
      b.serial = 0;
      b.gen = 0;
    }
    if (b.shadow.size() < b.smem_capacity) {
      Cell fresh{};
      fresh.wtid = kNoThread;
      fresh.gtid = kNoThread;
      b.shadow.resize(b.smem_capacity, fresh);
    }
    ++b.serial;
    b.vc.assign(static_cast<size_t>(b.nthreads) * b.nthreads, 0u);
    b.bank_log.resize(b.nthreads);
    for (auto& log : b.bank_log) log.clear();
    reset_clocks(b);
  }
}

void* shared_array(uint64_t bytes, const char* name, const Region** region, uint32_t line) {
  Fiber* f = t_fiber;
  Block& b = *f->block;
  const uint32_t k = f->shared_decls++;
  if (k < b.decls.size()) {
    const SharedDecl& d = b.decls[k];
    if (d.bytes != bytes || d.line != line) {
      report(kError, "shared-decl@" + std::to_string(line),
             thread_name(b, f->tid) + " declares shared array '" + name + "' at " +
                 where(b, line) + " where other threads declared '" + d.name + "' at " +
                 where(b, d.line) + ": shared declarations must run in the same order in "
                 "every thread");
      abort_block(f);
    }
    *region = &b.regions[k];
    return b.smem + d.offset;
  }
  const uint64_t offset = (b.smem_static + 15) / 16 * 16;
  const uint64_t static_capacity = b.smem_capacity - b.spec->dynamic_smem;
  if (offset + bytes > static_capacity || b.regions.size() == b.regions.capacity() ||
      offset + bytes + b.spec->dynamic_smem > kMaxSharedPerBlock) {
    report(kError, "shared-size",
           "shared array '" + std::string(name) + "' at " + where(b, line) + " needs " +
               std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
               ", beyond the static shared memory a block may have (48 KiB, and 227 KiB with "
               "the dynamic shared memory)");
    abort_block(f);
  }
  b.smem_static = offset + bytes;
  b.decls.push_back({offset, bytes, name, line});
  b.regions.push_back(Region{b.smem + offset, bytes, name, kShared});
  *region = &b.regions.back();
  return b.smem + offset;
}

void* shared_view(uint64_t offset, uint64_t bytes, const char* name, const Region** region,
                  uint32_t line) {
  Fiber* f = t_fiber;
  Block& b = *f->block;
  const uint32_t k = f->shared_decls++;
  const uint64_t at = static_cast<uint64_t>(b.dynamic_region.base - b.smem) + offset;
  if (k < b.decls.size()) {
    const SharedDecl& d = b.decls[k];
    if (d.bytes != bytes || d.line != line || d.offset != at) {
      report(kError, "shared-decl@" + std::to_string(line),
             thread_name(b, f->tid) + " declares shared view '" + name + "' at " +
                 where(b, line) + " where other threads declared '" + d.name + "' at " +
                 where(b, d.line) + ": shared declarations must run in the same order in "
                 "every thread");
      abort_block(f);
    }
    *region = &b.regions[k];
    return b.smem + d.offset;
  }
  if (offset > b.dynamic_region.size || bytes > b.dynamic_region.size - offset ||
      b.regions.size() == b.regions.capacity()) {
    report(kError, "shared-size",
           "shared view '" + std::string(name) + "' at " + where(b, line) + " of " +
               std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
               " lies beyond the " + std::to_string(b.dynamic_region.size) +
               " bytes of dynamic shared memory the kernel was launched with");
    abort_block(f);
  }
  b.decls.push_back({at, bytes, name, line});
  b.regions.push_back(Region{b.smem + at, bytes, name, kShared});
  *region = &b.regions.back();
  return b.smem + at;
}

void* dynamic_shared(const Region** region) {
  Block& b = *t_fiber->block;
  *region = &b.dynamic_region;
  return b.dynamic_region.base;
}

// ---- cp.async ----

namespace {

// Lands the copies of `queue` (from `head`, in issue order) whose group is below `before`.
void land_queue(Fiber& f, std::vector<PendingCopy>& queue, size_t& head, uint64_t before) {
  Block& b = *f.block;
  while (head < queue.size() && queue[head].group < before) {
    const PendingCopy& c = queue[head++];
    if (g_checks) {
      const uint64_t first = static_cast<uint64_t>(c.dst - b.smem);
      for (uint32_t i = 0; i < c.bytes; ++i) --b.shadow[first + i].pending;
      // The copy has written by the time it is retired: checked again with this thread's
      // clock at the wait, so a later access must be ordered after the wait; reports name
      // the cp.async or LDS-direct load that issued it.
      check_shared(f, c.region, c.dst, c.bytes, kWrite | kNoBankLog, c.line);
    }
    std::memcpy(c.dst, c.data, c.bytes);
  }
  if (head == queue.size()) {
    queue.clear();
    head = 0;
  }
}

// Checks a copy into shared memory before it is queued: `problem` is reported (and false
// returned) when not empty; the source is read (bounds-checked) and the destination must lie
// in its shared region.
bool check_copy(const char* what, const std::string& problem, const Region* dst_r, void* dst,
                const Region* src_r, const void* src, uint32_t src_bytes, uint32_t bytes,
                uint32_t line) {
  Fiber* f = t_fiber;
  Block& b = *f->block;
  if (!problem.empty()) {
    report(kError, std::string(what) + "-bad@" + std::to_string(line),
           std::string(what) + " at " + where(b, line) + " by " + thread_name(b, f->tid) +
               ": " + problem);
    return false;
  }
  // The source must be a valid address even when nothing is read from it.
  if (!access(src_r, src, std::max(src_bytes, 1u), kRead, line)) return false;
  const uintptr_t doff = reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(dst_r->base);
  if (doff > dst_r->size || static_cast<uint64_t>(bytes) > dst_r->size - doff) {
    access_out_of_bounds(dst_r, dst, bytes, kWrite, line);
    return false;
  }
  return true;
}

// Marks copy `c` in flight: the destination is written at some moment between its issue and
// the wait that retires it. Checked here as a write with the issuing thread's clock: an access
// by another thread not ordered before the issue races with it (a stage refilled while slower
// warps still read it). Accesses after the issue are checked at the wait (and, while the copy
// is in flight, by the hazard check).
void issue_copy(Fiber& f, const PendingCopy& c, uint32_t line) {
  if (!g_checks) return;
  Block& b = *f.block;
  check_shared(f, c.region, c.dst, c.bytes, kWrite | kNoBankLog, line);
  const uint64_t first = static_cast<uint64_t>(c.dst - b.smem);
  for (uint32_t i = 0; i < c.bytes; ++i) ++b.shadow[first + i].pending;
  log_bank_access(f, c.dst, c.bytes, line);
}

}  // namespace

void cp_async(const Region* dst_r, void* dst, const Region* src_r, const void* src, int bytes,
              int src_bytes, uint32_t line) {
  Fiber* f = t_fiber;
  const auto ualign = static_cast<uintptr_t>(bytes - 1);
  std::string problem;
  if (dst_r->space != kShared) {
    problem = "the destination is not shared memory";
  } else if (src_r->space != kGlobal) {
    problem = "the source is not global memory";
  } else if (src_bytes < 0 || src_bytes > bytes) {
    problem = "src_bytes " + std::to_string(src_bytes) + " is outside [0, " +
              std::to_string(bytes) + "]";
  } else if ((reinterpret_cast<uintptr_t>(dst) & ualign) != 0 ||
             (reinterpret_cast<uintptr_t>(src) & ualign) != 0) {
    problem = "an address is not " + std::to_string(bytes) + "-byte aligned";
  }
  if (!check_copy("cp.async", problem, dst_r, dst, src_r, src,
                  static_cast<uint32_t>(std::max(src_bytes, 0)), static_cast<uint32_t>(bytes),
                  line)) {
    return;
  }
  PendingCopy c{static_cast<char*>(dst), dst_r, static_cast<uint32_t>(bytes), line,
                f->open_group, {}};
  std::memcpy(c.data, src, static_cast<size_t>(src_bytes));
  std::memset(c.data + src_bytes, 0, static_cast<size_t>(bytes - src_bytes));
  issue_copy(*f, c, line);
  f->copies.push_back(c);
}

void cp_async_commit() { ++t_fiber->open_group; }

void land_copies(Fiber& f, uint64_t before_group) {
  land_queue(f, f.copies, f.copies_head, before_group);
}

void land_lds_loads(Fiber& f, uint64_t before) {
  land_queue(f, f.lds_loads, f.lds_loads_head, before);
}

void cp_async_wait(int pending, uint32_t) {
  Fiber* f = t_fiber;
  // Groups committed so far: open_group. At most `pending` of the newest may stay in flight;
  // the open (uncommitted) group is not waited for.
  const uint64_t committed = f->open_group;
  const uint64_t limit =
      committed > static_cast<uint64_t>(pending) ? committed - static_cast<uint64_t>(pending) : 0;
  land_copies(*f, limit);
}

// ---- LDS-direct loads (wave64: global_load_lds_dword). The same in-flight model as
// cp.async's, counted as vmcnt counts: wait_vmcnt<N> leaves at most the newest N of the lane's
// LDS-direct loads in flight. The emulator's other vector loads complete at once and are not
// counted, so it may keep a load in flight that the hardware has retired (a report where a
// kernel relies on later loads to push it out of the count), never the other way round. ----

void lds_direct_load(const Region* dst_r, void* dst, const Region* src_r, const void* src,
                     int bytes, uint32_t line, int src_bytes) {
  Fiber* f = t_fiber;
  if (src_bytes < 0) src_bytes = bytes;
  std::string problem;
  if (dst_r->space != kShared) {
    problem = "the LDS slot is not in LDS (shared memory)";
  } else if (src_r->space != kGlobal) {
    problem = "the source is not global memory";
  } else if ((reinterpret_cast<uintptr_t>(dst) & 3u) != 0 ||
             (reinterpret_cast<uintptr_t>(src) & static_cast<uintptr_t>(bytes - 1)) != 0) {
    problem = "the LDS slot is not 4-byte aligned or the source not " +
              std::to_string(bytes) + "-byte aligned";
  }
  if (!check_copy("lds_direct_load", problem, dst_r, dst, src_r, src,
                  static_cast<uint32_t>(src_bytes), static_cast<uint32_t>(bytes), line)) {
    return;
  }
  PendingCopy c{static_cast<char*>(dst), dst_r, static_cast<uint32_t>(bytes), line,
                f->lds_loads_issued++, {}};
  std::memcpy(c.data, src, static_cast<size_t>(src_bytes));
  issue_copy(*f, c, line);
  f->lds_loads.push_back(c);
}

void lds_vm_wait(int pending, uint32_t) {
  Fiber* f = t_fiber;
  const uint64_t n = f->lds_loads_issued, keep = static_cast<uint64_t>(pending);
  land_lds_loads(*f, n > keep ? n - keep : 0);
}


// ---- ordering between blocks ----

namespace {

// Whether this block wrote all of global bytes [lo, hi).
bool block_wrote(Block& b, uintptr_t lo, uintptr_t hi) {
  auto& w = b.global_writes;
  if (b.writes_merged != w.size()) {
    std::sort(w.begin(), w.end());
    size_t n = 0;
    for (const auto& r : w) {
      if (n > 0 && r.first <= w[n - 1].second) {
        w[n - 1].second = std::max(w[n - 1].second, r.second);
      } else {
        w[n++] = r;
      }
    }
    w.resize(n);
    b.writes_merged = n;
  }
  auto it = std::upper_bound(w.begin(), w.end(), std::make_pair(lo, UINTPTR_MAX));
  if (it == w.begin()) return false;
  --it;
  return it->first <= lo && hi <= it->second;
}

}  // namespace

void global_write(const void* addr, uint32_t bytes) {
  Block& b = *t_fiber->block;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  auto& w = b.global_writes;
  // A thread's consecutive writes often extend the last range (not yet merged).
  if (w.size() > b.writes_merged && w.back().second == a) {
    w.back().second = a + bytes;
    return;
  }
  w.emplace_back(a, a + bytes);
}

void global_read(const Region* r, const void* addr, uint32_t bytes, uint32_t line) {
  Fiber* f = t_fiber;
  if (f->relaxed_flag == nullptr) return;
  Block& b = *f->block;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (block_wrote(b, a, a + bytes)) return;
  report(kError,
         "unordered-flag:" + std::to_string(f->relaxed_flag_line) + ":" + std::to_string(line),
         "read not ordered after its flag: " + thread_name(b, f->tid) + " read a flag in " +
             region_name(f->relaxed_flag) + " with a relaxed (volatile) load at " +
             where(b, f->relaxed_flag_line) + ", then reads " + region_name(r) +
             " at byte offset " + std::to_string(a - reinterpret_cast<uintptr_t>(r->base)) +
             " at " + where(b, line) + ", which its block did not write: on a GPU it may see "
             "data older than the flag. Read the flag with an acquire load (jt.load_acquire) "
             "or put a fence (jt.fence) between the two reads");
}

void flag_read(const Region* r, bool acquire, uint32_t line) {
  if (!g_checks || r->space != kGlobal) return;
  Fiber* f = t_fiber;
  f->relaxed_flag = acquire ? nullptr : r;
  f->relaxed_flag_line = line;
}

void fence() { t_fiber->relaxed_flag = nullptr; }

// ---- atomics ----

uint32_t atomic_rmw(const Region* r, void* addr, int op, uint32_t value, uint32_t line) {
  if ((reinterpret_cast<uintptr_t>(addr) & 3u) != 0) {
    access_out_of_bounds(r, addr, 4, kAtomic | kWrite, line);
    return 0;
  }
  if (!access(r, addr, 4, kAtomic | kWrite | kRead, line)) return 0;
  if (g_checks && r->space == kGlobal) global_write(addr, 4);
  auto* p = static_cast<uint32_t*>(addr);
  // Blocks run concurrently on CPU threads, so global atomics must be real ones.
  uint32_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (true) {
    uint32_t next = 0;
    float fo, fv;
    switch (op) {
      case kAddF32:
        std::memcpy(&fo, &old, 4);
        std::memcpy(&fv, &value, 4);
        fo += fv;
        std::memcpy(&next, &fo, 4);
        break;
      case kAddI32:
      case kAddU32: next = old + value; break;
      case kMaxI32:
        next = static_cast<int32_t>(old) > static_cast<int32_t>(value) ? old : value;
        break;
      case kMinI32:
        next = static_cast<int32_t>(old) < static_cast<int32_t>(value) ? old : value;
        break;
      default: next = value; break;
    }
    if (__atomic_compare_exchange_n(p, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      return old;
    }
  }
}

uint64_t atomic_cas(const Region* r, void* addr, int bytes, uint64_t compare, uint64_t value,
                    uint32_t line) {
  const auto n = static_cast<uint32_t>(bytes);
  if ((reinterpret_cast<uintptr_t>(addr) & (n - 1)) != 0) {
    access_out_of_bounds(r, addr, n, kAtomic | kWrite, line);
    return 0;
  }
  if (!access(r, addr, n, kAtomic | kWrite | kRead, line)) return 0;
  if (g_checks && r->space == kGlobal) global_write(addr, n);
  if (n == 8) {
    __atomic_compare_exchange_n(static_cast<uint64_t*>(addr), &compare, value, false,
                                __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
  }
  auto c32 = static_cast<uint32_t>(compare);
  __atomic_compare_exchange_n(static_cast<uint32_t*>(addr), &c32, static_cast<uint32_t>(value),
                              false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return c32;
}

}  // namespace emu
}  // namespace jaxtile
