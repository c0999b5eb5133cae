// Running a block: its threads as fibers, switched at barriers and warp collectives, and the
// deadlock report when no thread can run but some have not finished.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "block.h"

namespace jaxtile {
namespace emu {
namespace {

Fiber* pop_ready(Block& b) {
  if (b.ready_count == 0) return nullptr;
  const uint32_t id = b.ready[b.ready_head];
  b.ready_head = (b.ready_head + 1) % b.ready.size();
  --b.ready_count;
  return &b.fibers[id];
}

// Leaves `me` (blocked or done) for the next runnable fiber, or for the block's main stack.
void switch_away(Fiber* me) {
  Block& b = *me->block;
  Fiber* next = b.aborted ? nullptr : pop_ready(b);
  if (next == nullptr) {
    t_fiber = nullptr;
    fiber_switch(&me->sp, b.main_sp);
  } else if (next != me) {
    t_fiber = next;
    fiber_switch(&me->sp, next->sp);
  }
  t_fiber = me;
}

const char* collective_name(int kind) {
  switch (kind) {
    case kShflXor: return "shfl_xor";
    case kShflDown: return "shfl_down";
    case kShflUp: return "shfl_up";
    case kShflIdx: return "shfl_idx";
    case kVoteAll: return "vote_all";
    case kVoteAny: return "vote_any";
    case kBallot: return "ballot";
    case kSyncWarp: return "sync_warp";
    case kLdmatrix: return "ldmatrix";
    case kMmaF16: return "mma_m16n8k16_f16";
    case kMmaBf16: return "mma_m16n8k16_bf16";
    case kMmaTf32: return "mma_m16n8k8_tf32";
    case kMfma16x16x16F16: return "mfma_f32_16x16x16_f16";
    case kMfma16x16x16Bf16: return "mfma_f32_16x16x16_bf16";
    case kMfma32x32x8F16: return "mfma_f32_32x32x8_f16";
    case kMfma32x32x4Xf32: return "mfma_f32_32x32x4_xf32";
    case kMfma16x16x8Xf32: return "mfma_f32_16x16x8_xf32";
    default: return "mfma_f32_32x32x8_bf16";
  }
}

// A lane mask as hex: 8 digits for a 32-lane warp, 16 for a 64-lane wave.
std::string hex(uint64_t v, uint32_t warp_size) {
  char buf[24];
  snprintf(buf, sizeof buf, "0x%0*llx", static_cast<int>(warp_size / 4),
           static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// Where each of `tids` is stuck (or that it exited), grouped by place.
std::string whereabouts(const Block& b, const std::vector<uint32_t>& tids) {
  std::vector<std::pair<std::string, std::vector<uint32_t>>> groups;
  for (uint32_t t : tids) {
    const Fiber& f = b.fibers[t];
    std::string place;
    if (f.state == kDone) {
      place = "exited";
    } else if (f.wait_kind == kWaitBarrier) {
      place = "waiting at barrier " + std::to_string(f.wait_id) + " at " + where(b, f.wait_line);
    } else if (f.wait_kind == kWaitCollective) {
      place = std::string("waiting in ") + collective_name(static_cast<int>(f.wait_id)) +
              " at " + where(b, f.wait_line);
    } else if (f.wait_kind >= kWaitMbarrier) {
      place = describe_hopper_wait(b, f);
    } else {
      place = "runnable";
    }
    bool found = false;
    for (auto& g : groups) {
      if (g.first == place) {
        g.second.push_back(t);
        found = true;
      }
    }
    if (!found) groups.push_back({place, {t}});
  }
  std::string out;
  for (auto& g : groups) {
    if (!out.empty()) out += "; ";
    out += describe_threads(b, g.second) + " " + g.first;
  }
  return out;
}

namespace {

void report_deadlock(Block& b) {
  std::string msg = "deadlock in block " + thread_name(b, UINT32_MAX) + ": ";
  std::string key = "deadlock";
  bool any = false;
  for (uint32_t id = 0; id < 16; ++id) {
    const Barrier& bar = b.barriers[id];
    if (bar.arrived.empty()) continue;
    std::vector<bool> in(b.nthreads, false);
    for (uint32_t t : bar.arrived) in[t] = true;
    std::vector<uint32_t> missing;
    for (uint32_t t = 0; t < b.nthreads; ++t) {
      if (!in[t]) missing.push_back(t);
    }
    if (any) msg += " | ";
    any = true;
    msg += "barrier " + std::to_string(id) + " at " + where(b, bar.line) + " was reached by " +
           describe_threads(b, bar.arrived) + " and waits for " +
           std::to_string(bar.expected - bar.arrived.size()) + " more; the others: " +
           whereabouts(b, missing);
    key += ":bar" + std::to_string(id) + "@" + std::to_string(bar.line);
  }
  for (uint32_t w = 0; w < b.nwarps; ++w) {
    for (int s = 0; s < kCollectivesPerWarp; ++s) {
      const Collective& c = b.collectives[w * kCollectivesPerWarp + s];
      if (!c.open) continue;
      std::vector<uint32_t> arrived, missing;
      for (uint32_t l = 0; l < b.warp_size; ++l) {
        if (!(c.mask >> l & 1u)) continue;
        const uint32_t t = w * b.warp_size + l;
        if (c.arrived >> l & 1u) {
          arrived.push_back(t);
        } else if (t < b.nthreads) {
          missing.push_back(t);
        }
      }
      if (any) msg += " | ";
      any = true;
      msg += std::string(collective_name(c.kind)) + " (mask " + hex(c.mask, b.warp_size) +
             ") at " + where(b, c.line) + " was reached by " + describe_threads(b, arrived) +
             "; lanes of the mask missing: " + whereabouts(b, missing);
      key += ":coll@" + std::to_string(c.line);
    }
  }
  std::string wg = describe_warpgroups(b, &key);
  if (!wg.empty()) {
    if (any) msg += " | ";
    any = true;
    msg += wg;
  }
  // Threads waiting on mbarriers or for registers (not at a barrier or collective above).
  std::vector<uint32_t> async_waiters;
  std::string async_key;
  for (uint32_t t = 0; t < b.nthreads; ++t) {
    const Fiber& f = b.fibers[t];
    if (f.state == kBlocked && (f.wait_kind == kWaitMbarrier || f.wait_kind == kWaitRegisters)) {
      async_waiters.push_back(t);
      const std::string k = ":" + std::to_string(f.wait_kind) + "@" + std::to_string(f.wait_line);
      if (async_key.find(k) == std::string::npos) async_key += k;
    }
  }
  key += async_key;
  if (!async_waiters.empty()) {
    std::vector<uint32_t> others;
    for (uint32_t t = 0; t < b.nthreads; ++t) {
      const Fiber& f = b.fibers[t];
      if (!(f.state == kBlocked &&
            (f.wait_kind == kWaitMbarrier || f.wait_kind == kWaitRegisters))) {
        others.push_back(t);
      }
    }
    if (any) msg += " | ";
    any = true;
    msg += whereabouts(b, async_waiters);
    if (!others.empty()) msg += "; the others: " + whereabouts(b, others);
  }
  if (!any) msg += "threads blocked with nothing to wait for";
  report(kError, key, msg);
}

}  // namespace

void park(Fiber* me) {
  me->state = kBlocked;
  switch_away(me);
}

void wake(Fiber* f) {
  Block& b = *f->block;
  f->state = kReady;
  f->wait_kind = kNoWait;
  b.ready[(b.ready_head + b.ready_count) % b.ready.size()] = f->tid;
  ++b.ready_count;
}

void abort_block(Fiber* me) {
  Block& b = *me->block;
  b.aborted = true;
  me->state = kDone;
  t_fiber = nullptr;
  fiber_switch(&me->sp, b.main_sp);
  __builtin_unreachable();
}

void fiber_main(Fiber* f) {
  t_fiber = f;
  Block& b = *f->block;
  b.spec->entry(b.buffers);
  if (f->copies_head < f->copies.size()) {
    report(kWarning, "cp.async-unwaited",
           thread_name(b, f->tid) + " exited with cp.async copies it never waited for (" +
               where(b, f->copies[f->copies_head].line) + ")");
    land_copies(*f, UINT64_MAX);
  }
  if (f->lds_loads_head < f->lds_loads.size()) {
    report(kWarning, "lds-direct-unwaited",
           thread_name(b, f->tid) + " exited with LDS-direct loads it never waited for (" +
               where(b, f->lds_loads[f->lds_loads_head].line) + ")");
    land_lds_loads(*f, UINT64_MAX);
  }
  finish_hopper_thread(*f);
  f->state = kDone;
  ++b.done;
  switch_away(f);
  __builtin_unreachable();
}

// Named barriers whose open instance outlives the block: bar.arrive arrivals that no
// bar.sync took (a hand-over nobody waits for). The CTA's exit discards them, but a protocol
// whose arrivals and waits do not match is wrong for any longer run (another round of the
// same barrier would complete early), so it is reported.
static void report_open_barriers(Block& b) {
  for (unsigned id = 0; id < 16; ++id) {
    const Barrier& bar = b.barriers[id];
    if (bar.arrived.empty()) continue;
    report(kWarning, "barrier-left-open@" + std::to_string(bar.line),
           "barrier " + std::to_string(id) + " ended the block open: " +
               std::to_string(bar.arrived.size()) + " of its " + std::to_string(bar.expected) +
               " threads arrived (the first, " + thread_name(b, bar.arrived.front()) + ", at " +
               where(b, bar.line) + ") and no barrier_sync took them");
  }
}

void run_block(Block& b) {
  b.ready.assign(b.nthreads, 0);
  b.ready_head = 0;
  b.ready_count = 0;
  b.done = 0;
  b.aborted = false;
  b.ended_clean = false;
  for (auto& bar : b.barriers) {
    bar.arrived.clear();
    bar.arrive_only.clear();
    bar.arrive_clock.clear();
  }
  for (auto& c : b.collectives) c.open = false;
  reset_hopper(b);
  for (uint32_t t = 0; t < b.nthreads; ++t) {
    Fiber& f = b.fibers[t];
    f.block = &b;
    f.tid = t;
    f.tidx = {t % b.bdim.x, (t / b.bdim.x) % b.bdim.y, t / (b.bdim.x * b.bdim.y)};
    f.state = kReady;
    f.wait_kind = kNoWait;
    f.shared_decls = 0;
    f.open_group = 0;
    f.copies.clear();
    f.copies_head = 0;
    f.lds_loads.clear();
    f.lds_loads_head = 0;
    f.lds_loads_issued = 0;
    f.proxy_fences = 0;
    f.acc_access_line = 0;
    f.wgmma_group = 0;
    f.wgmmas.clear();
    f.wgmma_reads.clear();
    f.bulk_group = 0;
    f.stores.clear();
    if (!fiber_init(f, t, b.nthreads, b.stack_bytes)) {
      report(kError, "no-stacks",
             "cannot reserve " + std::to_string(b.nthreads) + " fiber stacks of " +
                 std::to_string(b.stack_bytes / 1024) +
                 " KiB each (the kernel's frames need that much per CUDA thread): the "
                 "process is out of address space");
      return;
    }
    wake(&f);
  }
  Fiber* first = pop_ready(b);
  t_fiber = first;
  fiber_switch(&b.main_sp, first->sp);
  t_fiber = nullptr;
  if (!b.aborted && b.done < b.nthreads) report_deadlock(b);
  if (!b.aborted && b.done == b.nthreads) {
    finish_hopper(b);
    report_open_barriers(b);
  }
  // Read by the next run's reset (whose launch may have another thread count, so `done`
  // alone cannot tell it).
  b.ended_clean = !b.aborted && b.done == b.nthreads;
  if (g_checks) {
    for (uint32_t w = 0; w < b.nwarps; ++w) flush_bank_log(b, w);
  }
}

// ---- device-facing entry points ----

idx3 cur_thread_idx() { return t_fiber->tidx; }
idx3 cur_block_idx() { return t_fiber->block->bidx; }
idx3 cur_block_dim() { return t_fiber->block->bdim; }
idx3 cur_grid_dim() {
  const DimSpec& g = t_fiber->block->grid;
  return {g.x, g.y, g.z};
}
unsigned cur_lane() { return t_fiber->tid % t_fiber->block->warp_size; }
unsigned cur_warp() { return t_fiber->tid / t_fiber->block->warp_size; }

namespace {

// Completes barrier `id`'s instance: wakes the threads waiting in it (not those that only
// arrived: they went on and may be waiting elsewhere) and opens the next instance.
void release_barrier(Block& b, unsigned id, uint32_t caller) {
  Barrier& bar = b.barriers[id];
  for (uint32_t t : bar.arrived) {
    Fiber& f = b.fibers[t];
    if (t != caller && f.state == kBlocked && f.wait_kind == kWaitBarrier && f.wait_id == id) {
      wake(&f);
    }
  }
  bar.arrived.clear();
  bar.arrive_only.clear();
  bar.arrive_clock.clear();
}

// The threads of an open barrier instance that wait in it (arrived, not only by bar.arrive).
std::vector<uint32_t> waiters_of(const Barrier& bar) {
  std::vector<uint32_t> out;
  for (uint32_t t : bar.arrived) {
    if (std::find(bar.arrive_only.begin(), bar.arrive_only.end(), t) == bar.arrive_only.end()) {
      out.push_back(t);
    }
  }
  return out;
}

}  // namespace

void barrier(unsigned id, unsigned nthreads, bool whole_block, uint32_t line) {
  Fiber* me = t_fiber;
  Block& b = *me->block;
  if ((++b.sync_ops & 0xfff) == 0) poll_watchdog(line);
  if (whole_block) nthreads = b.nthreads;
  if (id >= 16 || nthreads == 0 || nthreads > b.nthreads ||
      (!whole_block && nthreads % 32 != 0 && nthreads != b.nthreads)) {
    report(kError, "bad-barrier@" + std::to_string(line),
           "barrier " + std::to_string(id) + " with " + std::to_string(nthreads) +
               " threads at " + where(b, line) +
               ": the id must be below 16 and the count a multiple of 32 within the block");
    abort_block(me);
  }
  Barrier& bar = b.barriers[id];
  me->wait_kind = kWaitBarrier;
  me->wait_id = id;
  me->wait_line = line;
  if (bar.arrived.empty()) {
    bar.expected = nthreads;
    bar.line = line;
    bar.whole_block = whole_block;
  } else if (bar.expected != nthreads || (whole_block && bar.line != line)) {
    // A different barrier instruction on the same id: it can never complete this one. Block
    // here; the deadlock report names both places.
    park(me);
    return;
  }
  if (std::find(bar.arrive_only.begin(), bar.arrive_only.end(), me->tid) !=
      bar.arrive_only.end()) {
    report(kError, "barrier-twice@" + std::to_string(line),
           thread_name(b, me->tid) + " waits at barrier " + std::to_string(id) + " at " +
               where(b, line) + " after its own barrier_arrive on it (the instance opened at " + where(b, bar.line) +
               ") before the barrier completed");
    abort_block(me);
  }
  bar.arrived.push_back(me->tid);
  if (bar.arrived.size() < bar.expected) {
    park(me);
    return;
  }
  if (g_checks) {
    if (bar.expected == b.nthreads && bar.arrive_only.empty()) {
      for (uint32_t w = 0; w < b.nwarps; ++w) flush_bank_log(b, w);
      reset_clocks(b);
    } else {
      const std::vector<uint32_t> waiters = waiters_of(bar);
      sync_clocks(b, waiters.data(), waiters.size(), &bar.arrive_clock);
    }
  }
  release_barrier(b, id, me->tid);
  me->wait_kind = kNoWait;
}

void barrier_arrive(unsigned id, unsigned nthreads, uint32_t line) {
  Fiber* me = t_fiber;
  Block& b = *me->block;
  if ((++b.sync_ops & 0xfff) == 0) poll_watchdog(line);
  // PTX: bar.arrive needs an explicit, non-zero count that is a multiple of the warp size.
  if (id >= 16 || nthreads == 0 || nthreads > b.nthreads || nthreads % 32 != 0) {
    report(kError, "bad-barrier@" + std::to_string(line),
           "barrier_arrive " + std::to_string(id) + " with " + std::to_string(nthreads) +
               " threads at " + where(b, line) +
               ": the id must be below 16 and the count a non-zero multiple of 32 within the "
               "block");
    abort_block(me);
  }
  Barrier& bar = b.barriers[id];
  if (bar.arrived.empty()) {
    bar.expected = nthreads;
    bar.line = line;
    bar.whole_block = false;
  } else if (bar.expected != nthreads || bar.whole_block) {
    report(kError, "barrier-count@" + std::to_string(line),
           "barrier_arrive " + std::to_string(id) + " with " + std::to_string(nthreads) +
               " threads at " + where(b, line) + " meets an open instance of barrier " +
               std::to_string(id) + " counting " + std::to_string(bar.expected) + " (from " +
               where(b, bar.line) + ")");
    abort_block(me);
  }
  for (uint32_t t : bar.arrived) {
    if (t == me->tid) {
      report(kError, "barrier-twice@" + std::to_string(line),
             thread_name(b, me->tid) + " arrives at barrier " + std::to_string(id) + " at " +
                 where(b, line) + " twice before the barrier completed");
      abort_block(me);
    }
  }
  bar.arrived.push_back(me->tid);
  bar.arrive_only.push_back(me->tid);
  if (g_checks) arrive_clock(b, me->tid, bar.arrive_clock);
  if (bar.arrived.size() == bar.expected) {
    if (g_checks) {
      const std::vector<uint32_t> waiters = waiters_of(bar);
      sync_clocks(b, waiters.data(), waiters.size(), &bar.arrive_clock);
    }
    release_barrier(b, id, me->tid);
  }
}

void collective(int kind, uint64_t mask, const void* in, void* out, int arg, uint32_t line) {
  Fiber* me = t_fiber;
  Block& b = *me->block;
  if ((++b.sync_ops & 0xfff) == 0) poll_watchdog(line);
  const uint32_t lane = me->tid % b.warp_size, warp = me->tid / b.warp_size;
  if (!(mask >> lane & 1u)) {
    report(kError, "mask-omits-lane@" + std::to_string(line),
           std::string(collective_name(kind)) + " at " + where(b, line) + " is executed by " +
               thread_name(b, me->tid) + " (lane " + std::to_string(lane) + ") with mask " +
               hex(mask, b.warp_size) + ", which omits the calling lane");
    abort_block(me);
  }
  Collective* slot = nullptr;
  Collective* free_slot = nullptr;
  for (int s = 0; s < kCollectivesPerWarp; ++s) {
    Collective& c = b.collectives[warp * kCollectivesPerWarp + s];
    if (c.open && (c.mask & mask) != 0) {
      slot = &c;
      break;
    }
    if (!c.open && free_slot == nullptr) free_slot = &c;
  }
  if (slot != nullptr && (slot->mask != mask || slot->kind != kind)) {
    report(kError, "collective-mismatch@" + std::to_string(line),
           "warp " + std::to_string(warp) + " of block " + thread_name(b, UINT32_MAX) +
               ": lane " + std::to_string(lane) + " executes " + collective_name(kind) +
               " (mask " + hex(mask, b.warp_size) + ") at " + where(b, line) +
               " while other lanes wait in " + collective_name(slot->kind) + " (mask " +
               hex(slot->mask, b.warp_size) + ") at " +
               where(b, slot->line));
    abort_block(me);
  }
  if (slot == nullptr) {
    slot = free_slot;
    slot->open = true;
    slot->kind = kind;
    slot->mask = mask;
    slot->line = line;
    slot->arrived = 0;
  }
  slot->in[lane] = in;
  slot->out[lane] = out;
  slot->arg[lane] = arg;
  slot->lines[lane] = line;
  slot->arrived |= 1ull << lane;
  if (slot->arrived != mask) {
    me->wait_kind = kWaitCollective;
    me->wait_id = static_cast<uint32_t>(kind);
    me->wait_line = line;
    park(me);
    return;
  }
  complete_collective(b, warp, *slot);
  slot->open = false;
  for (uint32_t l = 0; l < b.warp_size; ++l) {
    if ((mask >> l & 1u) && l != lane) wake(&b.fibers[warp * b.warp_size + l]);
  }
}

// ---- faults of device code, contained (see runtime.h) ----

uint64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

void poll_watchdog(uint32_t line) {
  Fiber* me = t_fiber;
  if (me == nullptr) return;
  Block& b = *me->block;
  if (b.deadline_ns == 0 || now_ns() < b.deadline_ns) return;
  std::vector<uint32_t> others;
  for (uint32_t t = 0; t < b.nthreads; ++t) {
    if (t != me->tid) others.push_back(t);
  }
  char limit[32];
  snprintf(limit, sizeof limit, "%g", b.timeout_s);
  report(kError, "timeout",
         std::string("the launch ran past its time limit of ") + limit +
             " s ($JAXTILE_EMULATOR_TIMEOUT; an endless loop?): " + thread_name(b, me->tid) +
             " was at " + where(b, line) +
             (others.empty() ? "" : "; the block's other threads: " + whereabouts(b, others)));
  abort_block(me);
}

void device_assert_failed(const char* expr, uint32_t line) {
  Fiber* me = t_fiber;
  if (me == nullptr) std::abort();  // device code runs only in fibers
  Block& b = *me->block;
  report(kError, "assert:" + std::to_string(line),
         std::string("device assertion `") + expr + "` failed at " + where(b, line) + " in " +
             thread_name(b, me->tid));
  abort_block(me);
}

void divide_by_zero(const char* file, uint32_t line) {
  Fiber* me = t_fiber;
  if (me == nullptr) std::abort();
  Block& b = *me->block;
  // The kernel's source is compiled from a temporary copy: name it as the kernel names it,
  // and a header by its own name.
  const char* slash = std::strrchr(file, '/');
  const std::string base = slash != nullptr ? slash + 1 : file;
  const std::string at = base == b.spec->file ? where(b, line)
                                               : base + ":" + std::to_string(line);
  report(kError, "divide-by-zero:" + base + ":" + std::to_string(line),
         "integer division by zero at " + at + " by " + thread_name(b, me->tid) +
             " (a GPU gives an unspecified value there; the emulator stops the block)");
  abort_block(me);
}

void check_stack(void* call_site) {
  Fiber* me = t_fiber;
  if (me == nullptr) return;
  const char* sp = static_cast<const char*>(__builtin_frame_address(0));
  if (static_cast<size_t>(sp - me->stack_low) > kStackReserve) return;
  Block& b = *me->block;
  const uint32_t line = source_line_of(call_site);
  report(kError, "stack-overflow:" + std::to_string(line),
         "stack overflow: " + thread_name(b, me->tid) + " used up its " +
             std::to_string(b.stack_bytes / 1024) + " KiB stack (recursion too deep?) in the " +
             "call at " + (line != 0 ? where(b, line) : std::string(b.spec->file) +
                                                           " (line unknown: no addr2line)"));
  abort_block(me);
}

}  // namespace emu
}  // namespace jaxtile
