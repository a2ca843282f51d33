/* Test-only backend modules for the plugin loader's failure paths. One source, built several times
 * with a different TEST_PLUGIN_KIND:
 *   1 "testnull": loads, has one CPU device, declines every operation (with a reason)
 *   2 "wrongabi": built for another plugin ABI version
 *   3 "nodevice": its init reports that no device was found
 *   4 (no entry point): not an expanse backend at all */
#include <stdio.h>
#include <string.h>

#include "expanse/backend.h"

#ifndef TEST_PLUGIN_KIND
#error "define TEST_PLUGIN_KIND"
#endif

#if TEST_PLUGIN_KIND != 4

static expanse_status init(char* err, size_t err_len) {
#if TEST_PLUGIN_KIND == 3
  snprintf(err, err_len, "no test device present");
  return EXPANSE_ERROR_BACKEND;
#else
  (void)err; (void)err_len;
  return EXPANSE_OK;
#endif
}
static int32_t device_count(void) { return 1; }
static expanse_status device_info(int32_t device, expanse_device_info* info) {
  snprintf(info->name, sizeof(info->name), "test device");
  info->device_type = EXPANSE_DEVICE_CPU;
  info->device_id = device;
  return EXPANSE_OK;
}
static expanse_status supports(const expanse_op* op, char* reason, size_t reason_len) {
  snprintf(reason, reason_len, "the test plugin implements no operation (asked for %s, p=%d)",
           expanse_op_name(op->kind), op->problem->p);
  return EXPANSE_ERROR_UNSUPPORTED;
}
static expanse_status workspace_size(const expanse_op* op, size_t* bytes) { (void)op; *bytes = 0; return EXPANSE_OK; }
static expanse_status run(const expanse_op* op, const expanse_exec* exec, char* err, size_t err_len) {
  (void)op; (void)exec;
  snprintf(err, err_len, "unreachable");
  return EXPANSE_ERROR_INTERNAL;
}
static expanse_status alloc(int32_t device, size_t bytes, void** ptr, char* err, size_t err_len) {
  (void)device; (void)bytes; (void)err; (void)err_len;
  *ptr = NULL;
  return EXPANSE_ERROR_OUT_OF_MEMORY;
}
static expanse_status release(int32_t device, void* ptr) { (void)device; (void)ptr; return EXPANSE_OK; }
static expanse_status copy(int32_t device, void* dst, const void* src, size_t bytes, expanse_copy_kind kind,
                           void* stream, char* err, size_t err_len) {
  (void)device; (void)kind; (void)stream; (void)err; (void)err_len;
  memcpy(dst, src, bytes);
  return EXPANSE_OK;
}
static expanse_status sync(int32_t device, void* stream, char* err, size_t err_len) {
  (void)device; (void)stream; (void)err; (void)err_len;
  return EXPANSE_OK;
}
static void* proc(const char* name) { (void)name; return NULL; }

#if TEST_PLUGIN_KIND == 2
#define ABI (EXPANSE_BACKEND_ABI_VERSION + 100u)
#else
#define ABI EXPANSE_BACKEND_ABI_VERSION
#endif

static const expanse_backend table = {
    ABI, sizeof(expanse_backend), TEST_PLUGIN_NAME, EXPANSE_DEVICE_CPU, init, device_count, device_info,
    supports, workspace_size, run, alloc, release, copy, sync, proc};

EXPANSE_BACKEND_EXPORT const expanse_backend* expanse_backend_entry(void) { return &table; }

#else
EXPANSE_BACKEND_EXPORT int not_a_backend(void) { return 42; }
#endif
