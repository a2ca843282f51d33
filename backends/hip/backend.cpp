// The plugin table of the HIP backend (backend.h): device probing and memory through the HIP
// runtime, and the entry points that hand each validated operation to the dispatcher (backends/sdk/)
// on this backend's lists (lists.cpp: the implementations shared with the CUDA backend, gpu/ops/).
#include <hip/hip_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hip/lists.hpp"
#include "sdk/op_args.hpp"

namespace expanse_hip {
namespace {

using expanse_sdk::device_props;
using expanse_sdk::write_text;

std::vector<device_props> g_props;  // filled by init()

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
  g_props.assign(static_cast<size_t>(count), device_props{});
  for (int i = 0; i < count; ++i) {
    hipDeviceProp_t p{};
    if (hipGetDeviceProperties(&p, i) != hipSuccess) continue;
    g_props[i].arch_major = p.major;
    g_props[i].arch_minor = p.minor;
    g_props[i].multiprocessors = p.multiProcessorCount;
    g_props[i].smem_optin = p.sharedMemPerBlock;
  }
  return EXPANSE_OK;
}

int32_t device_count() { return static_cast<int32_t>(g_props.size()); }

expanse_status device_info(int32_t device, expanse_device_info* info) {
  hipDeviceProp_t p{};
  if (device < 0 || device >= device_count() || hipGetDeviceProperties(&p, device) != hipSuccess)
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

device_props props_of(int32_t device) {
  return device >= 0 && device < device_count() ? g_props[static_cast<size_t>(device)] : device_props{};
}

expanse_status supports(const expanse_op* op, char* reason, size_t reason_len) {
  return hip_dispatcher().supports(*op, props_of(expanse_sdk::device_of(*op)), reason, reason_len);
}

expanse_status workspace_size(const expanse_op* op, size_t* bytes) {
  return hip_dispatcher().workspace_size(*op, props_of(expanse_sdk::device_of(*op)), bytes);
}

expanse_status run(const expanse_op* op, const expanse_exec* exec, char* err, size_t err_len) {
  const hipError_t set = hipSetDevice(exec->device);
  if (set != hipSuccess) return hip_failure(set, "hipSetDevice", err, err_len);
  return hip_dispatcher().run(*op, props_of(exec->device), *exec, err, err_len);
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

// No extras yet: EXPANSE_CHUNK_AUTO takes the core's default rule (expanse_auto_chunk_size) until the
// chunk size is measured on AMD hardware.
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
