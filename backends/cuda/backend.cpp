// The plugin table of the CUDA backend (backend.h): device probing, memory, and the entry points
// that hand each validated operation to the dispatcher (dispatch.hpp, backends/sdk/).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch.hpp"

namespace expanse_cuda {

#ifdef EXPANSE_CUDA_NCCL
int32_t nccl_allgather(const void* send, void* recv, size_t bytes, void* stream, void* comm);  // nccl_allgather.cpp
#endif

namespace {

std::vector<device_props> g_props;  // filled by init()

using expanse_sdk::write_text;

expanse_status cuda_failure(cudaError_t err, const char* what, char* buf, size_t len) {
  write_text(buf, len, std::string("cuda: ") + what + ": " + cudaGetErrorString(err));
  return err == cudaErrorMemoryAllocation ? EXPANSE_ERROR_OUT_OF_MEMORY : EXPANSE_ERROR_INTERNAL;
}

expanse_status init(char* err, size_t err_len) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    write_text(err, err_len, std::string("no CUDA device (") +
                                 (status != cudaSuccess ? cudaGetErrorString(status) : "the driver reports 0 devices") + ")");
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return EXPANSE_ERROR_BACKEND;
  }
  g_props.assign(static_cast<size_t>(count), device_props{});
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    g_props[i].arch_major = p.major;
    g_props[i].arch_minor = p.minor;
    g_props[i].multiprocessors = p.multiProcessorCount;
    g_props[i].smem_optin = p.sharedMemPerBlockOptin;
    if (p.major >= 8) g_props[i].features |= kMmaSync;
  }
  return EXPANSE_OK;
}

int32_t device_count() { return static_cast<int32_t>(g_props.size()); }

expanse_status device_info(int32_t device, expanse_device_info* info) {
  cudaDeviceProp p{};
  if (device < 0 || device >= device_count() || cudaGetDeviceProperties(&p, device) != cudaSuccess)
    return EXPANSE_ERROR_INVALID_ARGUMENT;
  std::snprintf(info->name, sizeof(info->name), "%s", p.name);
  info->device_type = EXPANSE_DEVICE_CUDA;
  info->device_id = device;
  info->compute_major = p.major;
  info->compute_minor = p.minor;
  info->multiprocessors = p.multiProcessorCount;
  info->memory_bytes = p.totalGlobalMem;
  return EXPANSE_OK;
}

// The properties of a device. kSm90a is found at the first call on a compute capability 9.0 device
// (asking which code a device loads creates a context, which `expanse info` should not).
device_props props_of(int32_t device) {
  if (device < 0 || device >= device_count()) return device_props{};
  device_props props = g_props[static_cast<size_t>(device)];
  if (props.arch_major == 9 && props.arch_minor == 0 && sm90a_code_loads()) props.features |= kSm90a;
  return props;
}

expanse_status supports(const expanse_op* op, char* reason, size_t reason_len) {
  return cuda_dispatcher().supports(*op, props_of(expanse_sdk::device_of(*op)), reason, reason_len);
}

expanse_status workspace_size(const expanse_op* op, size_t* bytes) {
  return cuda_dispatcher().workspace_size(*op, props_of(expanse_sdk::device_of(*op)), bytes);
}

expanse_status run(const expanse_op* op, const expanse_exec* exec, char* err, size_t err_len) {
  const cudaError_t set = cudaSetDevice(exec->device);
  if (set != cudaSuccess) return cuda_failure(set, "cudaSetDevice", err, err_len);
  return cuda_dispatcher().run(*op, props_of(exec->device), *exec, err, err_len);
}

// The one-pass forms of expanse_power_attention_exchange and expanse_power_attention_backward_exchange
// (backend.h): the chosen implementation's run_exchanging.
expanse_status run_exchanging(const expanse_op* op, const expanse_exec* exec, expanse_exchange_fn exchange,
                                 void* user, char* err, size_t err_len) {
  const cudaError_t set = cudaSetDevice(exec->device);
  if (set != cudaSuccess) return cuda_failure(set, "cudaSetDevice", err, err_len);
  const expanse_sdk::exchange_call call{exchange, user};
  return cuda_dispatcher().run(*op, props_of(exec->device), *exec, err, err_len, &call);
}

expanse_status memory_alloc(int32_t device, size_t bytes, void** ptr, char* err, size_t err_len) {
  *ptr = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMalloc(ptr, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda_failure(e, "cudaMalloc", err, err_len);
  }
  return EXPANSE_OK;
}

expanse_status memory_free(int32_t device, void* ptr) {
  if (ptr == nullptr) return EXPANSE_OK;
  cudaSetDevice(device);
  return cudaFree(ptr) == cudaSuccess ? EXPANSE_OK : EXPANSE_ERROR_INTERNAL;
}

expanse_status memory_copy(int32_t device, void* dst, const void* src, size_t bytes, expanse_copy_kind kind,
                           void* stream, char* err, size_t err_len) {
  cudaError_t e = cudaSetDevice(device);
  const cudaMemcpyKind k = kind == EXPANSE_COPY_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                           : kind == EXPANSE_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                                 : cudaMemcpyDeviceToDevice;
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? EXPANSE_OK : cuda_failure(e, "cudaMemcpyAsync", err, err_len);
}

expanse_status synchronize(int32_t device, void* stream, char* err, size_t err_len) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? EXPANSE_OK : cuda_failure(e, "cudaStreamSynchronize", err, err_len);
}

// Extras by name: device timing with CUDA events, for `expanse bench`; the chunk size of
// EXPANSE_CHUNK_AUTO (chunk_choice.cpp); the one-pass exchanging calls (run_exchanging above);
// NCCL's all-gather where built with it.
int timer_elapsed_ms(void* stream, void (*body)(void*), void* user, int reps, float* ms_out);

void* get_proc_address(const char* name) {
  if (std::strcmp(name, "expanse_timed_runs") == 0) return reinterpret_cast<void*>(&timer_elapsed_ms);
#ifdef EXPANSE_CUDA_NCCL
  if (std::strcmp(name, "expanse_nccl_allgather") == 0) return reinterpret_cast<void*>(&nccl_allgather);
#endif
  if (std::strcmp(name, EXPANSE_CHOOSE_CHUNK_SIZE_PROC) == 0) return reinterpret_cast<void*>(&choose_chunk_size);
  if (std::strcmp(name, EXPANSE_FORWARD_EXCHANGE_PROC) == 0 || std::strcmp(name, EXPANSE_BACKWARD_EXCHANGE_PROC) == 0)
    return reinterpret_cast<void*>(&run_exchanging);
  return nullptr;
}

// Times `reps` calls of body(user) one by one with a pair of CUDA events around each, on `stream`;
// writes the milliseconds of each into ms_out. Returns 0 on success.
int timer_elapsed_ms(void* stream, void (*body)(void*), void* user, int reps, float* ms_out) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return 1;
  if (cudaEventCreate(&stop) != cudaSuccess) return 1;
  int rc = 0;
  for (int i = 0; i < reps && rc == 0; ++i) {
    cudaEventRecord(start, s);
    body(user);
    cudaEventRecord(stop, s);
    if (cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms_out[i], start, stop) != cudaSuccess) rc = 1;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return rc;
}

const expanse_backend kTable = {
    EXPANSE_BACKEND_ABI_VERSION,
    sizeof(expanse_backend),
    "cuda",
    EXPANSE_DEVICE_CUDA,
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
}  // namespace expanse_cuda

extern "C" EXPANSE_BACKEND_EXPORT const expanse_backend* expanse_backend_entry(void) { return &expanse_cuda::kTable; }
