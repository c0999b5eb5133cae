// Hopper's asynchronous proxy, part 1: mbarriers (arrival counts, transaction bytes, phases),
// TMA tensor copies that complete on them, TMA stores in bulk groups, and the proxy fence.
//
// An mbarrier's state lives here, keyed by its shared-memory offset, not in its 8 bytes.
// A TMA load reads its box at issue and completes its bytes on the barrier at once; the data
// lands in shared memory when the barrier's phase completes (all arrivals in, transaction
// count back at zero), as the GPU guarantees no earlier. Until then its destination bytes are
// marked in flight: any access to them is a "TMA hazard".
#include <algorithm>
#include <cstring>
#include <string>

#include "block.h"

namespace jaxtile {
namespace emu {
namespace {

Block& cur_block() { return *t_fiber->block; }

uint32_t swizzle(uint32_t addr, uint32_t span) {
  // The 16-byte chunk index (address bits 4-6) XOR the 128-byte row index (bits 7-9), on
  // as many bits as the span has chunks: 128 bytes 3 bits, 64 bytes 2, 32 bytes 1.
  switch (span) {
    case 128: return addr ^ (((addr >> 7) & 7u) << 4);
    case 64: return addr ^ (((addr >> 7) & 3u) << 4);
    case 32: return addr ^ (((addr >> 7) & 1u) << 4);
    default: return addr;
  }
}

std::string bar_name(const Block& b, const Mbarrier& m) {
  const uint64_t off = static_cast<uint64_t>(b.smem + m.offset - m.region->base);
  std::string name = std::string("mbarrier '") + m.region->name + "'";
  if (m.region->size > 8) name += "[" + std::to_string(off / 8) + "]";
  return name + " (initialised at " + where(b, m.init_line) + ")";
}

void join_into(std::vector<uint32_t>& into, const uint32_t* clock, uint32_t n) {
  for (uint32_t k = 0; k < n; ++k) into[k] = std::max(into[k], clock[k]);
}

// A whole-block barrier restarts every clock: the barrier's clocks of an older generation
// order nothing the new one needs (that barrier ordered it already).
void refresh_clocks(Block& b, Mbarrier& m) {
  if (m.clock_gen == b.gen && m.arrivals.size() == b.nthreads) return;
  m.arrivals.assign(b.nthreads, 0u);
  m.completed.assign(b.nthreads, 0u);
  m.clock_gen = b.gen;
}

// The index in Block::mbarriers of the barrier at `bar`; a bad or uninitialised barrier is
// reported and stops the block.
int find_barrier(Block& b, Fiber& me, const Region* r, const void* bar, uint32_t line,
                 const char* op) {
  const char* p = static_cast<const char*>(bar);
  std::string problem;
  if (r->space != kShared) {
    problem = "the barrier is not in shared memory";
  } else if (reinterpret_cast<uintptr_t>(p) % 8 != 0) {
    problem = "the barrier is not 8-byte aligned";
  } else if (p < r->base || p + 8 > r->base + r->size) {
    problem = "the barrier lies outside shared array '" + std::string(r->name) + "'";
  }
  const uint64_t off = problem.empty() ? static_cast<uint64_t>(p - b.smem) : 0;
  if (problem.empty()) {
    for (size_t i = 0; i < b.mbarriers.size(); ++i) {
      if (b.mbarriers[i].offset == off) return static_cast<int>(i);
    }
    problem = "the mbarrier at byte offset " + std::to_string(p - r->base) + " of '" +
              r->name + "' was never initialised (mbarrier_init)";
  }
  report(kError, std::string("mbarrier-bad:") + op + ":" + std::to_string(line),
         std::string(op) + " at " + where(b, line) + " by " + thread_name(b, me.tid) + ": " +
             problem);
  abort_block(&me);
}

// A thread using a barrier must be ordered after its initialisation (a sync_threads after
// mbarrier_init, in practice).
void check_initialised(Block& b, Fiber& me, const Mbarrier& m, uint32_t line, const char* op) {
  if (!g_checks || m.init_gen != b.gen || me.tid == m.init_tid) return;
  if (b.clock_of(me.tid)[m.init_tid] >= m.init_clock) return;
  report(kError, std::string("mbarrier-init-race:") + std::to_string(line),
         std::string(op) + " at " + where(b, line) + " by " + thread_name(b, me.tid) + " uses " +
             bar_name(b, m) + " with no barrier after its initialisation by " +
             thread_name(b, m.init_tid));
}

void complete_phase(Block& b, Mbarrier& m) {
  if (g_checks) {
    refresh_clocks(b, m);
    // The loads land now: whoever sees the phase complete is ordered after their writes,
    // which are checked with their issuers' clocks.
    for (const PendingTma& t : m.loads) join_into(m.arrivals, b.clock_of(t.tid), b.nthreads);
  }
  for (const PendingTma& t : m.loads) {
    char* dst = b.smem + t.offset;
    const auto bytes = static_cast<uint32_t>(t.data.size());
    if (g_checks) {
      for (uint32_t i = 0; i < bytes; ++i) b.shadow[t.offset + i].pending -= kTmaPending;
      check_shared(b.fibers[t.tid], t.region, dst, bytes, kWrite | kNoBankLog | kAsyncProxy,
                   t.line);
    }
    std::memcpy(dst, t.data.data(), bytes);
  }
  m.loads.clear();
  if (g_checks) {
    m.completed = m.arrivals;
    std::fill(m.arrivals.begin(), m.arrivals.end(), 0u);
  }
  ++m.phase;
  m.pending = m.count;
  m.tx = 0;
  for (uint32_t t : m.waiters) {
    if (b.fibers[t].state == kBlocked) wake(&b.fibers[t]);
  }
  m.waiters.clear();
}

// After an arrival or a completed transaction: completes the phase when nothing is missing.
void maybe_complete(Block& b, Mbarrier& m, uint32_t line) {
  if (m.pending != 0) return;  // a negative count may still be raised by expect_tx
  if (m.tx == 0) {
    complete_phase(b, m);
  } else if (m.tx < 0) {
    report(kError, "mbarrier-tx-over:" + std::to_string(line),
           bar_name(b, m) + ": at " + where(b, line) + " its phase " + std::to_string(m.phase) +
               " has all its arrivals and " + std::to_string(-m.tx) +
               " transaction bytes more than arrive_expect_tx announced" +
               (m.expect_line != 0 ? " (at " + where(b, m.expect_line) + ")" : std::string()) +
               ": the phase can never complete");
  }
}

// The tensor map at `map`, or false after reporting what is wrong with it.
bool read_map(Block& b, Fiber& me, const Region* map_r, const void* map, int rank,
              uint32_t line, const char* op, TensorMap* out) {
  if (!access(map_r, map, sizeof(TensorMap), kRead, line)) return false;
  std::memcpy(out, map, sizeof(TensorMap));
  const TensorMap& t = *out;
  std::string problem;
  if (t.magic != kTensorMapMagic) {
    problem = "it is not a tensor map (no emulator tensor-map header)";
  } else if (t.rank != static_cast<uint32_t>(rank)) {
    problem = "it has rank " + std::to_string(t.rank) + ", the copy " + std::to_string(rank);
  } else if (t.buffer >= static_cast<uint32_t>(b.spec->num_buffers)) {
    problem = "it maps buffer " + std::to_string(t.buffer) + " of a kernel with " +
              std::to_string(b.spec->num_buffers);
  } else if (reinterpret_cast<uintptr_t>(b.buffers[t.buffer].base) % 16 != 0) {
    problem = "the global address of buffer '" + std::string(b.buffers[t.buffer].name) +
              "' is not 16-byte aligned";
  } else if (t.elem_bytes != 1 && t.elem_bytes != 2 && t.elem_bytes != 4 &&
             t.elem_bytes != 8) {
    problem = "its element size " + std::to_string(t.elem_bytes) + " is not 1, 2, 4 or 8";
  } else if (t.swizzle != 0 && t.swizzle != 32 && t.swizzle != 64 && t.swizzle != 128) {
    problem = "its swizzle " + std::to_string(t.swizzle) + " is not 0, 32, 64 or 128 bytes";
  } else if (t.swizzle != 0 && t.box[0] * t.elem_bytes > t.swizzle) {
    problem = "its box's inner extent (" + std::to_string(t.box[0] * t.elem_bytes) +
              " bytes) exceeds its swizzle span";
  }
  for (uint32_t k = 0; problem.empty() && k < t.rank; ++k) {
    if (t.box[k] == 0 || t.box[k] > 256) {
      problem = "box dimension " + std::to_string(k) + " is " + std::to_string(t.box[k]) +
                ", not in [1, 256]";
    } else if (k > 0 && t.strides[k - 1] % 16 != 0) {
      problem = "the stride of dimension " + std::to_string(k) + " (" +
                std::to_string(t.strides[k - 1]) + " bytes) is not a multiple of 16";
    }
  }
  if (problem.empty() && (t.box[0] * t.elem_bytes) % 16 != 0) {
    problem = "its box's inner extent (" + std::to_string(t.box[0] * t.elem_bytes) +
              " bytes) is not a multiple of 16";
  }
  if (problem.empty()) return true;
  report(kError, std::string("tensor-map:") + op + ":" + std::to_string(line),
         std::string(op) + " at " + where(b, line) + " by " + thread_name(b, me.tid) +
             ": bad tensor map: " + problem);
  return false;
}

uint64_t box_bytes(const TensorMap& t) {
  uint64_t n = t.elem_bytes;
  for (uint32_t k = 0; k < t.rank; ++k) n *= t.box[k];
  return n;
}

// Calls fn(global byte offset, box byte offset, bytes) for each in-bounds run of the box
// along dimension 0 (elements outside the tensor are skipped).
template <class F>
void for_each_run(const TensorMap& t, const int32_t* coords, F fn) {
  uint32_t idx[5] = {0, 0, 0, 0, 0};
  const uint64_t rows = box_bytes(t) / (t.box[0] * t.elem_bytes);
  int64_t lo0 = std::max<int64_t>(0, coords[0]);
  int64_t hi0 = std::min<int64_t>(static_cast<int64_t>(t.dims[0]),
                                  static_cast<int64_t>(coords[0]) + t.box[0]);
  for (uint64_t row = 0; row < rows; ++row) {
    uint64_t rem = row;
    bool inside = hi0 > lo0;
    uint64_t goff = 0;
    for (uint32_t k = 1; k < t.rank; ++k) {
      idx[k] = static_cast<uint32_t>(rem % t.box[k]);
      rem /= t.box[k];
      const int64_t g = static_cast<int64_t>(coords[k]) + idx[k];
      if (g < 0 || g >= static_cast<int64_t>(t.dims[k])) inside = false;
      goff += static_cast<uint64_t>(g) * t.strides[k - 1];
    }
    if (!inside) continue;
    const uint64_t boff = (row * t.box[0] + static_cast<uint64_t>(lo0 - coords[0])) *
                          t.elem_bytes;
    fn(goff + static_cast<uint64_t>(lo0) * t.elem_bytes, boff,
       static_cast<uint64_t>(hi0 - lo0) * t.elem_bytes);
  }
}

// The shared destination or source of a TMA copy: its offset, or false after a report.
bool tma_smem(Block& b, Fiber& me, const Region* r, const void* p, uint64_t bytes,
              uint32_t swizzle_span, uint32_t line, const char* op, uint64_t* offset) {
  const char* c = static_cast<const char*>(p);
  std::string problem;
  if (r->space != kShared) {
    problem = "the shared-memory operand is not in shared memory";
  } else if ((c - b.smem) % 128 != 0) {
    problem = "the shared-memory address is not 128-byte aligned";
  } else if (swizzle_span != 0 && bytes % 128 != 0) {
    problem = "a swizzled box must fill whole 128-byte rows (it has " + std::to_string(bytes) +
              " bytes)";
  }
  if (!problem.empty()) {
    report(kError, std::string("tma-bad:") + op + ":" + std::to_string(line),
           std::string(op) + " at " + where(b, line) + " by " + thread_name(b, me.tid) + ": " +
               problem);
    return false;
  }
  if (c < r->base || bytes > r->size || c > r->base + (r->size - bytes)) {
    access_out_of_bounds(r, p, static_cast<uint32_t>(bytes), kWrite, line);
    return false;
  }
  *offset = static_cast<uint64_t>(c - b.smem);
  return true;
}

}  // namespace

uint32_t smem_address(const Region* r, const void* p, uint32_t line) {
  Fiber* me = t_fiber;
  Block& b = *me->block;
  if (r->space != kShared) {
    report(kError, "smem-address:" + std::to_string(line),
           "smem_u32 at " + where(b, line) + " by " + thread_name(b, me->tid) +
               ": the pointer is not into shared memory");
    return 0;
  }
  return static_cast<uint32_t>(static_cast<const char*>(p) - b.smem);
}

void mbarrier_init(const Region* r, void* bar, uint32_t count, uint32_t line) {
  Fiber& me = *t_fiber;
  Block& b = *me.block;
  if (r->space != kShared || count == 0 || count >= (1u << 20)) {
    report(kError, "mbarrier-init:" + std::to_string(line),
           "mbarrier_init at " + where(b, line) + " by " + thread_name(b, me.tid) + ": " +
               (r->space != kShared ? std::string("the barrier is not in shared memory")
                                    : "the count " + std::to_string(count) +
                                          " is not in [1, 2^20 - 1]"));
    abort_block(&me);
  }
  if (!access(r, bar, 8, kWrite, line)) abort_block(&me);
  const uint64_t off = static_cast<uint64_t>(static_cast<char*>(bar) - b.smem);
  Mbarrier* m = nullptr;
  for (Mbarrier& x : b.mbarriers) {
    if (x.offset == off) m = &x;
  }
  if (m == nullptr) {
    b.mbarriers.emplace_back();
    m = &b.mbarriers.back();
  } else if (!m->waiters.empty() || !m->loads.empty()) {
    report(kError, "mbarrier-reinit:" + std::to_string(line),
           "mbarrier_init at " + where(b, line) + " re-initialises " + bar_name(b, *m) +
               " while threads wait on it or TMA copies are bound to it");
    abort_block(&me);
  }
  *m = Mbarrier{};
  m->offset = off;
  m->region = r;
  m->init_line = line;
  m->init_tid = me.tid;
  m->init_gen = b.gen;
  m->init_clock = g_checks ? b.clock_of(me.tid)[me.tid] : 0;
  m->count = count;
  m->pending = count;
}

void mbarrier_arrive(const Region* r, void* bar, bool expect, uint32_t tx_bytes,
                     uint32_t line) {
  Fiber& me = *t_fiber;
  Block& b = *me.block;
  const char* op = expect ? "mbarrier_arrive_expect_tx" : "mbarrier_arrive";
  Mbarrier& m = b.mbarriers[find_barrier(b, me, r, bar, line, op)];
  check_initialised(b, me, m, line, op);
  if (m.pending == 0) {
    report(kError, "mbarrier-extra-arrival:" + std::to_string(line),
           std::string(op) + " at " + where(b, line) + " by " + thread_name(b, me.tid) +
               ": " + bar_name(b, m) + " has all its " + std::to_string(m.count) +
               " arrivals for this phase already (it waits for transaction bytes)");
    abort_block(&me);
  }
  if (expect) {
    m.tx += tx_bytes;
    m.expect_line = line;
  }
  if (g_checks) {
    // A release: the arrival's earlier accesses are ordered before whoever sees the phase
    // complete; its later ones are not.
    refresh_clocks(b, m);
    join_into(m.arrivals, b.clock_of(me.tid), b.nthreads);
    ++b.clock_of(me.tid)[me.tid];
  }
  --m.pending;
  maybe_complete(b, m, line);
}

bool mbarrier_try_wait(const Region* r, void* bar, uint32_t parity, uint32_t line) {
  Fiber& me = *t_fiber;
  Block& b = *me.block;
  const int index = find_barrier(b, me, r, bar, line, "mbarrier_try_wait_parity");
  check_initialised(b, me, b.mbarriers[static_cast<size_t>(index)], line,
                    "mbarrier_try_wait_parity");
  if ((++b.sync_ops & 0xfff) == 0) poll_watchdog(line);
  // `parity` names the current phase (not complete: wait) or the one before it (complete).
  while ((b.mbarriers[static_cast<size_t>(index)].phase & 1u) == parity) {
    me.wait_kind = kWaitMbarrier;
    me.wait_id = static_cast<uint32_t>(index);
    me.wait_line = line;
    me.wait_parity = parity;
    b.mbarriers[static_cast<size_t>(index)].waiters.push_back(me.tid);
    park(&me);
  }
  Mbarrier& m = b.mbarriers[static_cast<size_t>(index)];
  if (g_checks) {
    refresh_clocks(b, m);
    uint32_t* mine = b.clock_of(me.tid);
    for (uint32_t k = 0; k < b.nthreads; ++k) mine[k] = std::max(mine[k], m.completed[k]);
  }
  return true;
}

void fence_proxy_async() { ++t_fiber->proxy_fences; }

// Within one CTA the emulator's threads see an initialisation once a barrier orders them
// after it (checked at each use); the fence matters for other CTAs of a cluster and the
// async proxy, which the emulator runs in the initialising order anyway.
void fence_mbarrier_init() {}

void tma_load(const Region* dst_r, void* dst, const Region* map_r, const void* map,
              const Region* bar_r, void* bar, const int32_t* coords, int rank, uint32_t line) {
  Fiber& me = *t_fiber;
  Block& b = *me.block;
  TensorMap t;
  if (!read_map(b, me, map_r, map, rank, line, "tma_load", &t)) return;
  const uint64_t bytes = box_bytes(t);
  uint64_t off = 0;
  if (!tma_smem(b, me, dst_r, dst, bytes, t.swizzle, line, "tma_load", &off)) return;
  Mbarrier& m = b.mbarriers[find_barrier(b, me, bar_r, bar, line, "tma_load")];
  check_initialised(b, me, m, line, "tma_load");
  PendingTma load{me.tid, line, dst_r, off, std::vector<char>(bytes, 0)};
  const Region& src = b.buffers[t.buffer];
  bool ok = true;
  for_each_run(t, coords, [&](uint64_t goff, uint64_t boff, uint64_t n) {
    if (!ok) return;
    if (!access(&src, src.base + goff, static_cast<uint32_t>(n), kRead, line)) {
      ok = false;
      return;
    }
    // Each 16-byte chunk moves as a whole under the swizzle: copy chunk by chunk.
    for (uint64_t i = 0; i < n;) {
      const uint64_t chunk_end = std::min(n, (boff + i) / 16 * 16 + 16 - boff);
      const uint32_t pos = swizzle(static_cast<uint32_t>(off + boff + i), t.swizzle) -
                           static_cast<uint32_t>(off);
      std::memcpy(load.data.data() + pos, src.base + goff + i, chunk_end - i);
      i = chunk_end;
    }
  });
  if (!ok) return;
  if (g_checks) {
    for (uint64_t i = 0; i < bytes; ++i) b.shadow[off + i].pending += kTmaPending;
    refresh_clocks(b, m);
    join_into(m.arrivals, b.clock_of(me.tid), b.nthreads);
  }
  m.loads.push_back(std::move(load));
  m.tx -= static_cast<int64_t>(bytes);
  maybe_complete(b, m, line);
}

void tma_store(const Region* map_r, const void* map, const Region* src_r, const void* src,
               const int32_t* coords, int rank, uint32_t line) {
  Fiber& me = *t_fiber;
  Block& b = *me.block;
  TensorMap t;
  if (!read_map(b, me, map_r, map, rank, line, "tma_store", &t)) return;
  const uint64_t bytes = box_bytes(t);
  uint64_t off = 0;
  if (!tma_smem(b, me, src_r, src, bytes, t.swizzle, line, "tma_store", &off)) return;
  // The async proxy reads the tile some time before the bulk wait: checked (races, the proxy
  // fence) as read at the issue.
  if (g_checks) {
    check_shared(me, src_r, b.smem + off, static_cast<uint32_t>(bytes),
                 kRead | kNoBankLog | kAsyncProxy, line);
  }
  // PTX ISA, cp.async.bulk.wait_group: the source of a bulk async-group's copies may be
  // written only once the group completed (its .read form waits for just the source reads).
  // The data is taken at the issue; the tile stays marked read until the wait retires it, and
  // a write to it before then is a race (memory.cc, check_shared).
  if (g_checks) {
    for (uint64_t i = 0; i < bytes; ++i) ++b.shadow[off + i].store_reads;
  }
  PendingStore store{me.bulk_group, line, off, bytes, {}};
  const Region& dst = b.buffers[t.buffer];
  for_each_run(t, coords, [&](uint64_t goff, uint64_t boff, uint64_t n) {
    if (!access(&dst, dst.base + goff, static_cast<uint32_t>(n), kWrite, line)) return;
    std::vector<char> data(n);
    for (uint64_t i = 0; i < n;) {
      const uint64_t chunk_end = std::min(n, (boff + i) / 16 * 16 + 16 - boff);
      const uint32_t pos = swizzle(static_cast<uint32_t>(off + boff + i), t.swizzle);
      std::memcpy(data.data() + i, b.smem + pos, chunk_end - i);
      i = chunk_end;
    }
    if (g_checks) global_write(dst.base + goff, static_cast<uint32_t>(n));
    store.rows.emplace_back(dst.base + goff, std::move(data));
  });
  me.stores.push_back(std::move(store));
}

void bulk_commit() { ++t_fiber->bulk_group; }

// The store's source tile is free to be written again.
static void release_source(Block& b, const PendingStore& s) {
  if (!g_checks) return;
  for (uint64_t i = 0; i < s.smem_bytes; ++i) --b.shadow[s.smem_offset + i].store_reads;
}

void bulk_wait(int pending, uint32_t) {
  Fiber& me = *t_fiber;
  const uint64_t limit = me.bulk_group > static_cast<uint64_t>(pending)
                             ? me.bulk_group - static_cast<uint64_t>(pending) : 0;
  size_t kept = 0;
  for (size_t i = 0; i < me.stores.size(); ++i) {
    PendingStore& s = me.stores[i];
    if (s.group < limit) {
      for (auto& row : s.rows) std::memcpy(row.first, row.second.data(), row.second.size());
      release_source(*me.block, s);
    } else {
      me.stores[kept++] = std::move(s);
    }
  }
  me.stores.resize(kept);
}

std::string describe_mbarrier_wait(const Block& b, const Fiber& f) {
  const Mbarrier& m = b.mbarriers[f.wait_id];
  std::string s = "waiting at " + where(b, f.wait_line) + " for the phase of parity " +
                  std::to_string(f.wait_parity) + " of " + bar_name(b, m) +
                  ", whose current phase " + std::to_string(m.phase) + " (parity " +
                  std::to_string(m.phase & 1u) + ") waits for " + std::to_string(m.pending) +
                  " of " + std::to_string(m.count) + " arrivals";
  if (m.tx > 0) {
    s += " and " + std::to_string(m.tx) + " transaction bytes never completed";
  } else if (m.tx < 0) {
    s += " and has " + std::to_string(-m.tx) + " transaction bytes more than expected";
  }
  return s;
}

void finish_mbarriers(Block& b) {
  for (const Mbarrier& m : b.mbarriers) {
    if (m.loads.empty()) continue;
    const PendingTma& t = m.loads.front();
    report(kError, "tma-never-landed:" + std::to_string(t.line),
           "the TMA copy issued at " + where(b, t.line) + " by " + thread_name(b, t.tid) +
               " into '" + t.region->name + "' never landed: the phase of " + bar_name(b, m) +
               " it completes on still waits for " + std::to_string(m.pending) +
               " arrivals and has " + std::to_string(m.tx) +
               " transaction bytes outstanding (an arrive_expect_tx byte count that does not "
               "match the copies?)");
  }
}

void finish_stores(Fiber& f) {
  if (f.stores.empty()) return;
  Block& b = *f.block;
  report(kWarning, "tma-store-unwaited",
         thread_name(b, f.tid) + " exited with TMA stores it never waited for (" +
             where(b, f.stores.front().line) + "; bulk_wait_group)");
  for (auto& s : f.stores) {
    for (auto& row : s.rows) std::memcpy(row.first, row.second.data(), row.second.size());
    release_source(b, s);
  }
  f.stores.clear();
}

}  // namespace emu
}  // namespace jaxtile
