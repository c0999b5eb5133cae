"""A standalone tiled GEMM kernel assembled from tile_gemm.h, the planner and the pipeline plan.

``C[M, N] = op(A) @ op(B)``: each block computes a ``BM x BN`` tile of C, streaming ``BK``-deep
tiles of A and B through shared memory with a ``stages``-deep cp.async pipeline
(:mod:`.copy_schedule`), 16-byte copies masked at the edges (zero-filled), the shared layouts
and the gemm call of a :class:`~.gemm_plan.GemmPlan`, and the accumulator stored through the
plan's layout. It is what the tests run in the emulator and compile with nvcc, what
``benchmarks/ptxas_report.py`` measures, and a worked example for the code generator.

Global rows must be a multiple of 16 bytes long (cp.async's alignment); M, N and K need not
divide the tiles.
"""

from __future__ import annotations

from .copy_schedule import PipelinePlan, Step, plan_pipeline
from .gemm_plan import GemmPlan, cpp_type
from .layout import Layout

_COPY = """\
// Copies an R x C tile (stored as L) from a row-major global matrix with `cols` columns, at
// (r0, c0), in 16-byte chunks; chunks past the edge are zero-filled from a valid address.
// Thread tid copies chunks tid, tid + THREADS, ...; when THREADS is a multiple of the chunks per
// row, those sit in one column, rows STEP apart, and one pointer walks down them (fewer live
// registers than an address per chunk).
template <class L, int R, int C, class T>
JT_DEVICE void copy_tile(jaxtile::ptr<T> dst, jaxtile::ptr<const T> src, int rows, int cols,
                         int r0, int c0, int tid) {
  constexpr int VEC = 16 / int(sizeof(T)), CHUNKS = C / VEC, TOTAL = R * CHUNKS;
  if constexpr (THREADS % CHUNKS == 0 && TOTAL % THREADS == 0) {
    constexpr int STEP = THREADS / CHUNKS;
    const int row = tid / CHUNKS, col = tid % CHUNKS * VEC, gc = c0 + col;
    jaxtile::ptr<const T> p = src + (int64_t(r0 + row) * cols + gc);
    #pragma unroll
    for (int i = 0; i < TOTAL / THREADS; ++i) {
      const bool ok = r0 + row + i * STEP < rows && gc < cols;
      jaxtile::cp_async<16>(dst + L::offset(row + i * STEP, col), ok ? p : src, ok ? 16 : 0);
      p += int64_t(STEP) * cols;
    }
  } else {
    #pragma unroll
    for (int i = 0; i < (TOTAL + THREADS - 1) / THREADS; ++i) {
      const int c = tid + i * THREADS;
      if (c < TOTAL) {
        const int row = c / CHUNKS, col = c % CHUNKS * VEC;
        const int gr = r0 + row, gc = c0 + col;
        const bool ok = gr < rows && gc < cols;
        jaxtile::cp_async<16>(dst + L::offset(row, col),
                              ok ? src + (int64_t(gr) * cols + gc) : src, ok ? 16 : 0);
      }
    }
  }
}
"""


def _table(name: str, layout: Layout, dim: int) -> str:
    values = ", ".join(str(layout.local_coords(s)[dim]) for s in range(layout.num_local))
    return f"constexpr int {name}[{layout.num_local}] = {{{values}}};"


def _step(step: Step, prologue: bool, plan: GemmPlan, a_regs: bool) -> list[str]:
    tile = str(step.tile) if prologue else ("k" if step.tile == 0 else f"k + {step.tile}")
    if step.kind == "copy":
        a = "" if a_regs else f"As + ({tile}) % STAGES * LA::kElems, "
        call = f"load_stage({a}Bs + ({tile}) % STAGES * LB::kElems, A, B, M, N, K, m0, n0, " \
               f"({tile}) * BK, tid);"
        return [call] if step.guard == "always" else [f"if ({tile} < n_k) {call}"]
    if step.kind == "commit":
        return ["jaxtile::cp_async_commit();"]
    if step.kind == "wait":
        return [f"jaxtile::cp_async_wait<{step.count}>();"]
    if step.kind == "barrier":
        return ["jaxtile::sync_threads();"]
    b = f"Bs + ({tile}) % STAGES * LB::kElems"
    if not a_regs:
        return [plan.call(f"As + ({tile}) % STAGES * LA::kElems", b, "acc")]
    ta = cpp_type(plan.a_dtype)
    return [f"{ta} a_reg[NLA];",
            "#pragma unroll",
            "for (int s = 0; s < NLA; ++s) {",
            f"  const int r = m0 + a_tr + kARow[s], c = ({tile}) * BK + a_tc + kACol[s];",
            f"  a_reg[s] = r < M && c < K ? A[int64_t(r) * K + c] : {ta}{{0}};",
            "}",
            plan.call("a_reg", b, "acc")]


def gemm_kernel_source(plan: GemmPlan, name: str, stages: int = 3, *,
                       dump_accumulator: bool = False) -> str:
    """The ``.cu`` text of kernel ``name(A, B, C[, D], M, N, K)`` for block tile
    ``plan.m x plan.n x plan.k``, launched on grid ``(ceil(N / BN), ceil(M / BM))`` with
    ``plan.threads`` threads. A is ``[M, K]`` (``[K, M]`` when ``trans_a``), B ``[K, N]``
    (``[N, K]`` when ``trans_b``); with ``plan.a_layout`` (gemm_rs) A is read from global
    memory straight into registers. ``dump_accumulator`` adds an output ``D`` receiving every
    thread's raw accumulator slots, ``D[(block * threads + thread) * slots + slot]``, so a test
    can check the layout."""
    pipe: PipelinePlan = plan_pipeline(stages)
    a_regs = plan.a_layout is not None
    ta, tb, tc = cpp_type(plan.a_dtype), cpp_type(plan.b_dtype), cpp_type(plan.acc_dtype)
    lay = plan.acc_layout
    tr, tcol = lay.thread_coord_exprs("tid")
    lines = ["#include <jaxtile/device.h>", "#include <jaxtile/tile_gemm.h>", "",
             f"constexpr int BM = {plan.m}, BN = {plan.n}, BK = {plan.k};",
             f"constexpr int STAGES = {stages}, THREADS = {plan.threads};",
             f"constexpr int NL = {lay.num_local};",
             f"using LB = {plan.b_tile.cpp};"]
    if not a_regs:
        lines.append(f"using LA = {plan.a_tile.cpp};")
    lines += ["", _COPY]
    a_copy = ("" if a_regs else
              ("  copy_tile<LA, BK, BM>(as, A, K, M, k0, m0, tid);\n" if plan.trans_a else
               "  copy_tile<LA, BM, BK>(as, A, M, K, m0, k0, tid);\n"))
    b_copy = ("  copy_tile<LB, BN, BK>(bs, B, N, K, n0, k0, tid);\n" if plan.trans_b else
              "  copy_tile<LB, BK, BN>(bs, B, K, N, k0, n0, tid);\n")
    a_param = "" if a_regs else f"jaxtile::ptr<{ta}> as, "
    lines.append(f"JT_DEVICE void load_stage({a_param}jaxtile::ptr<{tb}> bs, "
                 f"jaxtile::ptr<const {ta}> A, jaxtile::ptr<const {tb}> B, int M, int N, int K, "
                 f"int m0, int n0, int k0, int tid) {{\n{a_copy}{b_copy}}}\n")
    dump = f"jaxtile::ptr<{tc}> D, " if dump_accumulator else ""
    lines += [f"JT_KERNEL JT_LAUNCH_BOUNDS(THREADS) void {name}(jaxtile::ptr<const {ta}> A, "
              f"jaxtile::ptr<const {tb}> B, jaxtile::ptr<{tc}> C, {dump}int M, int N, int K) {{"]
    body = []
    if not a_regs:
        body.append(f"JT_SHARED({ta}, As, STAGES * LA::kElems);")
    body += [f"JT_SHARED({tb}, Bs, STAGES * LB::kElems);",
             "const int tid = jaxtile::thread_idx().x;",
             "const int m0 = jaxtile::block_idx().y * BM, n0 = jaxtile::block_idx().x * BN;",
             "const int n_k = (K + BK - 1) / BK;",
             _table("kRow", lay, 0), _table("kCol", lay, 1)]
    if a_regs:
        atr, atc = plan.a_layout.thread_coord_exprs("tid")
        body += [f"constexpr int NLA = {plan.a_layout.num_local};",
                 _table("kARow", plan.a_layout, 0), _table("kACol", plan.a_layout, 1),
                 f"const int a_tr = {atr}, a_tc = {atc};"]
    body += [f"{tc} acc[NL];", "#pragma unroll", f"for (int s = 0; s < NL; ++s) acc[s] = {tc}(0);"]
    for step in pipe.prologue:
        body += _step(step, True, plan, a_regs)
    body.append("for (int k = 0; k < n_k; ++k) {")
    for step in pipe.body:
        body += ["  " + line for line in _step(step, False, plan, a_regs)]
    body.append("}")
    body += [f"const int tr = {tr}, tc = {tcol};", "#pragma unroll",
             "for (int s = 0; s < NL; ++s) {",
             "  const int r = m0 + tr + kRow[s], c = n0 + tc + kCol[s];",
             "  if (r < M && c < N) C[int64_t(r) * N + c] = acc[s];", "}"]
    if dump_accumulator:
        body += ["const int64_t blk = jaxtile::block_idx().y * jaxtile::grid_dim().x + "
                 "jaxtile::block_idx().x;", "#pragma unroll",
                 "for (int s = 0; s < NL; ++s) D[(blk * THREADS + tid) * NL + s] = acc[s];"]
    lines += ["  " + line for line in body] + ["}", ""]
    return "\n".join(lines)
