// The plugin table of the HIP backend (backend.h): device probing and memory through the HIP
// runtime, and the operations whose kernels are shared with the CUDA backend (backends/gpu/). So far
// that is discumsum; every other operation is declined with that reason (the rest of the shared
// kernels are the next step of the port), so nothing is reported as supported that is not.
#include <hip/hip_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "expanse/backend.h"
#include "gpu/kernels/discumsum.hpp"

namespace expanse_hip {
namespace {

int g_device_count = 0;  // set by init()

void write_text(char* buf, size_t len, const std::string& text) {
  if (buf != nullptr && len > 0) std::snprintf(buf, len, "%s", text.c_str());
}

expanse_status hip_failure(hipError_t err, const char* what, char* buf, size_t len) {
  write_text(buf, len, std::string("hip: ") + what + ": " + hipGetErrorName(err) + ": " + hipGetErrorString(err));
  return err == hipErrorOutOfMemory ? EXPANSE_ERROR_OUT_OF_MEMORY : EXPANSE_ERROR_INTERNAL;
}

expanse_status init(char* err, size_t err_len) {
  int count = 0;
  const hipError_t status = hipGetDeviceCount(&count);
  if (status != hipSuccess || count == 0) {
    std::string why = "the runtime reports 0 devices";
    if (status != hipSuccess) {  // the name, and the text where it says more
      why = hipGetErrorName(status);
      if (why != hipGetErrorString(status)) why += std::string(": ") + hipGetErrorString(status);
    }
    write_text(err, err_len, "no HIP device (" + why + ")");
    (void)hipGetLastError();  // clear it, so that later calls start clean
    return EXPANSE_ERROR_BACKEND;
  }
  g_device_count = count;
  return EXPANSE_OK;
}

int32_t device_count() { return g_device_count; }

expanse_status device_info(int32_t device, expanse_device_info* info) {
  hipDeviceProp_t p{};
  if (device < 0 || device >= g_device_count || hipGetDeviceProperties(&p, device) != hipSuccess)
    return EXPANSE_ERROR_INVALID_ARGUMENT;
  std::snprintf(info->name, sizeof(info->name), "%s (%s)", p.name, p.gcnArchName);
  info->device_type = EXPANSE_DEVICE_ROCM;
  info->device_id = device;
  info->compute_major = p.major;
  info->compute_minor = p.minor;
  info->multiprocessors = p.multiProcessorCount;
  info->memory_bytes = p.totalGlobalMem;
  return EXPANSE_OK;
}

const char* op_name(expanse_op_kind kind) {
#define EXPANSE_HIP_NAME(name, NAME) #name,
  static const char* const names[] = {EXPANSE_OPERATIONS(EXPANSE_HIP_NAME)};
#undef EXPANSE_HIP_NAME
  return kind >= 0 && kind < EXPANSE_OP_COUNT ? names[kind] : "unknown op";
}

bool is_f32(const expanse_tensor* t) { return t == nullptr || t->dtype == EXPANSE_F32; }

// Empty when this backend runs the problem, else why not.
std::string declines(const expanse_op& op) {
  if (op.kind != EXPANSE_OP_DISCUMSUM)
    return std::string("the hip backend has no implementation of ") + op_name(op.kind) +
           " yet (its kernels are not yet shared with the cuda backend; use the reference or cuda backend)";
  const auto& a = *static_cast<const expanse_discumsum_args*>(op.args);
  if (op.problem->input_dtype == EXPANSE_F64) return "f64 tensors are not supported (f64 is the reference's oracle mode)";
  if (!is_f32(a.A) || !is_f32(a.Y_init) || !is_f32(a.Y)) return "A, Y_init and Y must be f32";
  return {};
}

expanse_status supports(const expanse_op* op, char* reason, size_t reason_len) {
  const std::string why = declines(*op);
  write_text(reason, reason_len, why);
  return why.empty() ? EXPANSE_OK : EXPANSE_ERROR_UNSUPPORTED;
}

expanse_status workspace_size(const expanse_op* op, size_t* bytes) {
  *bytes = 0;
  return declines(*op).empty() ? EXPANSE_OK : EXPANSE_ERROR_UNSUPPORTED;
}

expanse_status run(const expanse_op* op, const expanse_exec* exec, char* err, size_t err_len) {
  const std::string why = declines(*op);
  if (!why.empty()) {
    write_text(err, err_len, why);
    return EXPANSE_ERROR_UNSUPPORTED;
  }
  try {
    const hipError_t set = hipSetDevice(exec->device);
    if (set != hipSuccess) return hip_failure(set, "hipSetDevice", err, err_len);
    expanse_gpu::run_discumsum(*static_cast<const expanse_discumsum_args*>(op->args), op->problem->n,
                               op->problem->input_dtype, static_cast<hipStream_t>(exec->stream));
    return EXPANSE_OK;
  } catch (const std::exception& e) {
    write_text(err, err_len, std::string("hip: ") + e.what());
    return EXPANSE_ERROR_INTERNAL;
  }
}

expanse_status memory_alloc(int32_t device, size_t bytes, void** ptr, char* err, size_t err_len) {
  *ptr = nullptr;
  hipError_t e = hipSetDevice(device);
  if (e == hipSuccess) e = hipMalloc(ptr, bytes == 0 ? 1 : bytes);
  if (e != hipSuccess) {
    (void)hipGetLastError();
    return hip_failure(e, "hipMalloc", err, err_len);
  }
  return EXPANSE_OK;
}

expanse_status memory_free(int32_t device, void* ptr) {
  if (ptr == nullptr) return EXPANSE_OK;
  (void)hipSetDevice(device);
  return hipFree(ptr) == hipSuccess ? EXPANSE_OK : EXPANSE_ERROR_INTERNAL;
}

expanse_status memory_copy(int32_t device, void* dst, const void* src, size_t bytes, expanse_copy_kind kind,
                           void* stream, char* err, size_t err_len) {
  hipError_t e = hipSetDevice(device);
  const hipMemcpyKind k = kind == EXPANSE_COPY_HOST_TO_DEVICE   ? hipMemcpyHostToDevice
                          : kind == EXPANSE_COPY_DEVICE_TO_HOST ? hipMemcpyDeviceToHost
                                                                : hipMemcpyDeviceToDevice;
  if (e == hipSuccess) e = hipMemcpyAsync(dst, src, bytes, k, static_cast<hipStream_t>(stream));
  return e == hipSuccess ? EXPANSE_OK : hip_failure(e, "hipMemcpyAsync", err, err_len);
}

expanse_status synchronize(int32_t device, void* stream, char* err, size_t err_len) {
  hipError_t e = hipSetDevice(device);
  if (e == hipSuccess) e = hipStreamSynchronize(static_cast<hipStream_t>(stream));
  return e == hipSuccess ? EXPANSE_OK : hip_failure(e, "hipStreamSynchronize", err, err_len);
}

void* get_proc_address(const char*) { return nullptr; }

const expanse_backend kTable = {
    EXPANSE_BACKEND_ABI_VERSION,
    sizeof(expanse_backend),
    "hip",
    EXPANSE_DEVICE_ROCM,
    init,
    device_count,
    device_info,
    supports,
    workspace_size,
    run,
    memory_alloc,
    memory_free,
    memory_copy,
    synchronize,
    get_proc_address,
};

}  // namespace
}  // namespace expanse_hip

extern "C" EXPANSE_BACKEND_EXPORT const expanse_backend* expanse_backend_entry(void) { return &expanse_hip::kTable; }
