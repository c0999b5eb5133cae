/* What the recording stand-ins for the GPU vendors' libraries (cuda/fake_libcuda.c,
 * rocm/fake_libamdhip64.c) share: the call log, kernel handles and the launch's parameters
 * as the kernel's declared sizes read them. Define FAKE_LOG_ENV (the environment variable
 * naming the log file) before including this. */
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_LOG_ENV
#error "define FAKE_LOG_ENV (the variable naming the log file) before including fake_driver_log.h"
#endif

/* One line appended to the log (nothing when the variable is unset). */
__attribute__((format(printf, 1, 2))) static void logf_line(const char* fmt, ...) {
  const char* path = getenv(FAKE_LOG_ENV);
  if (path == NULL) return;
  FILE* f = fopen(path, "a");
  if (f == NULL) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

struct module; /* each stand-in's own: it holds at least the kernel's parameter sizes */
struct function {
  struct module* module;
  char name[64];
};

/* A module's kernel `name` (`call` is the API function, for the log); error 500 (not found)
 * for the function "missing". */
static int get_function(const char* call, void** fn, void* module, const char* name) {
  logf_line("%s %s", call, name);
  if (strcmp(name, "missing") == 0) return 500;
  struct function* f = calloc(1, sizeof *f);
  f->module = module;
  snprintf(f->name, sizeof f->name, "%s", name);
  *fn = f;
  return 0;
}

/* Appends the launch's parameters to `line` (of `cap` bytes, `at` used), each read with the
 * size the kernel declares (`sizes`, one digit per parameter, or 'm' for a 128-byte tensor
 * map, of which the first 8 bytes are logged), as the driver reads them. */
static void append_params(char* line, size_t cap, int at, const char* sizes, void** params) {
  for (const char* s = sizes; (*s >= '1' && *s <= '8') || *s == 'm'; ++s) {
    uint64_t v = 0;
    memcpy(&v, params[s - sizes], *s == 'm' ? 8 : (size_t)(*s - '0'));
    at += snprintf(line + at, cap - (size_t)at, "%s%#llx", s == sizes ? "" : ",",
                   (unsigned long long)v);
  }
}
