/* A stand-in for the NVIDIA driver library (libcuda.so.1) that records what the CUDA handler
 * asks of it, so the handler's use of the driver API is tested on machines without a GPU.
 *
 * Each call appends one line to the file named by $FAKE_CUDA_LOG. A "module image" is text:
 *   "FAKECUBIN params=<sizes>"   loads; <sizes> gives the kernel's parameter sizes in bytes,
 *                                e.g. "884" for two pointers and an int (what the launch logs);
 *                                "m" a 128-byte tensor map (the launch logs its first 8 bytes)
 *   "FAKECUBIN other-family"     fails with CUDA_ERROR_NO_BINARY_FOR_GPU (209)
 *   "FAKEPTX params=<sizes>"     loads (PTX the driver would compile)
 * A module must be loaded, and a kernel launched on a stream, while the context (of the stream)
 * is current (CUDA_ERROR_INVALID_CONTEXT otherwise). No context is current until one is pushed,
 * or $FAKE_CUDA_CURRENT_CTX names the one the calling thread has current. The driver supports
 * CUDA $FAKE_CUDA_DRIVER_VERSION (as cuDriverGetVersion counts; 13000 if unset).
 * The function "missing" is not found; $FAKE_CUDA_LAUNCH_ERROR makes launches fail with that
 * code. cuTensorMapEncodeTiled logs its arguments and writes the global address into the
 * map's first 8 bytes; $FAKE_CUDA_TMAP_ERROR makes it fail with that code. A stream's context is the stream's value divided by 256 (stream 0x100 -> context 1);
 * stream 0xdead has none. */
#define FAKE_LOG_ENV "FAKE_CUDA_LOG"
#include "fake_driver_log.h"

typedef int CUresult;

struct module {
  char sizes[64];
};

static uintptr_t g_ctx_stack[16];
static int g_depth = 0;

static uintptr_t current_ctx(void) {
  if (g_depth > 0) return g_ctx_stack[g_depth - 1];
  const char* preset = getenv("FAKE_CUDA_CURRENT_CTX");
  return preset ? (uintptr_t)strtoul(preset, NULL, 0) : 0;
}

CUresult cuInit(unsigned flags) {
  logf_line("cuInit %u", flags);
  return 0;
}

CUresult cuGetErrorName(CUresult r, const char** out) {
  *out = r == 209 ? "CUDA_ERROR_NO_BINARY_FOR_GPU"
         : r == 201 ? "CUDA_ERROR_INVALID_CONTEXT"
         : r == 500 ? "CUDA_ERROR_NOT_FOUND"
         : r == 701 ? "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
                    : "CUDA_ERROR_INVALID_VALUE";
  return 0;
}

CUresult cuGetErrorString(CUresult r, const char** out) {
  *out = r == 701 ? "too many resources requested for launch" : "fake driver error";
  return 0;
}

CUresult cuDriverGetVersion(int* version) {
  const char* v = getenv("FAKE_CUDA_DRIVER_VERSION");
  *version = v ? atoi(v) : 13000;
  return 0;
}

CUresult cuCtxGetCurrent(void** ctx) {
  *ctx = (void*)current_ctx();
  return 0;
}

CUresult cuStreamGetCtx(void* stream, void** ctx) {
  if ((uintptr_t)stream == 0xdead) return 1;
  *ctx = (void*)((uintptr_t)stream / 256);
  logf_line("cuStreamGetCtx stream=%#lx ctx=%lu", (unsigned long)(uintptr_t)stream,
            (unsigned long)(uintptr_t)*ctx);
  return 0;
}

CUresult cuCtxPushCurrent_v2(void* ctx) {
  g_ctx_stack[g_depth++] = (uintptr_t)ctx;
  logf_line("cuCtxPushCurrent ctx=%lu", (unsigned long)(uintptr_t)ctx);
  return 0;
}

CUresult cuCtxPopCurrent_v2(void** ctx) {
  if (g_depth == 0) return 201;
  *ctx = (void*)g_ctx_stack[--g_depth];
  logf_line("cuCtxPopCurrent ctx=%lu", (unsigned long)(uintptr_t)*ctx);
  return 0;
}

CUresult cuModuleLoadData(void** module, const void* image) {
  const char* text = (const char*)image;
  const uintptr_t ctx = current_ctx();
  if (ctx == 0) return 201;
  const int ptx = strncmp(text, "FAKEPTX ", 8) == 0;
  if (!ptx && strncmp(text, "FAKECUBIN ", 10) != 0) return 1;
  const char* sizes = strstr(text, "params=");
  if (sizes == NULL) {
    logf_line("cuModuleLoadData ctx=%lu %s refused", (unsigned long)ctx, ptx ? "ptx" : "cubin");
    return 209;
  }
  struct module* m = calloc(1, sizeof *m);
  snprintf(m->sizes, sizeof m->sizes, "%s", sizes + 7);
  *module = m;
  logf_line("cuModuleLoadData ctx=%lu %s", (unsigned long)ctx, ptx ? "ptx" : "cubin");
  return 0;
}

CUresult cuModuleGetFunction(void** fn, void* module, const char* name) {
  return get_function("cuModuleGetFunction", fn, module, name);
}

CUresult cuFuncSetAttribute(void* fn, int attribute, int value) {
  logf_line("cuFuncSetAttribute %s attribute=%d value=%d", ((struct function*)fn)->name,
            attribute, value);
  return 0;
}

CUresult cuTensorMapEncodeTiled(void* map, int type, unsigned rank, void* address,
                                 const unsigned long long* dims,
                                 const unsigned long long* strides, const unsigned* box,
                                 const unsigned* element_strides, int interleave, int swizzle,
                                 int l2, int oob) {
  char line[1024];
  int at = snprintf(line, sizeof line, "cuTensorMapEncodeTiled type=%d rank=%u address=%#lx "
                    "aligned=%d dims=", type, rank, (unsigned long)(uintptr_t)address,
                    (int)((uintptr_t)map % 64 == 0));
  for (unsigned i = 0; i < rank; ++i) {
    at += snprintf(line + at, sizeof line - (size_t)at, "%s%llu", i ? "," : "", dims[i]);
  }
  at += snprintf(line + at, sizeof line - (size_t)at, " strides=");
  for (unsigned i = 0; i + 1 < rank; ++i) {
    at += snprintf(line + at, sizeof line - (size_t)at, "%s%llu", i ? "," : "", strides[i]);
  }
  at += snprintf(line + at, sizeof line - (size_t)at, " box=");
  for (unsigned i = 0; i < rank; ++i) {
    at += snprintf(line + at, sizeof line - (size_t)at, "%s%u", i ? "," : "", box[i]);
  }
  at += snprintf(line + at, sizeof line - (size_t)at, " element_strides=");
  for (unsigned i = 0; i < rank; ++i) {
    at += snprintf(line + at, sizeof line - (size_t)at, "%s%u", i ? "," : "",
                   element_strides[i]);
  }
  logf_line("%s interleave=%d swizzle=%d l2=%d oob=%d", line, interleave, swizzle, l2, oob);
  const char* error = getenv("FAKE_CUDA_TMAP_ERROR");
  if (error) return atoi(error);
  memset(map, 0, 128);
  memcpy(map, &address, sizeof address);
  return 0;
}

CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void* stream, void** params,
                        void** extra) {
  const struct function* f = fn;
  if (current_ctx() != (uintptr_t)stream / 256) {
    logf_line("cuLaunchKernel %s refused: context %lu is current, the stream's is %lu", f->name,
              (unsigned long)current_ctx(), (unsigned long)((uintptr_t)stream / 256));
    return 201;
  }
  char line[1024];
  int at = snprintf(line, sizeof line, "cuLaunchKernel %s grid=%u,%u,%u block=%u,%u,%u smem=%u "
                    "stream=%#lx extra=%s params=", f->name, gx, gy, gz, bx, by, bz, smem,
                    (unsigned long)(uintptr_t)stream, extra == NULL ? "null" : "set");
  append_params(line, sizeof line, at, f->module->sizes, params);
  logf_line("%s", line);
  const char* error = getenv("FAKE_CUDA_LAUNCH_ERROR");
  return error ? atoi(error) : 0;
}
