// Fibers: one stack per CUDA thread, switched by a few instructions instead of swapcontext,
// which makes a sigprocmask system call on every switch.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "block.h"

#if !defined(__x86_64__) || defined(JAXTILE_EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace jaxtile {
namespace emu {

thread_local Fiber* t_fiber __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

// The least stack per CUDA thread; overridable with $JAXTILE_EMU_STACK_KB. Pages are committed
// only when touched, so a generous size costs address space, not memory.
size_t default_stack_bytes() {
  static const size_t bytes = [] {
    size_t kb = 256;
    if (const char* s = std::getenv("JAXTILE_EMU_STACK_KB")) {
      const long v = std::atol(s);
      if (v >= 16) kb = static_cast<size_t>(v);
    }
    return kb * 1024;
  }();
  return bytes;
}

// Stacks of this CPU thread, reused from block to block while they are large enough; each has
// a guard page below it so an overflow faults instead of corrupting the next stack (device
// functions check their stack on entry first, see check_stack).
struct StackPool {
  char* base = nullptr;
  size_t count = 0;
  size_t stride = 0;
  size_t bytes = 0;
  ~StackPool() {
    if (base != nullptr) munmap(base, count * stride);
  }
  // The top of stack `i` of `needed` stacks of `size` bytes, or null if they cannot be mapped.
  char* top(uint32_t i, uint32_t needed, size_t size) {
    if (needed > count || size > bytes) {
      if (base != nullptr) munmap(base, count * stride);
      base = nullptr;
      count = 0;
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      stride = size + page;
      void* p = mmap(nullptr, needed * stride, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      base = static_cast<char*>(p);
      count = needed;
      bytes = size;
      for (size_t k = 0; k < count; ++k) mprotect(base + k * stride, page, PROT_NONE);
    }
    return base + (i + 1) * stride;
  }
};
// Heap-held, like every large per-thread object of the runtime: its thread-local storage is
// allocated from glibc's small static TLS surplus (see runtime.h).
thread_local StackPool* t_stack_pool = nullptr;
StackPool& stacks() {
  if (t_stack_pool == nullptr) t_stack_pool = new StackPool();
  return *t_stack_pool;
}

}  // namespace

void release_large_stacks() {
  StackPool& pool = stacks();
  if (pool.base == nullptr || pool.bytes <= default_stack_bytes()) return;
  madvise(pool.base, pool.count * pool.stride, MADV_DONTNEED);
}

size_t fiber_stack_bytes(const KernelSpec& spec) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t bytes = default_stack_bytes();
  // The frames, the reserve check_stack keeps, and as much again for the runtime's own frames
  // below a device call (a warp collective's, a report's).
  if (spec.settings != nullptr) {
    bytes = std::max<size_t>(bytes, spec.settings->stack_bytes + 2 * kStackReserve);
  }
  return (bytes + page - 1) / page * page;
}

#if defined(__x86_64__) && !defined(JAXTILE_EMU_UCONTEXT)

extern "C" void jaxtile_emu_switch(void** save_sp, void* to_sp);
extern "C" void jaxtile_emu_trampoline();

// System V: rbx, rbp, r12-r15 are callee-saved; everything else the compiler already assumes
// clobbered across the call. A new fiber's stack holds those six registers (r12 = entry,
// rbx = argument) under the trampoline's address.
asm(R"(
  .text
  .globl jaxtile_emu_switch
  .hidden jaxtile_emu_switch
  .type jaxtile_emu_switch,@function
jaxtile_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size jaxtile_emu_switch,.-jaxtile_emu_switch

  .globl jaxtile_emu_trampoline
  .hidden jaxtile_emu_trampoline
  .type jaxtile_emu_trampoline,@function
jaxtile_emu_trampoline:
  movq %rbx, %rdi
  callq *%r12
  ud2
  .size jaxtile_emu_trampoline,.-jaxtile_emu_trampoline
)");

void fiber_switch(void** save_sp, void* to_sp) { jaxtile_emu_switch(save_sp, to_sp); }

bool fiber_init(Fiber& f, uint32_t stack_index, uint32_t count, size_t stack_bytes) {
  char* top = stacks().top(stack_index, count, stack_bytes);
  if (top == nullptr) return false;
  f.stack_low = top - stack_bytes;
  auto* sp = reinterpret_cast<uint64_t*>(top) - 7;  // top is 16-byte aligned
  sp[0] = 0;                                        // r15
  sp[1] = 0;                                        // r14
  sp[2] = 0;                                        // r13
  sp[3] = reinterpret_cast<uint64_t>(&fiber_main);  // r12
  sp[4] = reinterpret_cast<uint64_t>(&f);           // rbx
  sp[5] = 0;                                        // rbp
  sp[6] = reinterpret_cast<uint64_t>(&jaxtile_emu_trampoline);
  f.sp = sp;
  return true;
}

#else

// Portable fallback: ucontext, with the saved stack pointer slot pointing at the context.
namespace {
// Heap-held: ucontext_t is about 1 KiB, too much for static TLS.
thread_local std::vector<ucontext_t>* t_contexts = nullptr;
thread_local ucontext_t* t_main_context = nullptr;
void start(unsigned hi, unsigned lo) {
  fiber_main(reinterpret_cast<Fiber*>((static_cast<uintptr_t>(hi) << 32) | lo));
}
}  // namespace

void fiber_switch(void** save_sp, void* to_sp) {
  if (t_main_context == nullptr) t_main_context = new ucontext_t();
  ucontext_t* from = *save_sp != nullptr ? static_cast<ucontext_t*>(*save_sp) : t_main_context;
  *save_sp = from;
  swapcontext(from, static_cast<ucontext_t*>(to_sp));
}

bool fiber_init(Fiber& f, uint32_t stack_index, uint32_t count, size_t stack_bytes) {
  if (t_contexts == nullptr) t_contexts = new std::vector<ucontext_t>();
  if (t_contexts->size() < count) t_contexts->resize(count);
  char* top = stacks().top(stack_index, count, stack_bytes);
  if (top == nullptr) return false;
  f.stack_low = top - stack_bytes;
  ucontext_t& c = (*t_contexts)[stack_index];
  getcontext(&c);
  c.uc_stack.ss_sp = f.stack_low;
  c.uc_stack.ss_size = stack_bytes;
  c.uc_link = nullptr;
  const auto p = reinterpret_cast<uintptr_t>(&f);
  makecontext(&c, reinterpret_cast<void (*)()>(&start), 2, static_cast<unsigned>(p >> 32),
              static_cast<unsigned>(p));
  f.sp = &c;
  return true;
}

#endif

}  // namespace emu
}  // namespace jaxtile
