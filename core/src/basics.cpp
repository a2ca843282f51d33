// Small C entry points: version, names, dtype sizes, tensor construction, argument defaults.
#include <cstring>

#include "codes.hpp"
#include "errors.hpp"
#include "expanse/expanse.h"

using namespace expanse::detail;

namespace expanse::detail {

size_t dtype_size_of(int32_t dtype) {
  switch (dtype) {
    case EXPANSE_F16: case EXPANSE_BF16: return 2;
    case EXPANSE_F32: return 4;
    case EXPANSE_F64: return 8;
  }
  return 0;
}

const char* dtype_name_of(int32_t dtype) {
  switch (dtype) {
    case EXPANSE_F16: return "f16";
    case EXPANSE_BF16: return "bf16";
    case EXPANSE_F32: return "f32";
    case EXPANSE_F64: return "f64";
  }
  return "unknown";
}

}  // namespace expanse::detail

#ifndef EXPANSE_VERSION_STRING
#define EXPANSE_VERSION_STRING "0.0.0"
#endif

extern "C" {

EXPANSE_API const char* expanse_version(void) { return EXPANSE_VERSION_STRING; }

EXPANSE_API const char* expanse_status_name(expanse_status status) {
  switch (enum_code(status)) {
    case EXPANSE_OK: return "ok";
    case EXPANSE_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case EXPANSE_ERROR_UNSUPPORTED: return "unsupported";
    case EXPANSE_ERROR_BACKEND: return "backend error";
    case EXPANSE_ERROR_OUT_OF_MEMORY: return "out of memory";
    case EXPANSE_ERROR_WORKSPACE: return "workspace too small";
    case EXPANSE_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

EXPANSE_API size_t expanse_dtype_size(expanse_dtype dtype) { return dtype_size_of(enum_code(dtype)); }

EXPANSE_API const char* expanse_dtype_name(expanse_dtype dtype) { return dtype_name_of(enum_code(dtype)); }

EXPANSE_API expanse_status expanse_tensor_make(expanse_tensor* t, void* data, expanse_dtype dtype,
                                               int32_t ndim, const int64_t* shape,
                                               expanse_device_type device_type, int32_t device_id) {
  return guarded([&] {
    if (!t) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_tensor_make: argument 't' is NULL");
    if (ndim < 0 || ndim > EXPANSE_MAX_DIMS)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_tensor_make: ndim must be in 0..%d, got %d",
           EXPANSE_MAX_DIMS, ndim);
    if (ndim > 0 && !shape) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_tensor_make: argument 'shape' is NULL");
    std::memset(t, 0, sizeof(*t));
    t->data = data;
    t->dtype = enum_code(dtype);  // stored as given: validation names a bad code where it is used
    t->device_type = enum_code(device_type);
    t->device_id = device_id;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
      t->shape[i] = shape[i];
      t->strides[i] = stride;
      if (__builtin_mul_overflow(stride, shape[i] > 0 ? shape[i] : 1, &stride))
        fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_tensor_make: the element count of argument 'shape' overflows int64 (at dimension %d)", i);
    }
  });
}

}  // extern "C"

extern "C" EXPANSE_API int64_t expanse_auto_chunk_size(int64_t t) { return t <= 4096 ? 0 : 1024; }
