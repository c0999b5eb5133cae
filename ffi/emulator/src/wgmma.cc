// Hopper's asynchronous proxy, part 2: warpgroup operations. wgmma.mma_async reads A and B
// from shared memory through their matrix descriptors (with the descriptor's swizzle) or A
// from registers, and its result reaches the accumulator registers only at the
// wgmma.wait_group that retires its group; setmaxnreg moves registers between warpgroups
// within the register file.
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): thread t of
// the warpgroup, w = t / 32, g = (t % 32) / 4, q = t % 4. Accumulator register i of an m64nN
// D holds row 16w + g + 8 * ((i >> 1) & 1), column 8 * (i >> 2) + 2q + (i & 1). Register A
// element e (register e / 2, low half first) is row 16w + g + 8 * ((e >> 1) & 1), k column
// 2q + (e & 1) + 8 * (e >> 2). K-major shared operands, element (r, k) of 16-bit type: with
// no swizzle, 8x8 core matrices of 16-byte rows at (r % 8) * 16 + (r / 8) * SBO + (k / 8) * LBO
// + (k % 8) * 2; with a swizzle of S bytes (32, 64, 128), rows of S bytes at (r % 8) * S +
// (r / 8) * SBO + 2k, the address then swizzled as TMA writes it. MN-major operands (the
// instruction's imm-trans bit set; CUTLASS's canonical GMMA Major-MN layouts), element
// (r, k) with r along M or N: with no swizzle, core matrices of 8 k-rows of 16 bytes at
// (r % 8) * 2 + (r / 8) * SBO + (k % 8) * 16 + (k / 8) * LBO; with a swizzle of S bytes,
// k-rows of S bytes holding S / 2 consecutive r: (r % (S/2)) * 2 + (r / (S/2)) * LBO +
// (k % 8) * S + (k / 8) * SBO, then swizzled. (The two offsets trade roles between the
// unswizzled and swizzled MN-major forms.)
// tf32 (m64nNk8, K-major only): the same K-major layouts over 32 bytes of K, 4-byte elements
// (4 per 16-byte core-matrix row), each f32 word read with its low 13 mantissa bits dropped.
// FP8 e4m3 / e5m2 (m64nNk32, K-major only): the same over 1-byte elements (16 per core-matrix
// row). Every product of two 8-bit floats is exact in f32 (at most 4 x 4 significant bits,
// exponents within f32's range); the emulator sums them in f32 in k order, as for the 16-bit
// types. The ISA does not specify the tensor core's accumulation width: H100 measurements
// (Khattak and Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004; the
// DeepSeek-V3 report) find FP8 sums kept to about 13 mantissa bits, so the GPU may differ
// from the emulator by more than f32 rounding over long K.
#include <algorithm>
#include <cstring>
#include <string>

#include "block.h"

namespace jaxtile {
namespace emu {

// The register file of an SM: 64K 32-bit registers, shared by a block's warpgroups.
constexpr uint32_t kRegisterFile = 65536;

std::string describe_mbarrier_wait(const Block& b, const Fiber& f);
void finish_mbarriers(Block& b);
void finish_stores(Fiber& f);

namespace {

const char* op_name(int kind) { return kind == kWgWgmma ? "wgmma" : "setmaxnreg"; }

uint32_t swizzle_of(uint32_t addr, uint32_t span) {
  switch (span) {
    case 128: return addr ^ (((addr >> 7) & 7u) << 4);
    case 64: return addr ^ (((addr >> 7) & 3u) << 4);
    case 32: return addr ^ (((addr >> 7) & 1u) << 4);
    default: return addr;
  }
}

// The bytes of one operand element, and the K of one instruction (32 bytes of K).
uint32_t element_bytes(int type) {
  return type == kWgmmaTf32 ? 4u : (type == kWgmmaE4m3 || type == kWgmmaE5m2) ? 1u : 2u;
}
int k_of(int type) { return static_cast<int>(32u / element_bytes(type)); }

float element(uint32_t bits, int type) {
  if (type == kWgmmaTf32) {
    // The tensor core reads an f32 word as tf32: its low 13 mantissa bits are not used.
    const uint32_t x = bits & 0xffffe000u;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  if (type == kWgmmaE4m3) return fp8_value(static_cast<uint8_t>(bits), kE4m3);
  if (type == kWgmmaE5m2) return fp8_value(static_cast<uint8_t>(bits), kE5m2);
  if (type == kWgmmaBf16) {
    const uint32_t x = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  return f16_bits_to_f32(static_cast<uint16_t>(bits));
}

const Region* region_at(const Block& b, uint64_t offset) {
  const Region* best = &b.dynamic_region;
  for (const Region& r : b.regions) {
    const auto lo = static_cast<uint64_t>(r.base - b.smem);
    if (offset >= lo && offset < lo + r.size && r.size <= best->size) best = &r;
  }
  return best;
}

// Reads the rows x 16 operand a descriptor describes into `out`; false after a report.
bool read_operand(Block& b, Fiber& me, uint64_t desc, bool mn_major, int rows, int type,
                  float* out, uint32_t line, const char* which, std::vector<uint32_t>* offsets) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3fffu) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3fffu) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3fffu) << 4;
  const uint32_t base_offset = static_cast<uint32_t>((desc >> 49) & 7u);
  static const uint32_t kSpan[4] = {0, 128, 64, 32};
  const uint32_t span = kSpan[desc >> 62];
  if (base_offset != 0) {
    report(kError, "wgmma-desc:" + std::to_string(line),
           std::string("wgmma at ") + where(b, line) + ": the descriptor of " + which +
               " has a matrix base offset (" + std::to_string(base_offset) +
               "), which the emulator does not model: start swizzled tiles at a multiple of "
               "the pattern's period");
    return false;
  }
  const uint32_t eb = element_bytes(type);
  const int kk = k_of(type);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < kk; ++k) {
      const uint32_t ur = static_cast<uint32_t>(r), uk = static_cast<uint32_t>(k);
      // K-major core matrices are 8 rows of 16 bytes (8 16-bit or 4 tf32 elements).
      uint32_t off;
      if (!mn_major) {
        off = span == 0 ? (ur % 8) * 16 + (ur / 8) * sbo + (uk * eb / 16) * lbo + uk * eb % 16
                        : (ur % 8) * span + (ur / 8) * sbo + uk * eb;
      } else if (span == 0) {
        off = (ur % 8) * eb + (ur / 8) * sbo + (uk % 8) * 16 + (uk / 8) * lbo;
      } else {
        const uint32_t per_row = span / eb;
        off = (ur % per_row) * eb + (ur / per_row) * lbo + (uk % 8) * span + (uk / 8) * sbo;
      }
      const uint32_t addr = swizzle_of(start + off, span);
      if (static_cast<uint64_t>(addr) + eb > b.smem_capacity) {
        report(kError, "wgmma-oob:" + std::to_string(line),
               std::string("wgmma at ") + where(b, line) + ": the descriptor of " + which +
                   " reaches shared address " + std::to_string(addr) + ", beyond the " +
                   std::to_string(b.smem_capacity) + " bytes of the block's shared memory");
        return false;
      }
      if (g_checks) {
        check_shared(me, region_at(b, addr), b.smem + addr, eb,
                     kRead | kNoBankLog | kAsyncProxy, line);
        // The wait re-checks 2-byte pieces (an even and odd FP8 byte pair: one 16-byte chunk,
        // both read).
        for (uint32_t piece = 0; piece < eb || piece == 0; piece += 2) {
          if ((addr + piece) % 2 == 0) offsets->push_back(addr + piece);
        }
      }
      uint32_t bits = 0;
      std::memcpy(&bits, b.smem + addr, eb);
      out[r * kk + k] = element(bits, type);
    }
  }
  return true;
}

// Runs the wgmma of a warpgroup whose 128 threads have all arrived; `in` per thread.
void run_wgmma(Block& b, Fiber& me, uint32_t wg, const WgmmaIn* const* in, uint32_t line) {
  const WgmmaIn& w0 = *in[0];
  for (uint32_t t = 0; t < 128; ++t) {
    const WgmmaIn& w = *in[t];
    if (w.n != w0.n || w.type != w0.type || w.desc_b != w0.desc_b ||
        w.trans_a != w0.trans_a || w.trans_b != w0.trans_b ||
        (w.a == nullptr) != (w0.a == nullptr) || (w.a == nullptr && w.desc_a != w0.desc_a) ||
        (w.scale_d != 0) != (w0.scale_d != 0)) {
      report(kError, "wgmma-operands:" + std::to_string(line),
             "wgmma at " + where(b, line) + ": " + thread_name(b, wg * 128 + t) +
                 " gives other operands (shape, type, descriptors, transposes or scale-d) than " +
                 thread_name(b, wg * 128) + " of its warpgroup");
      abort_block(&me);
    }
    const Fiber& f = b.fibers[wg * 128 + t];
    if (g_checks && f.acc_access_line != 0) {
      report(kError, "wgmma-fence:" + std::to_string(f.acc_access_line) + ":" +
                         std::to_string(line),
             "missing wgmma_fence: the wgmma at " + where(b, line) + " by " +
                 thread_name(b, f.tid) + " follows an access to an accumulator at " +
                 where(b, f.acc_access_line) + " with no wgmma_fence between");
    }
  }
  const int n = w0.n;
  const int kk = k_of(w0.type);
  std::vector<float> a(static_cast<size_t>(64 * kk)), bm(static_cast<size_t>(n * kk));
  // Checked as read now, with this thread's clock, and again at its wait (see PendingRead).
  PendingRead reads{me.wgmma_group, line, {}};
  if (!read_operand(b, me, w0.desc_b, w0.trans_b, n, w0.type, bm.data(), line, "B",
                    &reads.offsets)) {
    abort_block(&me);
  }
  if (w0.a == nullptr) {
    if (!read_operand(b, me, w0.desc_a, w0.trans_a, 64, w0.type, a.data(), line, "A",
                      &reads.offsets)) {
      abort_block(&me);
    }
  } else {
    for (uint32_t t = 0; t < 128; ++t) {
      const uint32_t w = t / 32, g = (t % 32) / 4, q = t % 4;
      for (uint32_t e = 0; e < 8; ++e) {
        const uint32_t row = 16 * w + g + 8 * ((e >> 1) & 1u);
        const uint32_t k = 2 * q + (e & 1u) + 8 * (e >> 2);
        const auto bits = static_cast<uint16_t>(in[t]->a[e / 2] >> (16 * (e & 1u)));
        a[row * 16 + k] = element(bits, w0.type);
      }
    }
  }
  for (uint32_t t = 0; t < 128; ++t) {
    Fiber& f = b.fibers[wg * 128 + t];
    const WgmmaIn& w = *in[t];
    PendingWgmma* entry = nullptr;
    for (PendingWgmma& p : f.wgmmas) {
      if (p.acc == w.acc) entry = &p;
    }
    // An accumulator chained from a wgmma not yet retired adds to that one's result.
    std::vector<float> c(static_cast<size_t>(n / 2));
    if (entry != nullptr) {
      c = entry->values;
    } else {
      std::memcpy(c.data(), w.acc, c.size() * sizeof(float));
    }
    const uint32_t wq = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int i = 0; i < n / 2; ++i) {
      const uint32_t ui = static_cast<uint32_t>(i);
      const uint32_t row = 16 * wq + g + 8 * ((ui >> 1) & 1u);
      const uint32_t col = 8 * (ui >> 2) + 2 * q + (ui & 1u);
      float acc = w.scale_d != 0 ? c[ui] : 0.0f;
      for (int k = 0; k < kk; ++k) acc += a[row * kk + k] * bm[col * kk + k];
      c[ui] = acc;
    }
    if (entry == nullptr) {
      f.wgmmas.push_back(PendingWgmma{w.acc, w.in_flight, f.wgmma_group, line, {}});
      entry = &f.wgmmas.back();
    }
    entry->values = std::move(c);
    entry->group = f.wgmma_group;
    entry->line = line;
    *w.in_flight = line;
  }
  if (g_checks) me.wgmma_reads.push_back(std::move(reads));
}

struct SetmaxnregIn {
  bool inc;
  uint32_t regs;
};

uint32_t registers_in_use(const Block& b) {
  uint32_t total = 0;
  for (uint32_t r : b.regs) total += r * 128;
  return total;
}

std::string register_state(const Block& b) {
  std::string s;
  for (size_t w = 0; w < b.regs.size(); ++w) {
    if (!s.empty()) s += ", ";
    s += std::to_string(b.regs[w]);
  }
  return "the warpgroups hold " + s + " registers per thread (" +
         std::to_string(registers_in_use(b)) + " of the block's pool of " +
         std::to_string(b.reg_pool) + ")";
}

void grant_pending(Block& b) {
  for (uint32_t wg = 0; wg < b.pending_inc.size(); ++wg) {
    const uint32_t want = b.pending_inc[wg];
    if (want == 0) continue;
    if (registers_in_use(b) - b.regs[wg] * 128 + want * 128 > b.reg_pool) continue;
    b.regs[wg] = want;
    b.pending_inc[wg] = 0;
    for (uint32_t t = wg * 128; t < wg * 128 + 128; ++t) wake(&b.fibers[t]);
  }
}

// Applies a warpgroup's setmaxnreg; true if done now, false if the warpgroup had to wait
// for registers (and has them now: the setmaxnreg.dec that freed them woke it).
bool run_setmaxnreg(Block& b, Fiber& me, uint32_t wg, const SetmaxnregIn* const* in,
                    uint32_t line) {
  const SetmaxnregIn& s = *in[0];
  const char* op = s.inc ? "setmaxnreg_inc" : "setmaxnreg_dec";
  std::string problem;
  for (uint32_t t = 1; t < 128 && problem.empty(); ++t) {
    if (in[t]->inc != s.inc || in[t]->regs != s.regs) {
      problem = thread_name(b, wg * 128 + t) + " asks for another count than " +
                thread_name(b, wg * 128);
    }
  }
  const uint32_t cur = b.regs[wg];
  if (!problem.empty()) {
  } else if (s.regs % 8 != 0 || s.regs < 24 || s.regs > 256) {
    problem = "the count " + std::to_string(s.regs) + " is not a multiple of 8 in [24, 256]";
  } else if (s.inc && s.regs < cur) {
    problem = "it would lower warpgroup " + std::to_string(wg) + "'s " + std::to_string(cur) +
              " registers per thread to " + std::to_string(s.regs);
  } else if (!s.inc && s.regs > cur) {
    problem = "it would raise warpgroup " + std::to_string(wg) + "'s " + std::to_string(cur) +
              " registers per thread to " + std::to_string(s.regs);
  }
  if (!problem.empty()) {
    report(kError, "setmaxnreg:" + std::to_string(line),
           std::string(op) + "<" + std::to_string(s.regs) + "> at " + where(b, line) + ": " +
               problem);
    abort_block(&me);
  }
  if (!s.inc) {
    b.regs[wg] = s.regs;
    grant_pending(b);
    return true;
  }
  if (registers_in_use(b) - cur * 128 + s.regs * 128 <= b.reg_pool) {
    b.regs[wg] = s.regs;
    return true;
  }
  // The GPU blocks the warpgroup until other warpgroups' setmaxnreg.dec free enough
  // registers: so does the emulator, and a request that can never be met is a deadlock.
  b.pending_inc[wg] = s.regs;
  for (uint32_t t = wg * 128; t < wg * 128 + 128; ++t) {
    Fiber& f = b.fibers[t];
    f.wait_kind = kWaitRegisters;
    f.wait_id = s.regs;
    f.wait_line = line;
  }
  park(&me);
  return false;
}

// The rendezvous of the calling thread's warpgroup at a .sync.aligned operation; the last
// thread to arrive runs it.
void warpgroup_op(int kind, const void* in, uint32_t line) {
  Fiber& me = *t_fiber;
  Block& b = *me.block;
  if ((++b.sync_ops & 0xfff) == 0) poll_watchdog(line);
  if (b.nthreads % 128 != 0) {
    report(kError, std::string("warpgroup-size:") + op_name(kind),
           std::string(op_name(kind)) + " at " + where(b, line) +
               " is a warpgroup operation, but the block has " + std::to_string(b.nthreads) +
               " threads, not a multiple of 128");
    abort_block(&me);
  }
  const uint32_t wg = me.tid / 128;
  WarpgroupSync& s = b.warpgroups[wg];
  if (s.kind != kWgNone && (s.kind != kind || s.line != line)) {
    report(kError, "warpgroup-mismatch:" + std::to_string(line),
           "warpgroup " + std::to_string(wg) + ": " + thread_name(b, me.tid) + " executes " +
               op_name(kind) + " at " + where(b, line) + " while other threads of the "
               "warpgroup wait in " + op_name(s.kind) + " at " + where(b, s.line));
    abort_block(&me);
  }
  if (s.kind == kWgNone) {
    s.kind = kind;
    s.line = line;
    s.arrived = 0;
  }
  s.in[me.tid % 128] = in;
  if (++s.arrived < 128) {
    me.wait_kind = kWaitWarpgroup;
    me.wait_id = static_cast<uint32_t>(kind);
    me.wait_line = line;
    park(&me);
    return;
  }
  s.kind = kWgNone;
  s.arrived = 0;
  if (kind == kWgWgmma) {
    run_wgmma(b, me, wg, reinterpret_cast<const WgmmaIn* const*>(s.in), line);
  } else if (!run_setmaxnreg(b, me, wg, reinterpret_cast<const SetmaxnregIn* const*>(s.in),
                             line)) {
    return;
  }
  for (uint32_t t = wg * 128; t < wg * 128 + 128; ++t) {
    if (t != me.tid) wake(&b.fibers[t]);
  }
}

}  // namespace

void wgmma(const WgmmaIn* in, uint32_t line) { warpgroup_op(kWgWgmma, in, line); }

void wgmma_fence() { t_fiber->acc_access_line = 0; }

void wgmma_commit() { ++t_fiber->wgmma_group; }

void wgmma_wait(int pending, uint32_t) {
  Fiber& me = *t_fiber;
  const uint64_t limit = me.wgmma_group > static_cast<uint64_t>(pending)
                             ? me.wgmma_group - static_cast<uint64_t>(pending) : 0;
  size_t kept = 0;
  for (size_t i = 0; i < me.wgmmas.size(); ++i) {
    PendingWgmma& p = me.wgmmas[i];
    if (p.group < limit) {
      std::memcpy(p.acc, p.values.data(), p.values.size() * sizeof(float));
      *p.in_flight = 0;
    } else {
      me.wgmmas[kept++] = std::move(p);
    }
  }
  me.wgmmas.resize(kept);
  // The retired groups' operands were read by now: a write not ordered after this wait (a
  // stage released to the producer before it) races with them.
  kept = 0;
  for (size_t i = 0; i < me.wgmma_reads.size(); ++i) {
    PendingRead& r = me.wgmma_reads[i];
    if (r.group < limit) {
      Block& b = *me.block;
      for (uint32_t off : r.offsets) {
        check_shared(me, region_at(b, off), b.smem + off, 2, kRead | kNoBankLog, r.line);
      }
    } else {
      me.wgmma_reads[kept++] = std::move(r);
    }
  }
  me.wgmma_reads.resize(kept);
}

void wgmma_acc_access(uint32_t in_flight, uint32_t line) {
  Fiber& me = *t_fiber;
  if (!g_checks) return;
  me.acc_access_line = line;
  if (in_flight == 0) return;
  Block& b = *me.block;
  report(kError, "wgmma-acc-early:" + std::to_string(line),
         "wgmma accumulator accessed too early: " + thread_name(b, me.tid) + " accesses at " +
             where(b, line) + " an accumulator the wgmma at " + where(b, in_flight) +
             " has not written yet (no wgmma_wait_group has retired it)");
}

void wgmma_acc_out_of_range(int64_t index, int n, uint32_t line) {
  Fiber& me = *t_fiber;
  Block& b = *me.block;
  report(kError, "wgmma-acc-index:" + std::to_string(line),
         "wgmma accumulator index " + std::to_string(index) + " at " + where(b, line) + " by " +
             thread_name(b, me.tid) + " is outside the " + std::to_string(n / 2) +
             " registers of an m64n" + std::to_string(n) + " accumulator");
  abort_block(&me);
}

void setmaxnreg(bool inc, uint32_t regs, uint32_t line) {
  const SetmaxnregIn in{inc, regs};
  warpgroup_op(kWgSetmaxnreg, &in, line);
}

void reset_hopper(Block& b) {
  b.mbarriers.clear();
  const uint32_t groups = (b.nthreads + 127) / 128;
  b.warpgroups.assign(groups, WarpgroupSync{});
  // Each warpgroup starts with the most registers per thread a launch of this size can have
  // (a multiple of 8, at most 256): the emulator does not know ptxas' count, and this is the
  // most the block can hold.
  const uint32_t per_thread = std::min(256u, kRegisterFile / (groups * 128) / 8 * 8);
  b.regs.assign(groups, per_thread);
  // PTX ISA, setmaxnreg: the registers a warpgroup releases go to a pool of its CTA, from
  // which another's setmaxnreg.inc takes them; the block never holds more than it launched
  // with (64512 for 384 threads, not the 65536 of the register file).
  b.reg_pool = groups * 128 * per_thread;
  b.pending_inc.assign(groups, 0);
}

void finish_hopper_thread(Fiber& f) {
  if (!f.wgmmas.empty()) {
    Block& b = *f.block;
    report(kWarning, "wgmma-unwaited",
           thread_name(b, f.tid) + " exited with wgmma results it never waited for (" +
               where(b, f.wgmmas.front().line) + "; wgmma_wait_group)");
    f.wgmmas.clear();
  }
  f.wgmma_reads.clear();
  finish_stores(f);
}

void finish_hopper(Block& b) { finish_mbarriers(b); }

std::string describe_hopper_wait(const Block& b, const Fiber& f) {
  if (f.wait_kind == kWaitMbarrier) return describe_mbarrier_wait(b, f);
  if (f.wait_kind == kWaitRegisters) {
    return "waiting at " + where(b, f.wait_line) + " in setmaxnreg_inc<" +
           std::to_string(f.wait_id) + "> for registers other warpgroups never free: " +
           register_state(b);
  }
  return std::string("waiting in ") + op_name(static_cast<int>(f.wait_id)) + " at " +
         where(b, f.wait_line);
}

std::string describe_warpgroups(const Block& b, std::string* key) {
  std::string out;
  for (uint32_t wg = 0; wg < b.warpgroups.size(); ++wg) {
    const WarpgroupSync& s = b.warpgroups[wg];
    if (s.kind == kWgNone) continue;
    std::vector<uint32_t> arrived, missing;
    for (uint32_t t = wg * 128; t < wg * 128 + 128 && t < b.nthreads; ++t) {
      const Fiber& f = b.fibers[t];
      const bool here = f.state == kBlocked && f.wait_kind == kWaitWarpgroup &&
                        f.wait_line == s.line;
      (here ? arrived : missing).push_back(t);
    }
    if (!out.empty()) out += " | ";
    out += std::string(op_name(s.kind)) + " at " + where(b, s.line) + " (warpgroup " +
           std::to_string(wg) + ") was reached by " + describe_threads(b, arrived) +
           "; the warpgroup's others: " + whereabouts(b, missing);
    *key += ":wg" + std::to_string(wg) + "@" + std::to_string(s.line);
  }
  return out;
}

}  // namespace emu
}  // namespace jaxtile
