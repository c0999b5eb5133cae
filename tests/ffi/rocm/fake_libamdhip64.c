/* A stand-in for AMD's HIP runtime (libamdhip64.so) that records what the ROCm handler asks of
 * it, so the handler's use of the HIP module API is tested on machines without an AMD GPU.
 *
 * Each call appends one line to the file named by $FAKE_HIP_LOG. Device i's architecture
 * (gcnArchName) is item i of the comma-separated $FAKE_HIP_ARCH, the last item for devices
 * past the list (default "gfx942:sramecc+:xnack-"). A "code object" is text:
 *   "FAKECO <gfx> params=<sizes>"   loads on a device whose architecture, without its feature
 *                                   flags, is <gfx>, else fails with hipErrorNoBinaryForGpu
 *                                   (209); <sizes> gives the kernel's parameter sizes in
 *                                   bytes, e.g. "884" for two pointers and an int (what the
 *                                   launch logs)
 * Modules load into the calling thread's current device: device 0 until hipSetDevice. A
 * stream's device is its value divided by 256, less one (stream 0x100 -> device 0, 0x200 ->
 * device 1); stream 0xdead has none, nor has device 9 properties. The function "missing" is
 * not found; $FAKE_HIP_LAUNCH_ERROR makes launches fail with that code. */
#define FAKE_LOG_ENV "FAKE_HIP_LOG"
#include "fake_driver_log.h"

typedef int hipError_t;

struct module {
  int device;
  char sizes[64];
};

static int g_device = 0;

hipError_t hipInit(unsigned flags) {
  logf_line("hipInit %u", flags);
  return 0;
}

const char* hipGetErrorName(hipError_t r) {
  return r == 209   ? "hipErrorNoBinaryForGpu"
         : r == 101 ? "hipErrorInvalidDevice"
         : r == 400 ? "hipErrorInvalidHandle"
         : r == 500 ? "hipErrorNotFound"
         : r == 701 ? "hipErrorLaunchOutOfResources"
                    : "hipErrorInvalidValue";
}

const char* hipGetErrorString(hipError_t r) {
  return r == 701 ? "too many resources requested for launch" : "fake runtime error";
}

hipError_t hipGetDevice(int* device) {
  *device = g_device;
  return 0;
}

hipError_t hipSetDevice(int device) {
  logf_line("hipSetDevice %d", device);
  g_device = device;
  return 0;
}

hipError_t hipStreamGetDevice(void* stream, int* device) {
  if ((uintptr_t)stream == 0xdead) return 400;
  *device = (int)((uintptr_t)stream / 256) - 1;
  logf_line("hipStreamGetDevice stream=%#lx device=%d", (unsigned long)(uintptr_t)stream,
            *device);
  return 0;
}

/* Device `device`'s gcnArchName into `out`. */
static void arch_of(int device, char out[256]) {
  const char* list = getenv("FAKE_HIP_ARCH");
  if (list == NULL || *list == '\0') list = "gfx942:sramecc+:xnack-";
  for (int i = 0; i < device && strchr(list, ',') != NULL; ++i) list = strchr(list, ',') + 1;
  const size_t n = strcspn(list, ",");
  snprintf(out, 256, "%.*s", (int)(n < 255 ? n : 255), list);
}

/* hipDeviceProp_tR0600: 1472 bytes, of which gcnArchName[256] is at byte 1160. */
hipError_t hipGetDevicePropertiesR0600(void* prop, int device) {
  if (device == 9) return 101; /* hipErrorInvalidDevice */
  memset(prop, 0, 1472);
  arch_of(device, (char*)prop + 1160);
  logf_line("hipGetDevicePropertiesR0600 device=%d gcnArchName=%s", device,
            (const char*)prop + 1160);
  return 0;
}

hipError_t hipModuleLoadData(void** module, const void* image) {
  const char* text = (const char*)image;
  if (strncmp(text, "FAKECO ", 7) != 0) return 1;
  const char* sizes = strstr(text, "params=");
  char arch[256];
  arch_of(g_device, arch);
  arch[strcspn(arch, ":")] = '\0';
  const size_t n = strlen(arch);
  if (sizes == NULL || strncmp(text + 7, arch, n) != 0 || text[7 + n] != ' ') {
    logf_line("hipModuleLoadData device=%d refused", g_device);
    return 209;
  }
  struct module* m = calloc(1, sizeof *m);
  m->device = g_device;
  snprintf(m->sizes, sizeof m->sizes, "%s", sizes + 7);
  *module = m;
  logf_line("hipModuleLoadData device=%d", g_device);
  return 0;
}

hipError_t hipModuleGetFunction(void** fn, void* module, const char* name) {
  return get_function("hipModuleGetFunction", fn, module, name);
}

hipError_t hipModuleLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned smem, void* stream,
                                 void** params, void** extra) {
  const struct function* f = fn;
  const int stream_device = (int)((uintptr_t)stream / 256) - 1;
  if (f->module->device != stream_device) {
    /* A function of another device's module: the real runtime fails such a launch. */
    logf_line("hipModuleLaunchKernel %s refused: module of device %d, stream of device %d",
              f->name, f->module->device, stream_device);
    return 400;
  }
  char line[1024];
  int at = snprintf(line, sizeof line, "hipModuleLaunchKernel %s grid=%u,%u,%u "
                    "block=%u,%u,%u smem=%u stream=%#lx extra=%s params=", f->name, gx, gy, gz,
                    bx, by, bz, smem, (unsigned long)(uintptr_t)stream,
                    extra == NULL ? "null" : "set");
  append_params(line, sizeof line, at, f->module->sizes, params);
  logf_line("%s", line);
  const char* error = getenv("FAKE_HIP_LAUNCH_ERROR");
  return error ? atoi(error) : 0;
}
