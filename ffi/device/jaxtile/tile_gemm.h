// jaxtile's block-level GEMM on shared tiles: swizzled shared layouts and gemm_ss / gemm_rs.
//
// Written only against device.h (no asm, no intrinsics), so the same text runs on the GPU and
// in the SIMT emulator. The Python planner (compiler/gpu/gemm_plan.py) chooses every template
// argument and mirrors two things exactly:
//   - the shared layouts' offset(row, col) (the copies that fill the tiles use the same), and
//   - the accumulator's element -> (thread, slot) map (cudagen's mma_accumulator layout).
//
// Shapes: C[M, N] += op(A) @ op(B), with A stored [M, K] (or [K, M] when TRANS_A) and B stored
// [K, N] (or [N, K] when TRANS_B) in shared memory, both in one of the layouts below. The block's
// warps form a WARPS_M x WARPS_N grid numbered row-major: warp w owns rows
// [(w / WARPS_N) * M / WARPS_M, ...) and columns [(w % WARPS_N) * N / WARPS_N, ...); warps past
// WARPS_M * WARPS_N repeat the first ones (replicas). Each warp covers its part with 16 x 8 atoms;
// lane L (g = L / 4, t = L % 4) holds in slot ((mi * NI + ni) * 4 + c) the element at row
// 16 mi + g + 8 (c / 2), column 8 ni + 2 t + (c % 2) of its part (C/D in docs/ptx_facts.md), whatever
// the instruction: the FMA fallback uses the same map, so layouts never depend on the dtype.
#pragma once

#include "device.h"

namespace jaxtile {

// ---- shared-memory tile layouts --------------------------------------------------------------

// A row-major ROWS x COLS tile of T whose 16-byte chunks are XOR-permuted:
//   chunk' = chunk ^ ((row / kRowsPerLine * STEP) % kPhase),
// kPhase = gcd(chunks per row, 8), kRowsPerLine = 8 / kPhase. For rows of 8k chunks (multiples
// of 128 bytes) that is chunk ^ (row % 8) with STEP 1; for 64-byte rows chunk ^ ((row / 2) % 4);
// for 32-byte rows (and 96-byte ones) chunk ^ ((row / 4) % 2); odd chunk counts need nothing.
// Then the 8 rows one ldmatrix phase reads at the same logical chunk fall in 8 distinct groups of
// 4 banks (rows kRowsPerLine apart start in the same group and get different keys), and the 8
// chunks a phase of 16-byte cp.async stores writes in row-major order (an 8-aligned window of
// chunks) stay 8 consecutive chunks, since the XOR permutes aligned kPhase-blocks of a row. STEP
// 2 spreads rows 0-3 over keys 0, 2, 4, 6: what scalar 32-bit fragment loads (tf32 operands
// ldmatrix cannot transpose), 4 rows x 8 columns, need. Rows must be whole chunks (PlainTile
// otherwise).
template <class T, int ROWS, int COLS, int STEP = 1>
struct SwizzledTile {
  static constexpr int kVec = 16 / int(sizeof(T));
  static constexpr int kChunks = COLS / kVec;
  static constexpr int kPhase =
      kChunks % 8 == 0 ? 8 : kChunks % 4 == 0 ? 4 : kChunks % 2 == 0 ? 2 : 1;
  static constexpr int kRowsPerLine = 8 / kPhase;
  static constexpr int kElems = ROWS * COLS;
  static_assert(COLS % kVec == 0, "swizzled rows are whole 16-byte chunks");
  static JT_DEVICE int offset(int row, int col) {
    const int chunk = (col / kVec) ^ ((row / kRowsPerLine * STEP) % kPhase);
    return row * COLS + chunk * kVec + col % kVec;
  }
};

// A plain row-major ROWS x COLS tile: for rows that are not whole 16-byte chunks (only the FMA
// fallback meets them; ldmatrix needs 16-byte aligned rows).
template <class T, int ROWS, int COLS>
struct PlainTile {
  static constexpr int kElems = ROWS * COLS;
  static JT_DEVICE int offset(int row, int col) { return row * COLS + col; }
};

// A ROWS x COLS tile of T in the canonical swizzled layout wgmma reads (and TMA writes): the
// columns are cut into blocks of SPAN bytes (SPAN / sizeof(T) columns), stored one after
// another, each ROWS rows of SPAN bytes; every byte address is then swizzled, bits 4-6 (the
// 16-byte chunk) XOR bits 7-9 (the row within a group of 8) masked to SPAN / 16 - 1. That is
// wgmma's SPAN-byte swizzle of the absolute shared address, so the tile starts at a multiple of
// 1024 bytes (the smem plan places it there). A K-major operand (rows M or N, columns K) is
// CUTLASS's Layout_K_SW<SPAN> atoms stacked along M/N, then K; an MN-major one (rows K, columns
// M or N) its Layout_MN_SW<SPAN> atoms stacked along K, then M/N. 16-byte chunks stay whole, so
// vector copies write it as they write a row-major tile.
template <class T, int ROWS, int COLS, int SPAN>
struct WgmmaTile {
  static constexpr int kRowElems = SPAN / int(sizeof(T));
  static constexpr int kBlockBytes = ROWS * SPAN;
  static constexpr int kElems = ROWS * COLS;
  static_assert(SPAN == 32 || SPAN == 64 || SPAN == 128, "wgmma swizzles are 32, 64 or 128 bytes");
  static_assert(COLS % kRowElems == 0 && ROWS % 8 == 0,
                "a wgmma tile is whole swizzle atoms (8 rows of SPAN bytes)");
  static JT_DEVICE int byte(int row, int col) {
    const int at = (col / kRowElems) * kBlockBytes + row * SPAN + (col % kRowElems) * int(sizeof(T));
    return at ^ (((at >> 7) & (SPAN / 16 - 1)) << 4);
  }
  static JT_DEVICE int offset(int row, int col) { return byte(row, col) / int(sizeof(T)); }
  // The descriptor of the operand slice whose first M/N index is mn0 and first K index k0
  // (mn0 a multiple of 64, k0 of 32 bytes' worth of K). K-major: 8-row groups SBO = 8 * SPAN apart, k0 inside a
  // column block moves the start (the swizzle is of the absolute address), LBO unused.
  // MN-major: LBO = kBlockBytes between blocks of SPAN / sizeof(T) M/N indices, SBO = 8 * SPAN
  // between groups of 8 k-rows.
  template <bool MN_MAJOR, class P>
  static JT_DEVICE uint64_t desc(P base, int mn0, int k0) {
    if constexpr (MN_MAJOR) {
      const int at = (mn0 / kRowElems) * kBlockBytes + k0 * SPAN;
      return wgmma_desc(base + at / int(sizeof(T)), kBlockBytes, 8 * SPAN, SPAN);
    } else {
      const int at = (k0 / kRowElems) * kBlockBytes + mn0 * SPAN + (k0 % kRowElems) * int(sizeof(T));
      return wgmma_desc(base + at / int(sizeof(T)), 16, 8 * SPAN, SPAN);
    }
  }
};

// ---- instructions (the planner's GemmInstr values) -------------------------------------------
constexpr int kGemmFma = 0;      // scalar multiply-add: any types with a C++ product
constexpr int kGemmMma16 = 1;    // mma.sync m16n8k16, f16 or bf16 inputs, f32 accumulator
constexpr int kGemmMmaTf32 = 2;  // mma.sync m16n8k8 tf32, f32 inputs, f32 accumulator
constexpr int kGemmMfma32 = 3;   // AMD v_mfma_f32_32x32x8 f16 or bf16 (64-lane waves)
constexpr int kGemmMfma16 = 4;   // AMD v_mfma_f32_16x16x16 f16 or bf16
constexpr int kGemmMfma32Xf32 = 6;  // AMD v_mfma_f32_32x32x4_xf32 (gfx942), f32 inputs
constexpr int kGemmMfma16Xf32 = 7;  // AMD v_mfma_f32_16x16x8_xf32 (gfx942), f32 inputs

namespace gemm_detail {

template <class A, class B>
struct same {
  static constexpr bool value = false;
};
template <class A>
struct same<A, A> {
  static constexpr bool value = true;
};
template <class T>
struct bare {
  using type = T;
};
template <class T>
struct bare<const T> {
  using type = T;
};
template <class T>
using bare_t = typename bare<T>::type;

template <class TC, class T>
JT_DEVICE TC to_acc(T x) {
  return static_cast<TC>(x);
}
template <class TC>
JT_DEVICE TC to_acc(half x) {
  return static_cast<TC>(to_float(x));
}
template <class TC>
JT_DEVICE TC to_acc(bf16 x) {
  return static_cast<TC>(to_float(x));
}
// 8-bit float operands are exact in float32 (the FMA gemm; no tensor-core path for them yet).
template <class TC>
JT_DEVICE TC to_acc(fp8e4m3 x) {
  return static_cast<TC>(to_float(x));
}
template <class TC>
JT_DEVICE TC to_acc(fp8e5m2 x) {
  return static_cast<TC>(to_float(x));
}

JT_DEVICE float bits_float(unsigned u) {
  union {
    unsigned u;
    float f;
  } x;
  x.u = u;
  return x.f;
}
JT_DEVICE unsigned float_bits(float f) {
  union {
    float f;
    unsigned u;
  } x;
  x.f = f;
  return x.u;
}

// The element (r, c) of a logical operand stored as Layout, transposed in storage when TRANS.
template <class Layout, bool TRANS>
JT_DEVICE int at(int r, int c) {
  if constexpr (TRANS) {
    return Layout::offset(c, r);
  } else {
    return Layout::offset(r, c);
  }
}

// Where this thread's warp sits in the WARPS_M x WARPS_N grid.
template <int M, int N, int WARPS_M, int WARPS_N>
struct WarpTile {
  static constexpr int kRows = M / WARPS_M, kCols = N / WARPS_N;
  static constexpr int MI = kRows / 16, NI = kCols / 8;
  static_assert(M % (16 * WARPS_M) == 0 && N % (8 * WARPS_N) == 0,
                "each warp owns a whole number of 16 x 8 accumulator atoms");
  int row0, col0, lane, g, t;
  JT_DEVICE WarpTile() {
    const int w = int(warp_id()) % (WARPS_M * WARPS_N);
    lane = int(lane_id());
    row0 = (w / WARPS_N) * kRows;
    col0 = (w % WARPS_N) * kCols;
    g = lane >> 2;
    t = lane & 3;
  }
};

// The 16 x 8 atom (mi, ni)'s four accumulator slots, as mma.sync wants them.
template <int NI>
JT_DEVICE float (&atom(float* acc, int mi, int ni))[4] {
  return *reinterpret_cast<float(*)[4]>(acc + 4 * (mi * NI + ni));
}

// B fragments of m16n8k16, k in [k0, k0 + 16), for the n-atom at n0 (into f) and, when `pair`,
// the one at n0 + 8 (into f2): ldmatrix .x4 reads (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7,
// n 8-15), (k 8-15, n 8-15); .x2 the first two.
template <class LB, bool TRANS_B, class TB>
JT_DEVICE void load_b16(unsigned (&f)[2], unsigned (&f2)[2], bool pair, ptr<TB> b, int n0, int k0,
                        int lane) {
  const int j = lane >> 3, r = lane & 7;
  if (pair) {
    unsigned q[4];
    if constexpr (TRANS_B) {  // stored [N, K]: rows are n, k contiguous
      ldmatrix_x4(q, b + LB::offset(n0 + (j >> 1) * 8 + r, k0 + (j & 1) * 8));
    } else {  // stored [K, N]: rows are k, so transpose
      ldmatrix_x4_trans(q, b + LB::offset(k0 + (j & 1) * 8 + r, n0 + (j >> 1) * 8));
    }
    f[0] = q[0];
    f[1] = q[1];
    f2[0] = q[2];
    f2[1] = q[3];
  } else {
    const int jj = j & 1;  // lanes 16-31 repeat 0-15's (valid) addresses; .x2 ignores them
    if constexpr (TRANS_B) {
      ldmatrix_x2(f, b + LB::offset(n0 + r, k0 + jj * 8));
    } else {
      ldmatrix_x2_trans(f, b + LB::offset(k0 + jj * 8 + r, n0));
    }
  }
}

// F is float: a parameter so that the mma.sync names are looked up at instantiation only (AMD
// has none and never instantiates this).
template <bool BF16, class F>
JT_DEVICE void mma16(F (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (BF16) {
    mma_m16n8k16_bf16(d, a, b, d);
  } else {
    mma_m16n8k16_f16(d, a, b, d);
  }
}

// One k16 step of the warp's atoms from A fragments `af` and B in shared memory. B is loaded
// two n-atoms at a time, next to the mma that use them.
template <class LB, bool TRANS_B, bool BF16, int MI, int NI, class TB>
JT_DEVICE void mma16_step(float* acc, const unsigned (&af)[MI][4], ptr<TB> b, int col0, int k0,
                          int lane) {
#pragma unroll
  for (int ni = 0; ni < NI; ni += 2) {
    unsigned bf[2][2];
    load_b16<LB, TRANS_B>(bf[0], bf[1], ni + 1 < NI, b, col0 + ni * 8, k0, lane);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2 && ni + h < NI; ++h) {
        mma16<BF16>(atom<NI>(acc, mi, ni + h), af[mi], bf[h]);
      }
    }
  }
}

template <int M, int N, int K, int WARPS_M, int WARPS_N, bool TRANS_A, bool TRANS_B, class LA,
          class LB, class TA, class TB>
JT_DEVICE void gemm_mma16(ptr<TA> a, ptr<TB> b, float* acc) {
  using W = WarpTile<M, N, WARPS_M, WARPS_N>;
  constexpr bool kBf16 = same<bare_t<TA>, bf16>::value;
  static_assert(K % 16 == 0, "mma m16n8k16 needs K % 16 == 0");
  const W w;
  const int j = w.lane >> 3, r = w.lane & 7;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned af[W::MI][4];
#pragma unroll
    for (int mi = 0; mi < W::MI; ++mi) {
      // Matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15): a0..a7.
      const int m = w.row0 + mi * 16 + (j & 1) * 8, k = k0 + (j >> 1) * 8;
      if constexpr (TRANS_A) {  // stored [K, M]: rows are k
        ldmatrix_x4_trans(af[mi], a + LA::offset(k + r, m));
      } else {
        ldmatrix_x4(af[mi], a + LA::offset(m + r, k));
      }
    }
    mma16_step<LB, TRANS_B, kBf16, W::MI, W::NI>(acc, af, b, w.col0, k0, w.lane);
  }
}

// tf32 (m16n8k8): A a0..a3 at (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); B b0, b1 at
// (k t, n g), (k t + 4, n g). ldmatrix reads 32-bit elements as pairs of halves, so a
// non-transposed 8 x 4 f32 block arrives as exactly those words; transposed storage is read
// with scalar loads. Operands are rounded to tf32 (cvt.rna) as numpy's reference does.
template <int M, int N, int K, int WARPS_M, int WARPS_N, bool TRANS_A, bool TRANS_B, class LA,
          class LB, class TA, class TB>
JT_DEVICE void gemm_tf32(ptr<TA> a, ptr<TB> b, float* acc) {
  using W = WarpTile<M, N, WARPS_M, WARPS_N>;
  static_assert(K % 8 == 0, "mma m16n8k8 needs K % 8 == 0");
  const W w;
  const int j = w.lane >> 3, r = w.lane & 7;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 8) {
    unsigned af[W::MI][4];
    unsigned bf[W::NI + 1][2];
#pragma unroll
    for (int mi = 0; mi < W::MI; ++mi) {
      const int m = w.row0 + mi * 16;
      if constexpr (TRANS_A) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float x = a[LA::offset(k0 + w.t + 4 * (i >> 1), m + w.g + 8 * (i & 1))];
          af[mi][i] = to_tf32(x);
        }
      } else {
        ldmatrix_x4(af[mi], ptr_cast<const half>(a + LA::offset(m + (j & 1) * 8 + r,
                                                                 k0 + (j >> 1) * 4)));
#pragma unroll
        for (int i = 0; i < 4; ++i) af[mi][i] = to_tf32(bits_float(af[mi][i]));
      }
    }
#pragma unroll
    for (int ni = 0; ni < W::NI; ni += 2) {
      const int n = w.col0 + ni * 8;
      if constexpr (TRANS_B) {  // stored [N, K]: matrices (n 0-7, k 0-3), (n 0-7, k 4-7), ...
        if (ni + 1 < W::NI) {
          unsigned q[4];
          ldmatrix_x4(q, ptr_cast<const half>(b + LB::offset(n + (j >> 1) * 8 + r,
                                                              k0 + (j & 1) * 4)));
          bf[ni][0] = q[0];
          bf[ni][1] = q[1];
          bf[ni + 1][0] = q[2];
          bf[ni + 1][1] = q[3];
        } else {
          ldmatrix_x2(bf[ni], ptr_cast<const half>(b + LB::offset(n + r, k0 + (j & 1) * 4)));
        }
      } else {
#pragma unroll
        for (int h = 0; h < 2 && ni + h < W::NI; ++h) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float x = b[LB::offset(k0 + w.t + 4 * i, n + h * 8 + w.g)];
            bf[ni + h][i] = to_tf32(x);
          }
        }
      }
    }
    if constexpr (TRANS_B) {
#pragma unroll
      for (int ni = 0; ni < W::NI; ++ni) {
        bf[ni][0] = to_tf32(bits_float(bf[ni][0]));
        bf[ni][1] = to_tf32(bits_float(bf[ni][1]));
      }
    }
#pragma unroll
    for (int mi = 0; mi < W::MI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < W::NI; ++ni) {
        mma_m16n8k8_tf32(atom<W::NI>(acc, mi, ni), af[mi], bf[ni], atom<W::NI>(acc, mi, ni));
      }
    }
  }
}

// Scalar fallback: each thread computes exactly the elements its accumulator slots name.
template <int M, int N, int K, int WARPS_M, int WARPS_N, bool TRANS_A, bool TRANS_B, class LA,
          class LB, class TA, class TB, class TC>
JT_DEVICE void gemm_fma(ptr<TA> a, ptr<TB> b, TC* acc) {
  using W = WarpTile<M, N, WARPS_M, WARPS_N>;
  const W w;
#pragma unroll 2
  for (int k = 0; k < K; ++k) {
    TC av[W::MI][2], bv[W::NI][2];
#pragma unroll
    for (int mi = 0; mi < W::MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bare_t<TA> x = a[at<LA, TRANS_A>(w.row0 + mi * 16 + w.g + 8 * h, k)];
        av[mi][h] = to_acc<TC>(x);
      }
    }
#pragma unroll
    for (int ni = 0; ni < W::NI; ++ni) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bare_t<TB> x = b[at<LB, TRANS_B>(k, w.col0 + ni * 8 + 2 * w.t + h)];
        bv[ni][h] = to_acc<TC>(x);
      }
    }
#pragma unroll
    for (int mi = 0; mi < W::MI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < W::NI; ++ni) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          TC& d = acc[4 * (mi * W::NI + ni) + c];
          d = d + av[mi][c >> 1] * bv[ni][c & 1];
        }
      }
    }
  }
}

#if defined(__HIPCC__) || defined(JAXTILE_WAVE64)
// ---- AMD matrix cores (MFMA, one 64-lane wave per instruction) ------------------------------
// For S x S x KI (16-bit: S = 32, KI = 8 or S = 16, KI = 16; xf32: KI = 4 or 8) every lane
// holds E consecutive k (4 16-bit values, 2 float32) of one row of the instruction's A (lane
// L: row L % S, k E (L / S) + i) and of one column of its B, and S * S / 64 accumulator
// registers (compiler/hip/mfma.py). The wave computes C^T = op(B)^T
// op(A)^T: the instruction's A operand is a column of op(B), its B operand a row of op(A). Its
// D then holds C with lane L on row L % S and register r on column 8 (r / 4) + 4 (L / S) + r % 4
// (the planner's mfma_accumulator): each lane owns runs of 4 consecutive columns, which is the
// instruction's own operand layout, so such an accumulator cast to 16 bits is the register A
// of gemm_rs_mfma (flash attention's P @ V) as it is.
template <int INSTR>
struct Mfma {
  static constexpr bool kXf32 = INSTR == kGemmMfma32Xf32 || INSTR == kGemmMfma16Xf32;
  static constexpr int S = INSTR == kGemmMfma32 || INSTR == kGemmMfma32Xf32 ? 32 : 16;
  static constexpr int kRegs = S * S / 64;  // accumulator registers per lane
  static constexpr int kGroups = 64 / S;    // lane groups along k
  static constexpr int kE = kXf32 ? 2 : 4;  // k per lane of one instruction (two registers)
  static constexpr int kK = kE * kGroups;   // K of one instruction
};

// One instruction on a lane's two operand registers (16-bit pairs, or float32 bits for xf32).
template <int INSTR, bool BF16>
JT_DEVICE void mfma(float* acc, const unsigned (&a)[2], const unsigned (&b)[2]) {
  constexpr int S = Mfma<INSTR>::S;
  if constexpr (Mfma<INSTR>::kXf32) {
    const float fa[2] = {bits_float(a[0]), bits_float(a[1])};
    const float fb[2] = {bits_float(b[0]), bits_float(b[1])};
    if constexpr (S == 32) {
      mfma_f32_32x32x4_xf32(*reinterpret_cast<float(*)[16]>(acc), fa, fb,
                            *reinterpret_cast<float(*)[16]>(acc));
    } else {
      mfma_f32_16x16x8_xf32(*reinterpret_cast<float(*)[4]>(acc), fa, fb,
                            *reinterpret_cast<float(*)[4]>(acc));
    }
  } else if constexpr (S == 32) {
    float(&d)[16] = *reinterpret_cast<float(*)[16]>(acc);
    if constexpr (BF16) {
      mfma_f32_32x32x8_bf16(d, a, b, d);
    } else {
      mfma_f32_32x32x8_f16(d, a, b, d);
    }
  } else {
    float(&d)[4] = *reinterpret_cast<float(*)[4]>(acc);
    if constexpr (BF16) {
      mfma_f32_16x16x16_bf16(d, a, b, d);
    } else {
      mfma_f32_16x16x16_f16(d, a, b, d);
    }
  }
}

// Where this lane's wave sits in the WARPS_M x WARPS_N grid: its part starts at (row0, col0);
// `lane` is L % S (the row or column within an S x S tile), `group` L / S.
template <int S, int M, int N, int WARPS_M, int WARPS_N>
struct WaveTile {
  static constexpr int MI = M / WARPS_M / S, NI = N / WARPS_N / S;
  static_assert(M % (S * WARPS_M) == 0 && N % (S * WARPS_N) == 0,
                "each wave owns a whole number of S x S MFMA tiles");
  int row0, col0, lane, group;
  JT_DEVICE WaveTile() {
    const int w = int(warp_id()) % (WARPS_M * WARPS_N);
    lane = int(lane_id()) % S;
    group = int(lane_id()) / S;
    row0 = (w / WARPS_N) * (M / WARPS_M);
    col0 = (w % WARPS_N) * (N / WARPS_N);
  }
};

// WORDS words of consecutive k (from k0) of row r of a logical [R, K] operand stored as L
// ([R, K], or [K, R] when TRANS): 2 * WORDS 16-bit values packed two to a word, the first in
// the low half, or WORDS float32s' bits. k-contiguous storage is one 8- or 16-byte LDS read
// (k0 is a multiple of the values read, so they lie in one 16-byte chunk of a swizzled
// tile); transposed storage takes one read per value, 16-bit ones in the order `rot` (0 or
// WORDS) says: value j at read (j - rot) mod 2 WORDS.
template <class L, bool TRANS, int WORDS, class T>
JT_DEVICE void read_k(unsigned (&w)[WORDS], ptr<T> x, int r, int k0, int rot = 0) {
  if constexpr (TRANS && sizeof(bare_t<T>) == 4) {
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
      const bare_t<T> v = x[L::offset(k0 + i, r)];
      w[i] = float_bits(v);
    }
  } else if constexpr (TRANS) {
    constexpr int V = 2 * WORDS;
    bare_t<T> v[V];  // v[i] is value (i + rot) mod V
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const bare_t<T> t = x[L::offset(k0 + (i + rot) % V, r)];
      v[i] = t;
    }
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
      w[i] = rot ? pack2(v[(2 * i + WORDS) % V], v[(2 * i + 1 + WORDS) % V])
                 : pack2(v[2 * i], v[2 * i + 1]);
    }
  } else if constexpr (WORDS == 4) {
    const u32x4 v = ptr_cast<const u32x4>(x + L::offset(r, k0))[0];
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  } else {
    static_assert(WORDS == 2, "read_k reads 4 or 8 values");
    const u32x2 v = ptr_cast<const u32x2>(x + L::offset(r, k0))[0];
    w[0] = v.x;
    w[1] = v.y;
  }
}

// Shared A and B. A step covers 2 KI of K with two instructions: lane group g reads k 2 E g ..
// 2 E g + 2 E - 1 (from the step's start) of its row of op(A) and of its column of op(B) at
// once, a 16-byte read, and gives the first E to the first instruction, the last E to the
// second. A and
// B pair the same k, and the two instructions together take every k of the step once, so the
// sum is C's (in another order). 16-byte reads of 8 rows at one k offset, which is what a phase
// of ds_read_b128 serves, fall in 8 distinct 16-byte chunks of banks under the XOR swizzle.
template <int INSTR, int M, int N, int K, int WARPS_M, int WARPS_N, bool TRANS_A, bool TRANS_B,
          class LA, class LB, class TA, class TB>
JT_DEVICE void gemm_mfma(ptr<TA> a, ptr<TB> b, float* acc) {
  using I = Mfma<INSTR>;
  using W = WaveTile<I::S, M, N, WARPS_M, WARPS_N>;
  constexpr bool kBf16 = same<bare_t<TA>, bf16>::value;
  static_assert(K % (2 * I::kK) == 0, "gemm_mfma steps K by two instructions");
  const W w;
  // An operand stored with k across rows is read one value at a time. With 16-bit 16 x 16
  // instructions the two lane groups of a half-wave read rows 8 apart, which the swizzle
  // keys alike (same banks): odd groups read their second 4 values first, so the rows read
  // together are 4 apart mod 8 (tests/compiler/hip/test_hip_lds.py checks every read).
  const int rot = !I::kXf32 && I::S == 16 ? 4 * (w.group & 1) : 0;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 2 * I::kK) {
    const int k = k0 + 2 * I::kE * w.group;
    unsigned af[W::MI][4], bf[W::NI][4];
#pragma unroll
    for (int mi = 0; mi < W::MI; ++mi) {
      read_k<LA, TRANS_A>(af[mi], a, w.row0 + mi * I::S + w.lane, k, rot);
    }
#pragma unroll
    for (int ni = 0; ni < W::NI; ++ni) {  // op(B)'s columns are the rows of B stored [N, K]
      read_k<LB, !TRANS_B>(bf[ni], b, w.col0 + ni * I::S + w.lane, k, rot);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int mi = 0; mi < W::MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni) {
          const unsigned x[2] = {bf[ni][2 * h], bf[ni][2 * h + 1]};
          const unsigned y[2] = {af[mi][2 * h], af[mi][2 * h + 1]};
          mfma<INSTR, kBf16>(acc + I::kRegs * (mi * W::NI + ni), x, y);
        }
      }
    }
  }
}
#endif

}  // namespace gemm_detail

// C (registers, `acc`: the accumulator layout above) += op(A) @ op(B), A and B in shared memory.
// Every thread of the block calls it (it contains warp collectives, no barrier): the caller puts
// the barrier that makes the tiles visible before it, and the one before they are overwritten.
template <int INSTR, int M, int N, int K, int WARPS_M, int WARPS_N, bool TRANS_A, bool TRANS_B,
          class LA, class LB, class TA, class TB, class TC>
JT_DEVICE void gemm_ss(ptr<TA> a, ptr<TB> b, TC* acc) {
  using A = gemm_detail::bare_t<TA>;
  using B = gemm_detail::bare_t<TB>;
  if constexpr (INSTR == kGemmMma16) {
    static_assert(gemm_detail::same<A, B>::value && gemm_detail::same<TC, float>::value &&
                      (gemm_detail::same<A, half>::value || gemm_detail::same<A, bf16>::value),
                  "mma m16n8k16: f16 x f16 or bf16 x bf16 into f32");
    gemm_detail::gemm_mma16<M, N, K, WARPS_M, WARPS_N, TRANS_A, TRANS_B, LA, LB>(a, b, acc);
#if defined(__HIPCC__) || defined(JAXTILE_WAVE64)
  } else if constexpr (INSTR == kGemmMfma32 || INSTR == kGemmMfma16) {
    static_assert(gemm_detail::same<A, B>::value && gemm_detail::same<TC, float>::value &&
                      (gemm_detail::same<A, half>::value || gemm_detail::same<A, bf16>::value),
                  "MFMA: f16 x f16 or bf16 x bf16 into f32");
    gemm_detail::gemm_mfma<INSTR, M, N, K, WARPS_M, WARPS_N, TRANS_A, TRANS_B, LA, LB>(a, b,
                                                                                      acc);
  } else if constexpr (INSTR == kGemmMfma32Xf32 || INSTR == kGemmMfma16Xf32) {
    static_assert(gemm_detail::same<A, float>::value && gemm_detail::same<B, float>::value &&
                      gemm_detail::same<TC, float>::value,
                  "MFMA xf32: f32 x f32 into f32");
    gemm_detail::gemm_mfma<INSTR, M, N, K, WARPS_M, WARPS_N, TRANS_A, TRANS_B, LA, LB>(a, b,
                                                                                      acc);
#endif
  } else if constexpr (INSTR == kGemmMmaTf32) {
    static_assert(gemm_detail::same<A, float>::value && gemm_detail::same<B, float>::value &&
                      gemm_detail::same<TC, float>::value,
                  "mma m16n8k8 tf32: f32 x f32 into f32");
    gemm_detail::gemm_tf32<M, N, K, WARPS_M, WARPS_N, TRANS_A, TRANS_B, LA, LB>(a, b, acc);
  } else {
    static_assert(INSTR == kGemmFma, "unknown gemm instruction");
    gemm_detail::gemm_fma<M, N, K, WARPS_M, WARPS_N, TRANS_A, TRANS_B, LA, LB>(a, b, acc);
  }
}

// C += A @ op(B) with A (f16 or bf16) in registers: A's [M, K] elements sit in the accumulator
// layout of an [M, K] tile over WARPS_M x 1 warps, replicated over the WARPS_N warp columns
// (slot ((mi * K / 8 + kk) * 4 + c)), which is what an f32 accumulator of a previous gemm with
// the same WARPS_M and WARPS_N == 1 gives after an elementwise cast (flash attention's P @ V).
template <int M, int N, int K, int WARPS_M, int WARPS_N, bool TRANS_B, class LB, class TA,
          class TB>
JT_DEVICE void gemm_rs(const TA* a, ptr<TB> b, float* acc) {
  using B = gemm_detail::bare_t<TB>;
  using W = gemm_detail::WarpTile<M, N, WARPS_M, WARPS_N>;
  constexpr bool kBf16 = gemm_detail::same<TA, bf16>::value;
  static_assert(gemm_detail::same<TA, B>::value &&
                    (gemm_detail::same<TA, half>::value || kBf16),
                "gemm_rs: f16 x f16 or bf16 x bf16 into f32 (mma m16n8k16)");
  static_assert(K % 16 == 0, "mma m16n8k16 needs K % 16 == 0");
  constexpr int KK = K / 8;
  const W w;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned af[W::MI][4];
#pragma unroll
    for (int mi = 0; mi < W::MI; ++mi) {
      // a0a1, a2a3 are the k-atom k0 / 8's slots c0c1, c2c3; a4..a7 the next atom's.
      const TA* lo = a + 4 * (mi * KK + k0 / 8);
      af[mi][0] = pack2(lo[0], lo[1]);
      af[mi][1] = pack2(lo[2], lo[3]);
      af[mi][2] = pack2(lo[4], lo[5]);
      af[mi][3] = pack2(lo[6], lo[7]);
    }
    gemm_detail::mma16_step<LB, TRANS_B, kBf16, W::MI, W::NI>(acc, af, b, w.col0, k0, w.lane);
  }
}

// ---- wgmma (sm_90a) --------------------------------------------------------------------------
// Only where the device header has wgmma (sm_90a device code, the host pass, the emulator).
#if defined(JT_HAS_WGMMA)
// C[M, N] += op(A) @ op(B) by the block's WG_M x WG_N warpgroups (numbered row-major, 128
// threads each; further warpgroups repeat the first ones): warpgroup (i, j) owns rows
// [i * M / WG_M, ...) and columns [j * NW, ...), NW = N / WG_N, and covers them with MI =
// M / (64 WG_M) accumulators of wgmma.m64nNWk16 stacked along M (the planner's
// wgmma_accumulator layout: slot mi * NW / 2 + i is accumulator mi's register i). A is stored
// [M, K] (K-major) or [K, M] when TRANS_A (MN-major), B [K, N] (MN-major) or [N, K] when
// TRANS_B (K-major), both as WgmmaTile. The caller brackets the call: wgmma_acc_load,
// fence.proxy.async and a barrier (the copies' generic writes become visible to wgmma's async
// proxy), wgmma_fence, this, wgmma_commit_group, wgmma_wait_group<0>, wgmma_acc_store.
template <int NW, int MI>
JT_DEVICE void wgmma_acc_load(wgmma_acc<NW> (&d)[MI], const float* acc) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) d[mi][i] = acc[mi * (NW / 2) + i];
  }
}
template <int NW, int MI>
JT_DEVICE void wgmma_acc_store(float* acc, wgmma_acc<NW> (&d)[MI]) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) acc[mi * (NW / 2) + i] = d[mi][i];
  }
}

// Issues the asynchronous wgmmas over K (K / 16 steps of MI instructions, K / 8 for tf32, whose
// operands are both K-major); results land at the caller's wgmma_wait_group.
template <int M, int N, int K, int WG_M, int WG_N, bool TRANS_A, bool TRANS_B, class LA,
          class LB, class TA, class TB, int NW, int MI>
JT_DEVICE void gemm_wgmma(wgmma_acc<NW> (&d)[MI], ptr<TA> a, ptr<TB> b) {
  using A = gemm_detail::bare_t<TA>;
  constexpr bool kBf16 = gemm_detail::same<A, bf16>::value;
  constexpr bool kTf32 = gemm_detail::same<A, float>::value;
  constexpr bool kE4m3 = gemm_detail::same<A, fp8e4m3>::value;
  constexpr bool kE5m2 = gemm_detail::same<A, fp8e5m2>::value;
  // One instruction covers 32 bytes of K: k16 for 16-bit types, k8 for tf32, k32 for FP8.
  constexpr int kStep = 32 / int(sizeof(A));
  static_assert(gemm_detail::same<A, gemm_detail::bare_t<TB>>::value &&
                    (kBf16 || kTf32 || kE4m3 || kE5m2 || gemm_detail::same<A, half>::value),
                "wgmma: f16, bf16, f32 (tf32), e4m3 or e5m2, both operands alike, into f32");
  static_assert(!(kTf32 || kE4m3 || kE5m2) || (!TRANS_A && TRANS_B),
                "wgmma tf32 and FP8 take K-major operands only");
  static_assert(NW * WG_N == N && MI * 64 * WG_M == M && K % kStep == 0,
                "each warpgroup owns whole m64nNWk16 (k8 for tf32) steps");
  const int wg = int(warp_id()) / 4 % (WG_M * WG_N);
  const int row0 = (wg / WG_N) * (M / WG_M), col0 = (wg % WG_N) * NW;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += kStep) {
    const uint64_t db = LB::template desc<!TRANS_B>(b, col0, k0);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const uint64_t da = LA::template desc<TRANS_A>(a, row0 + 64 * mi, k0);
      if constexpr (kTf32) {
        wgmma_tf32<NW>(d[mi], da, db, 1);
      } else if constexpr (kE4m3) {
        wgmma_e4m3<NW>(d[mi], da, db, 1);
      } else if constexpr (kE5m2) {
        wgmma_e5m2<NW>(d[mi], da, db, 1);
      } else if constexpr (kBf16) {
        wgmma_bf16<NW, TRANS_A, !TRANS_B>(d[mi], da, db, 1);
      } else {
        wgmma_f16<NW, TRANS_A, !TRANS_B>(d[mi], da, db, 1);
      }
    }
  }
}

// The same with A (f16 or bf16) in registers: A's [M, K] elements in the accumulator layout
// of an [M, K] gemm_wgmma over the same WG_M x 1 warpgroups (slot mi * K / 2 + i), which an f32
// accumulator of that gemm gives after an elementwise cast (attention's P from S). Registers
// 8 kk .. 8 kk + 7 of accumulator mi are exactly the ISA's A fragment of k step kk (row
// 16 w + g + 8 ((e >> 1) & 1), k 16 kk + 2 q + (e & 1) + 8 (e >> 2)), packed two per 32-bit
// register low half first; only B is read from shared memory.
template <int M, int N, int K, int WG_M, bool TRANS_B, class LB, class TA, class TB, int NW,
          int MI>
JT_DEVICE void gemm_wgmma_rs(wgmma_acc<NW> (&d)[MI], const TA* a, ptr<TB> b) {
  constexpr bool kBf16 = gemm_detail::same<TA, bf16>::value;
  static_assert(gemm_detail::same<TA, gemm_detail::bare_t<TB>>::value &&
                    (kBf16 || gemm_detail::same<TA, half>::value),
                "wgmma with register A: f16 x f16 or bf16 x bf16 into f32");
  static_assert(NW == N && MI * 64 * WG_M == M && K % 16 == 0,
                "register A: each warpgroup owns whole rows (m64nNk16 steps over all of N)");
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    const uint64_t db = LB::template desc<!TRANS_B>(b, 0, k0);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const TA* p = a + mi * (K / 2) + k0 / 2;
      const unsigned af[4] = {pack2(p[0], p[1]), pack2(p[2], p[3]), pack2(p[4], p[5]),
                              pack2(p[6], p[7])};
      if constexpr (kBf16) {
        wgmma_bf16_rs<NW, !TRANS_B>(d[mi], af, db, 1);
      } else {
        wgmma_f16_rs<NW, !TRANS_B>(d[mi], af, db, 1);
      }
    }
  }
}

#endif  // JT_HAS_WGMMA

#if defined(__HIPCC__) || defined(JAXTILE_WAVE64)
// C += A @ op(B) on the matrix cores with A (f16 or bf16) in registers: A's [M, K] elements in
// the accumulator layout of an [M, K] gemm_mfma over the same WARPS_M x 1 waves (slot
// (mi * K / S + kt) * S * S / 64 + r), which an f32 accumulator of that gemm gives after an
// elementwise cast. Registers 4q .. 4q + 3 of tile kt are the instruction's B operand for k
// S kt + KI q .. + KI - 1 (lane group g holding 4 g .. 4 g + 3 of them), so A is used in place
// and only B (op(B)'s columns, 4 consecutive k per lane) is read from LDS.
template <int INSTR, int M, int N, int K, int WARPS_M, int WARPS_N, bool TRANS_B, class LB,
          class TA, class TB>
JT_DEVICE void gemm_rs_mfma(const TA* a, ptr<TB> b, float* acc) {
  using B = gemm_detail::bare_t<TB>;
  using I = gemm_detail::Mfma<INSTR>;
  using W = gemm_detail::WaveTile<I::S, M, N, WARPS_M, WARPS_N>;
  constexpr bool kBf16 = gemm_detail::same<TA, bf16>::value;
  static_assert(gemm_detail::same<TA, B>::value &&
                    (gemm_detail::same<TA, half>::value || kBf16),
                "gemm_rs_mfma: f16 x f16 or bf16 x bf16 into f32");
  static_assert(WARPS_N == 1 && K % I::S == 0, "A is the accumulator of an [M, K] gemm_mfma");
  constexpr int KT = K / I::S;
  const W w;
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
    for (int q = 0; q < I::kRegs / 4; ++q) {
      const int k = I::S * kt + I::kK * q + 4 * w.group;
      unsigned bf[W::NI][2];
#pragma unroll
      for (int ni = 0; ni < W::NI; ++ni) {
        gemm_detail::read_k<LB, !TRANS_B>(bf[ni], b, w.col0 + ni * I::S + w.lane, k);
      }
#pragma unroll
      for (int mi = 0; mi < W::MI; ++mi) {
        const TA* p = a + (mi * KT + kt) * I::kRegs + 4 * q;
        const unsigned af[2] = {pack2(p[0], p[1]), pack2(p[2], p[3])};
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni) {
          gemm_detail::mfma<INSTR, kBf16>(acc + I::kRegs * (mi * W::NI + ni), bf[ni], af);
        }
      }
    }
  }
}
#endif

}  // namespace jaxtile
