#include "cpu/runtime_env.h"

#include <tvm/ffi/c_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>

namespace jaxtile {
namespace {

// What TVM's own runtime guarantees. Current codegen does not assume it for workspaces (only
// for buffer arguments), but staying compatible costs nothing.
constexpr size_t kWorkspaceAlign = 64;

thread_local std::string t_last_error;

void set_error(const char* kind, const char* const* parts, int32_t num_parts) {
  std::string msg = kind != nullptr ? kind : "Error";
  msg += ": ";
  for (int32_t i = 0; i < num_parts; ++i) {
    if (parts[i] != nullptr) msg += parts[i];
  }
  t_last_error = std::move(msg);
}

void* alloc_workspace(int /*device_type*/, int /*device_id*/, uint64_t nbytes,
                      int /*dtype_code_hint*/, int /*dtype_bits_hint*/) {
  // aligned_alloc wants a multiple of the alignment, and even a zero-byte request must give a
  // non-null pointer because the generated code treats null as an allocation failure.
  size_t size = (nbytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  if (size == 0) size = kWorkspaceAlign;
  void* ptr = std::aligned_alloc(kWorkspaceAlign, size);
  if (ptr == nullptr) {
    // The generated code returns -1 without a message of its own.
    const std::string n = std::to_string(nbytes);
    const char* parts[] = {"out of memory: the kernel's scratch memory (", n.c_str(),
                           " bytes for one of its on-chip buffers or tile values) could not "
                           "be allocated"};
    set_error("MemoryError", parts, 3);
  }
  return ptr;
}

int free_workspace(int /*device_type*/, int /*device_id*/, void* ptr) {
  std::free(ptr);
  return 0;
}

struct ParallelEnv {
  void* sync_handle;
  int32_t num_task;
};
using ParallelLambda = int (*)(int task_id, ParallelEnv* env, void* cdata);

// jaxtile parallelises over grid blocks itself, so TVM-level parallel loops run serially.
int parallel_launch(ParallelLambda fn, void* cdata, int /*num_task*/) {
  ParallelEnv env{nullptr, 1};
  return fn(0, &env, cdata);
}

int parallel_barrier(int /*task_id*/, ParallelEnv* /*env*/) { return 0; }

void error_set_raised_from_cstr(const char* kind, const char* message) {
  set_error(kind, &message, 1);
}

void error_set_raised_from_cstr_parts(const char* kind, const char** parts, int32_t num_parts) {
  set_error(kind, parts, num_parts);
}

// Calling other packed functions needs the TVM runtime, which a cache hit must not load.
int mod_lookup_from_imports(void* /*library_ctx*/, const char* name, void** /*out*/) {
  const char* parts[] = {"jaxtile kernels cannot call the external function '", name, "'"};
  set_error("RuntimeError", parts, 3);
  return -1;
}

int function_call(void* /*func*/, TVMFFIAny* /*args*/, int32_t /*num_args*/,
                  TVMFFIAny* /*result*/) {
  const char* msg = "jaxtile kernels cannot call packed functions";
  set_error("RuntimeError", &msg, 1);
  return -1;
}

int handle_init_once(void** handle_addr, int (*init)(void** result)) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (*handle_addr != nullptr) return 0;
  void* result = nullptr;
  if (int rc = init(&result); rc != 0) return rc;
  *handle_addr = result;
  return 0;
}

template <typename F>
void* as_ptr(F* fn) {
  return reinterpret_cast<void*>(fn);
}

// Atomic updates for jaxtile's `atomic` op: generated code calls jaxtile_atomic_<fn>_<type>
// (an undefined symbol bound when the library is loaded). Relaxed ordering suffices: the end
// of a call, where the thread pool joins, orders every update before anyone reads them.
// Floats, and max/min of any type, update by compare-and-swap; max/min propagate NaN and
// order -0.0 below 0.0, as jnp.maximum/minimum do (so concurrent updates commute; the CUDA
// device header's atomics.h follows the same rules).
template <typename T>
bool signed_below(T a, T b) {
  return a < b || (a == b && std::signbit(a) && !std::signbit(b));
}

template <typename T>
T combine_max(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return signed_below(a, b) ? b : a;
}

template <typename T>
T combine_min(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return signed_below(b, a) ? b : a;
}

template <typename T, T (*Combine)(T, T)>
int32_t atomic_update(T* ptr, T value) {
  T old;
  __atomic_load(ptr, &old, __ATOMIC_RELAXED);
  T desired = Combine(old, value);
  while (!__atomic_compare_exchange(ptr, &old, &desired, /*weak=*/true, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
    desired = Combine(old, value);
  }
  return 0;
}

template <typename T>
T combine_add(T a, T b) {
  return a + b;
}

template <typename T>
int32_t atomic_add_int(T* ptr, T value) {
  __atomic_fetch_add(ptr, value, __ATOMIC_RELAXED);
  return 0;
}

// Memory ordering between the blocks of one call (jt.load_acquire, jt.store_release,
// jt.fence): a flag one block publishes and another waits for. Out-of-line calls, so the
// compiler neither keeps a flag in a register across a loop nor moves other memory accesses
// across them.
template <typename T>
T load_acquire(const T* ptr) {
  T v;
  __atomic_load(ptr, &v, __ATOMIC_ACQUIRE);
  return v;
}

template <typename T>
int32_t store_release(T* ptr, T value) {
  __atomic_store(ptr, &value, __ATOMIC_RELEASE);
  return 0;
}

int32_t fence() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return 0;
}

// jt.print: the generated code appends the pieces of a line to this thread's buffer (a block
// runs on one thread), then print_end writes it whole under stdout's lock and flushes, so the
// lines of blocks on other threads never mix into it and are in fd 1 when the call returns.
// Numbers are formatted as printf's %lld, %llu and %g (compiler/print_format.py).
thread_local std::string t_print_line;

int32_t print_text(const char* text) {
  t_print_line += text;
  return 0;
}

template <typename T>
int32_t print_number(const char* format, T value) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, format, value);
  if (n > 0) t_print_line.append(buf, std::min<size_t>(n, sizeof buf - 1));
  return 0;
}

int32_t print_int(int64_t v) { return print_number("%lld", static_cast<long long>(v)); }
int32_t print_uint(uint64_t v) {
  return print_number("%llu", static_cast<unsigned long long>(v));
}
// Every NaN as "nan": its sign bit differs between backends' arithmetic.
int32_t print_float(double v) { return print_number("%g", std::isnan(v) ? std::fabs(v) : v); }
int32_t print_bool(int32_t v) { return print_text(v != 0 ? "True" : "False"); }

int32_t print_end() {
  t_print_line += '\n';
  flockfile(stdout);
  std::fwrite(t_print_line.data(), 1, t_print_line.size(), stdout);
  std::fflush(stdout);
  funlockfile(stdout);
  t_print_line.clear();
  return 0;
}

const RuntimeSymbol kFunctions[] = {
    {"jaxtile_print_text", as_ptr(&print_text)},
    {"jaxtile_print_int", as_ptr(&print_int)},
    {"jaxtile_print_uint", as_ptr(&print_uint)},
    {"jaxtile_print_float", as_ptr(&print_float)},
    {"jaxtile_print_bool", as_ptr(&print_bool)},
    {"jaxtile_print_end", as_ptr(&print_end)},
    {"jaxtile_load_acquire_f32", as_ptr(&load_acquire<float>)},
    {"jaxtile_load_acquire_f64", as_ptr(&load_acquire<double>)},
    {"jaxtile_load_acquire_i32", as_ptr(&load_acquire<int32_t>)},
    {"jaxtile_load_acquire_i64", as_ptr(&load_acquire<int64_t>)},
    {"jaxtile_store_release_f32", as_ptr(&store_release<float>)},
    {"jaxtile_store_release_f64", as_ptr(&store_release<double>)},
    {"jaxtile_store_release_i32", as_ptr(&store_release<int32_t>)},
    {"jaxtile_store_release_i64", as_ptr(&store_release<int64_t>)},
    {"jaxtile_fence", as_ptr(&fence)},
    {"jaxtile_atomic_add_f32", as_ptr(&atomic_update<float, combine_add<float>>)},
    {"jaxtile_atomic_add_f64", as_ptr(&atomic_update<double, combine_add<double>>)},
    {"jaxtile_atomic_add_i32", as_ptr(&atomic_add_int<int32_t>)},
    {"jaxtile_atomic_add_i64", as_ptr(&atomic_add_int<int64_t>)},
    {"jaxtile_atomic_max_f32", as_ptr(&atomic_update<float, combine_max<float>>)},
    {"jaxtile_atomic_max_f64", as_ptr(&atomic_update<double, combine_max<double>>)},
    {"jaxtile_atomic_max_i32", as_ptr(&atomic_update<int32_t, combine_max<int32_t>>)},
    {"jaxtile_atomic_max_i64", as_ptr(&atomic_update<int64_t, combine_max<int64_t>>)},
    {"jaxtile_atomic_min_f32", as_ptr(&atomic_update<float, combine_min<float>>)},
    {"jaxtile_atomic_min_f64", as_ptr(&atomic_update<double, combine_min<double>>)},
    {"jaxtile_atomic_min_i32", as_ptr(&atomic_update<int32_t, combine_min<int32_t>>)},
    {"jaxtile_atomic_min_i64", as_ptr(&atomic_update<int64_t, combine_min<int64_t>>)},
    {"TVMBackendAllocWorkspace", as_ptr(&alloc_workspace)},
    {"TVMBackendFreeWorkspace", as_ptr(&free_workspace)},
    {"TVMBackendParallelLaunch", as_ptr(&parallel_launch)},
    {"TVMBackendParallelBarrier", as_ptr(&parallel_barrier)},
    {"TVMFFIErrorSetRaisedFromCStr", as_ptr(&error_set_raised_from_cstr)},
    {"TVMFFIErrorSetRaisedFromCStrParts", as_ptr(&error_set_raised_from_cstr_parts)},
    {"TVMFFIEnvModLookupFromImports", as_ptr(&mod_lookup_from_imports)},
    {"TVMFFIFunctionCall", as_ptr(&function_call)},
    {"TVMFFIHandleInitOnce", as_ptr(&handle_init_once)},
};

int g_library_context;

}  // namespace

const RuntimeSymbol* runtime_functions(size_t* count) {
  *count = std::size(kFunctions);
  return kFunctions;
}

void* runtime_function(std::string_view name) {
  for (const RuntimeSymbol& sym : kFunctions) {
    if (sym.name == name) return sym.fn;
  }
  return nullptr;
}

void* library_context() { return &g_library_context; }

std::string take_last_error() {
  std::string msg = std::move(t_last_error);
  t_last_error.clear();
  return msg;
}

}  // namespace jaxtile
