// Warp collectives, computed once all lanes have arrived: shuffles, votes, ldmatrix and
// mma.sync with the fragment layouts of the PTX ISA (section 9.7.14.5), and AMD's MFMA with
// the CDNA3 ISA's lane layouts (wave64 mode).
#include <cstring>
#include <string>

#include "block.h"

namespace jaxtile {
namespace emu {
namespace {

uint32_t in32(const Collective& c, uint32_t lane) {
  return *static_cast<const uint32_t*>(c.in[lane]);
}

// Shuffles over the warp's lanes (32, or 64 in wave64 mode, where device_emu.h's shuffles
// are device_hip.h's ds_bpermute / DPP ones: the same results for every lane).
void shuffle(Block& b, uint32_t warp, Collective& c) {
  const int last = static_cast<int>(b.warp_size) - 1;
  for (uint32_t l = 0; l < b.warp_size; ++l) {
    if (!(c.mask >> l & 1u)) continue;
    const int arg = c.arg[l];
    const int self = static_cast<int>(l);
    int src = self;
    switch (c.kind) {
      case kShflXor: src = self ^ (arg & last); break;
      case kShflDown: src = self + arg <= last ? self + arg : self; break;
      case kShflUp: src = self - arg >= 0 ? self - arg : self; break;
      default: src = arg & last; break;
    }
    if (!(c.mask >> src & 1u)) {
      report(kError, "shfl-inactive-source@" + std::to_string(c.lines[l]),
             "shuffle at " + where(b, c.lines[l]) + ": " +
                 thread_name(b, warp * b.warp_size + l) + " reads lane " +
                 std::to_string(src) + ", which is not in the mask");
      src = self;
    }
    *static_cast<uint32_t*>(c.out[l]) = in32(c, static_cast<uint32_t>(src));
  }
}

// Votes: a ballot's result is 64 bits (device_emu.h keeps the low 32 for a CUDA warp).
void vote(const Block& b, Collective& c) {
  uint64_t ballot = 0;
  for (uint32_t l = 0; l < b.warp_size; ++l) {
    if ((c.mask >> l & 1u) && in32(c, l) != 0) ballot |= 1ull << l;
  }
  for (uint32_t l = 0; l < b.warp_size; ++l) {
    if (!(c.mask >> l & 1u)) continue;
    if (c.kind == kBallot) {
      *static_cast<uint64_t*>(c.out[l]) = ballot;
    } else {
      const bool v = c.kind == kVoteAll ? ballot == c.mask : ballot != 0;
      *static_cast<uint32_t*>(c.out[l]) = v ? 1u : 0u;
    }
  }
}

// ldmatrix .x1/.x2/.x4: lanes 8j..8j+7 give the rows of matrix j (16 bytes each). Lane L gets
// in register j the elements (L/4, 2(L%4)) and (L/4, 2(L%4)+1) of matrix j, or of its
// transpose with .trans; the first element sits in the low half.
void ldmatrix(Block& b, uint32_t warp, Collective& c) {
  const int count = c.arg[0] & 7;
  const bool trans = (c.arg[0] & 16) != 0;
  uint16_t m[4][8][8];
  BankAccess rows[32];
  size_t nrows = 0;
  for (int j = 0; j < count; ++j) {
    for (int r = 0; r < 8; ++r) {
      const uint32_t lane = static_cast<uint32_t>(8 * j + r);
      const auto* in = static_cast<const LdmatrixIn*>(c.in[lane]);
      Fiber& f = b.fibers[warp * 32 + lane];
      const uint32_t line = c.lines[lane];
      std::memset(m[j][r], 0, sizeof m[j][r]);
      if (in->region->space != kShared && in->region->space != kNull) {
        report(kError, "ldmatrix-space@" + std::to_string(line),
               "ldmatrix at " + where(b, line) + ": " + thread_name(b, f.tid) +
                   " supplies an address in global buffer '" + in->region->name +
                   "'; ldmatrix reads shared memory");
        continue;
      }
      if ((reinterpret_cast<uintptr_t>(in->addr) & 15u) != 0) {
        report(kError, "ldmatrix-align@" + std::to_string(line),
               "ldmatrix at " + where(b, line) + ": " + thread_name(b, f.tid) +
                   " supplies a row address that is not 16-byte aligned");
        continue;
      }
      Fiber* saved = t_fiber;
      t_fiber = &f;  // the read is this lane's
      const bool ok = access(in->region, in->addr, 16, kRead | kNoBankLog, line);
      t_fiber = saved;
      if (!ok) continue;
      std::memcpy(m[j][r], in->addr, 16);
      rows[nrows++] = {line, lane, static_cast<uint64_t>(in->addr - b.smem), 16};
    }
  }
  if (g_checks) count_banks(rows, nrows, b.warp_size);
  for (uint32_t l = 0; l < 32; ++l) {
    auto* out = static_cast<uint32_t*>(c.out[l]);
    const uint32_t row = l / 4, col = 2 * (l % 4);
    for (int j = 0; j < count; ++j) {
      const uint16_t lo = trans ? m[j][col][row] : m[j][row][col];
      const uint16_t hi = trans ? m[j][col + 1][row] : m[j][row][col + 1];
      out[j] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}

float half_at(uint32_t reg, int which, bool bf) {
  const uint16_t bits = static_cast<uint16_t>(which == 0 ? reg & 0xffffu : reg >> 16);
  if (bf) {
    const uint32_t x = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  return f16_bits_to_f32(bits);
}

// tf32 operands: the tensor core ignores the 13 low mantissa bits.
float tf32_of(uint32_t reg) {
  const uint32_t x = reg & 0xffffe000u;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// D = A B + C for one warp. Layouts (g = lane >> 2, t = lane % 4):
//   m16n8k16 f16/bf16: A a0..a7 in 4 regs: row g (+8 for a2,a3,a6,a7), col 2t + (i & 1)
//     (+8 for i >= 4); B b0..b3 in 2 regs: k 2t + (i & 1) (+8 for i >= 2), n g.
//   m16n8k8 tf32: A a0..a3: row g (+8 for a1, a3), col t (+4 for a2, a3); B b0, b1: k t (+4
//     for b1), n g.
//   C/D c0..c3: row g (+8 for c2, c3), col 2t + (i & 1).
void mma(Collective& c) {
  const bool tf32 = c.kind == kMmaTf32;
  const bool bf = c.kind == kMmaBf16;
  const int kdim = tf32 ? 8 : 16;
  float a[16][16], bm[16][8], acc[16][8];
  for (uint32_t l = 0; l < 32; ++l) {
    const auto* in = static_cast<const MmaIn*>(c.in[l]);
    const int g = static_cast<int>(l >> 2), t = static_cast<int>(l % 4);
    if (tf32) {
      for (int i = 0; i < 4; ++i) a[g + 8 * (i & 1)][t + 4 * (i >> 1)] = tf32_of(in->a[i]);
      for (int i = 0; i < 2; ++i) bm[t + 4 * i][g] = tf32_of(in->b[i]);
    } else {
      for (int i = 0; i < 8; ++i) {
        const int row = g + 8 * ((i >> 1) & 1);
        const int col = 2 * t + (i & 1) + 8 * (i >> 2);
        a[row][col] = half_at(in->a[i / 2], i & 1, bf);
      }
      for (int i = 0; i < 4; ++i) bm[2 * t + (i & 1) + 8 * (i >> 1)][g] = half_at(in->b[i / 2], i & 1, bf);
    }
    for (int i = 0; i < 4; ++i) acc[g + 8 * (i >> 1)][2 * t + (i & 1)] = in->c[i];
  }
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 8; ++n) {
      float s = acc[r][n];
      for (int k = 0; k < kdim; ++k) s += a[r][k] * bm[k][n];
      acc[r][n] = s;
    }
  }
  for (uint32_t l = 0; l < 32; ++l) {
    auto* d = static_cast<float*>(c.out[l]);
    const int g = static_cast<int>(l >> 2), t = static_cast<int>(l % 4);
    for (int i = 0; i < 4; ++i) d[i] = acc[g + 8 * (i >> 1)][2 * t + (i & 1)];
  }
}

// MFMA D = A B + C for one 64-lane wave (CBSZ = ABID = BLGP = 0), with the lane layouts of
// AMD's CDNA3 ISA guide ("Matrix Arithmetic Instructions"), as compiler/hip/mfma.py writes
// them: for m x n x k (m = n) each lane holds e = k m / 64 consecutive k-elements,
//   A: lane l, element i = A[l % m][e (l / m) + i];  B: element i = B[e (l / n) + i][l % n];
//   C/D: lane l, register r = D[8 (r / 4) + 4 (l / n) + r % 4][l % n];
// 16-bit element i sits in bits 16 (i % 2) of operand register i / 2; an xf32 element i is
// register i, taken with a 10-bit mantissa as the emulator's tf32 is (xf32_of). Products are
// summed in float32, as the matrix cores' float32 accumulation does.
void mfma(Collective& c) {
  const bool bf = c.kind == kMfma16x16x16Bf16 || c.kind == kMfma32x32x8Bf16;
  const bool xf32 = c.kind == kMfma32x32x4Xf32 || c.kind == kMfma16x16x8Xf32;
  const bool big = c.kind == kMfma32x32x8F16 || c.kind == kMfma32x32x8Bf16 ||
                   c.kind == kMfma32x32x4Xf32;
  const int m = big ? 32 : 16, k = (big ? 8 : 16) / (xf32 ? 2 : 1), e = k * m / 64,
            regs = m * m / 64;
  float a[32][16], bm[16][32], acc[32][32];
  for (int l = 0; l < 64; ++l) {
    const auto* in = static_cast<const MmaIn*>(c.in[l]);
    for (int i = 0; i < e; ++i) {
      a[l % m][e * (l / m) + i] = xf32 ? tf32_of(in->a[i]) : half_at(in->a[i / 2], i & 1, bf);
      bm[e * (l / m) + i][l % m] = xf32 ? tf32_of(in->b[i]) : half_at(in->b[i / 2], i & 1, bf);
    }
    for (int r = 0; r < regs; ++r) acc[8 * (r / 4) + 4 * (l / m) + r % 4][l % m] = in->c[r];
  }
  for (int row = 0; row < m; ++row) {
    for (int col = 0; col < m; ++col) {
      float s = acc[row][col];
      for (int kk = 0; kk < k; ++kk) s += a[row][kk] * bm[kk][col];
      acc[row][col] = s;
    }
  }
  for (int l = 0; l < 64; ++l) {
    auto* d = static_cast<float*>(c.out[l]);
    for (int r = 0; r < regs; ++r) d[r] = acc[8 * (r / 4) + 4 * (l / m) + r % 4][l % m];
  }
}

}  // namespace

void complete_collective(Block& b, uint32_t warp, Collective& c) {
  add_counter(kCollectiveCount, 1);
  // The whole warp is here: its lanes' shared accesses since the last such point pair up.
  if (g_checks && c.mask == full_mask(b.warp_size)) flush_bank_log(b, warp);
  switch (c.kind) {
    case kShflXor:
    case kShflDown:
    case kShflUp:
    case kShflIdx: shuffle(b, warp, c); break;
    case kVoteAll:
    case kVoteAny:
    case kBallot: vote(b, c); break;
    case kSyncWarp: {
      if (g_checks) {
        uint32_t tids[kMaxWarpSize];
        size_t n = 0;
        for (uint32_t l = 0; l < b.warp_size; ++l) {
          if (c.mask >> l & 1u) tids[n++] = warp * b.warp_size + l;
        }
        sync_clocks(b, tids, n);
      }
      break;
    }
    case kLdmatrix: ldmatrix(b, warp, c); break;
    case kMfma16x16x16F16:
    case kMfma16x16x16Bf16:
    case kMfma32x32x8F16:
    case kMfma32x32x8Bf16:
    case kMfma32x32x4Xf32:
    case kMfma16x16x8Xf32: mfma(c); break;
    default: mma(c); break;
  }
}

}  // namespace emu
}  // namespace jaxtile
