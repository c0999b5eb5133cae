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

// Several chunks per thread, taken in turn by whichever thread is free: when another
// process holds a core, one chunk per thread left the call waiting for the slowed thread
// (softmax 4096 x 1024 on 2 shared cores: 3.1-4.5 ms with 1 chunk per thread, 3.0-3.2 with
// 4, 3.3-3.7 with 16).
constexpr int64_t kChunksPerThread = 4;

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
  int rc = kernel.fn(nullptr, args, num_args, &result);
  if (rc == 0) return {};
  std::string msg = take_last_error();
  if (msg.empty()) msg = "kernel returned error code " + std::to_string(rc);
  return msg;
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
  int64_t num_blocks;
  int64_t num_chunks;
  std::atomic<bool> failed{false};
  std::mutex error_mu{};
  std::string error{};
};

void run_chunk(void* ctx, int64_t chunk) {
  auto& s = *static_cast<Split*>(ctx);
  // Contiguous, near-equal ranges: the first `extra` chunks get one block more.
  const int64_t base = s.num_blocks / s.num_chunks;
  const int64_t extra = s.num_blocks % s.num_chunks;
  const int64_t begin = s.begin + chunk * base + std::min(chunk, extra);
  const int64_t end = begin + base + (chunk < extra ? 1 : 0);

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

// TVM tells LLVM every buffer is aligned this much and emits aligned vector accesses, so a
// misaligned pointer would crash rather than fail.
std::string check_alignment(const Kernel& kernel, const TVMFFIAny* args, int32_t num_args) {
  const auto mask = static_cast<uintptr_t>(kernel.alignment - 1);
  for (int32_t i = 2; i < num_args; ++i) {
    if (args[i].type_index != kTVMFFIDLTensorPtr) continue;
    const auto* t = static_cast<const DLTensor*>(args[i].v_ptr);
    if ((reinterpret_cast<uintptr_t>(t->data) & mask) != 0) {
      return "buffer #" + std::to_string(i - 2) + " is not " + std::to_string(kernel.alignment) +
             "-byte aligned";
    }
  }
  return {};
}

}  // namespace

std::string run_blocks(const Kernel& kernel, TVMFFIAny* args, int32_t num_args, int64_t begin,
                       int64_t end, const HostPool* host) {
  const int64_t num_blocks = end - begin;
  if (num_blocks <= 0) return {};
  if (std::string msg = check_alignment(kernel, args, num_args); !msg.empty()) return msg;
  const ThreadPlan plan =
      plan_threads(num_threads(), threads_requested(), host ? host->num_threads : 0);
  const int64_t num_chunks = std::min<int64_t>(num_blocks, plan.threads * kChunksPerThread);
  if (num_chunks > 1) {
    Split split{&kernel, args, num_args, begin, num_blocks, num_chunks};
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

}  // namespace jaxtile
