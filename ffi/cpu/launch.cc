#include "cpu/launch.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string_view>
#include <vector>

#include "cpu/runtime_env.h"
#include "cpu/thread_pool.h"
#include "cpu/trace.h"

namespace jaxtile {
namespace {

// Enough for any realistic kernel; beyond this a heap copy per chunk is still cheap.
constexpr int32_t kInlineArgs = 32;

// The blocks go in chunks that shrink as they are taken (guided scheduling): each is
// 1 / (kChunkDivisor * threads) of the blocks not yet handed out, at least one block, and
// whichever thread is free takes the next. The first chunks are long (each chunk's start
// costs something: a GEMM copies its panel of B again there, copy_reuse.py), the last ones
// single blocks, so the threads finish within about a block of each other whatever their
// speeds. Equal chunks, four per thread, left the call waiting for the slower thread for
// up to a whole chunk (the 1024^3 GEMM: 8 chunks of 2.6 ms, against 17 here). On two free
// Zen 4 cores the AVX2 GEMMs kept 1.78-1.96 threads busy per wall second, 1.97-1.98 with
// these (quiet machine, XLA / jaxtile wall: bf16 0.91 -> 0.96, bias+GELU 0.91 -> 0.98,
// f32 0.96-1.00 either way); with one core shared by both threads there is nothing to
// balance and the extra chunk starts cost 0-4%
// (benchmarks/README.md, "Issue 20, point 1 (2026-12-03, avx2reuse)"). Several chunks per
// thread, not one, were already there for a core held by another process (softmax
// 4096 x 1024 on 2 shared cores: 3.1-4.5 ms with 1 chunk per thread, 3.0-3.2 with 4).
constexpr int64_t kChunkDivisor = 2;

// Out of line and cold, as are the other messages: a small kernel's call runs through little
// code (benchmarks/dispatch.py).
[[gnu::cold, gnu::noinline]] std::string kernel_error(int rc) {
  std::string msg = take_last_error();
  if (msg.empty()) msg = "kernel returned error code " + std::to_string(rc);
  return msg;
}

std::string call_range(const Kernel& kernel, TVMFFIAny* args, int32_t num_args, int64_t begin,
                       int64_t end) {
  args[0].type_index = kTVMFFIInt;
  args[0].zero_padding = 0;
  args[0].v_int64 = begin;
  args[1].type_index = kTVMFFIInt;
  args[1].zero_padding = 0;
  args[1].v_int64 = end;
  TVMFFIAny result{};
  result.type_index = kTVMFFINone;
  const int rc = kernel.fn(nullptr, args, num_args, &result);
  return rc == 0 ? std::string() : kernel_error(rc);
}

// The kernel's name for trace ranges: its symbol without the tvm-ffi and jaxtile prefixes
// (`__tvm_ffi_jt_softmax` -> `softmax`, see compiler/cpu/lower.py's symbol_name).
std::string_view kernel_name(const Kernel& kernel) {
  std::string_view name = kernel.symbol;
  for (std::string_view prefix : {"__tvm_ffi_", "jt_"}) {
    if (name.substr(0, prefix.size()) == prefix) name.remove_prefix(prefix.size());
  }
  return name;
}

struct Split {
  const Kernel* kernel;
  const TVMFFIAny* args;
  int32_t num_args;
  int64_t begin;
  const std::vector<int64_t>* bounds;  // chunk c is blocks [bounds[c], bounds[c + 1]) past begin
  std::atomic<bool> failed{false};
  std::mutex error_mu{};
  std::string error{};
};

void run_chunk(void* ctx, int64_t chunk) {
  auto& s = *static_cast<Split*>(ctx);
  const int64_t begin = s.begin + (*s.bounds)[chunk];
  const int64_t end = s.begin + (*s.bounds)[chunk + 1];

  // Each chunk needs its own copy because args[0..1] differ per chunk.
  TVMFFIAny local[kInlineArgs];
  std::vector<TVMFFIAny> heap;
  TVMFFIAny* args = local;
  if (s.num_args > kInlineArgs) {
    heap.resize(s.num_args);
    args = heap.data();
  }
  std::copy(s.args, s.args + s.num_args, args);
  const int64_t start_ns = tracing() ? trace_now_ns() : 0;
  std::string msg = call_range(*s.kernel, args, s.num_args, begin, end);
  if (start_ns != 0) record_range(kernel_name(*s.kernel), begin, end, start_ns);
  if (!msg.empty() && !s.failed.exchange(true)) {
    std::lock_guard<std::mutex> lock(s.error_mu);
    s.error = std::move(msg);
  }
}

[[gnu::cold, gnu::noinline]] std::string misaligned(const Kernel& kernel, int32_t buffer) {
  return "buffer #" + std::to_string(buffer) + " is not " + std::to_string(kernel.alignment) +
         "-byte aligned";
}

// TVM tells LLVM every buffer is aligned this much and emits aligned vector accesses, so a
// misaligned pointer would crash rather than fail.
std::string check_alignment(const Kernel& kernel, const TVMFFIAny* args, int32_t num_args) {
  const auto mask = static_cast<uintptr_t>(kernel.alignment - 1);
  for (int32_t i = 2; i < num_args; ++i) {
    if (args[i].type_index != kTVMFFIDLTensorPtr) continue;
    const auto* t = static_cast<const DLTensor*>(args[i].v_ptr);
    if ((reinterpret_cast<uintptr_t>(t->data) & mask) != 0) return misaligned(kernel, i - 2);
  }
  return {};
}

}  // namespace

std::vector<int64_t> chunk_bounds(int64_t num_blocks, int threads) {
  std::vector<int64_t> bounds{0};
  if (num_blocks <= 0) return bounds;
  if (threads <= 1) {
    bounds.push_back(num_blocks);
    return bounds;
  }
  const int64_t parts = kChunkDivisor * threads;
  for (int64_t done = 0; done < num_blocks;) {
    done += (num_blocks - done + parts - 1) / parts;  // ceil: at least one block
    bounds.push_back(done);
  }
  return bounds;
}

// Blocks shared by threads when the plan has more than one; out of line, so that a call of
// one block runs through little code.
[[gnu::noinline]] std::string run_split(const Kernel& kernel, TVMFFIAny* args, int32_t num_args,
                                        int64_t begin, int64_t end, const HostPool* host) {
  const int64_t num_blocks = end - begin;
  const ThreadPlan plan =
      plan_threads(num_threads(), threads_requested(), host ? host->num_threads : 0);
  if (plan.threads <= 1) return call_range(kernel, args, num_args, begin, end);
  const std::vector<int64_t> bounds = chunk_bounds(num_blocks, plan.threads);
  const auto num_chunks = static_cast<int64_t>(bounds.size()) - 1;
  if (num_chunks > 1) {
    Split split{&kernel, args, num_args, begin, &bounds};
    bool ran = true;
    if (plan.on_host_pool) {
      // No more helpers than chunks past the caller's first.
      const int helpers = static_cast<int>(std::min<int64_t>(plan.threads - 1, num_chunks - 1));
      host_parallel_run(*host, helpers, num_chunks, run_chunk, &split);
    } else {
      ran = parallel_run(num_chunks, run_chunk, &split);
    }
    if (ran) {
      std::lock_guard<std::mutex> lock(split.error_mu);
      return std::move(split.error);
    }
  }
  // One block, one thread, or the pool is serving another call: run everything here.
  return call_range(kernel, args, num_args, begin, end);
}

std::string run_blocks(const Kernel& kernel, TVMFFIAny* args, int32_t num_args, int64_t begin,
                       int64_t end, const HostPool* host) {
  const int64_t num_blocks = end - begin;
  if (num_blocks <= 0) return {};
  if (std::string msg = check_alignment(kernel, args, num_args); !msg.empty()) return msg;
  // One block or one thread is one chunk: it runs here, and the plan and the chunk list
  // (an allocation) are not made. A small kernel's whole call costs a few hundred ns, so
  // each allocation and each cache line it touches shows.
  if (num_blocks == 1) return call_range(kernel, args, num_args, begin, end);
  return run_split(kernel, args, num_args, begin, end, host);
}

}  // namespace jaxtile
