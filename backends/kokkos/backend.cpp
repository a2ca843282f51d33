// The plugin table of the Kokkos backend (backend.h): one device per served execution space
// (spaces.hpp), Kokkos initialized by init() unless the process already did, memory through Kokkos,
// and each validated operation handed to the dispatcher (backends/sdk/) on this backend's lists
// (lists.cpp).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "kokkos/lists.hpp"
#include "kokkos/spaces.hpp"
#include "sdk/op_args.hpp"

namespace expanse_kokkos {
namespace {

using expanse_sdk::device_props;
using expanse_sdk::write_text;
using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

expanse_status init(char* err, size_t err_len) {
  if (kSpaceCount == 0) {
    write_text(err, err_len, "this Kokkos build has no execution space the backend can serve");
    return EXPANSE_ERROR_BACKEND;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  // Kokkos::initialize is not fit to fail (it takes the first of the visible devices): ask first.
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    (void)cudaGetLastError();
    write_text(err, err_len, "this Kokkos build serves its Cuda space and no CUDA device is visible");
    return EXPANSE_ERROR_BACKEND;
  }
#elif defined(KOKKOS_ENABLE_HIP)
  int gpus = 0;
  if (hipGetDeviceCount(&gpus) != hipSuccess || gpus == 0) {
    (void)hipGetLastError();
    write_text(err, err_len, "this Kokkos build serves its HIP space and no HIP device is visible");
    return EXPANSE_ERROR_BACKEND;
  }
#endif
  try {
    // A process that uses Kokkos itself initializes it first; otherwise it is ours to set up, and to
    // finalize at exit (before Kokkos' own static objects go: handlers run in reverse order).
    if (!Kokkos::is_initialized()) {
      Kokkos::initialize();
      std::atexit([] {
        if (Kokkos::is_initialized()) Kokkos::finalize();
      });
    }
  } catch (const std::exception& e) {
    write_text(err, err_len, std::string("Kokkos::initialize failed: ") + e.what());
    return EXPANSE_ERROR_BACKEND;
  }
  return EXPANSE_OK;
}

int32_t device_count() { return kSpaceCount; }

expanse_status device_info(int32_t device, expanse_device_info* info) {
  if (device < 0 || device >= kSpaceCount) return EXPANSE_ERROR_INVALID_ARGUMENT;
  with_space(device, [&](auto space) {
    using Space = decltype(space);
    std::snprintf(info->name, sizeof(info->name), "Kokkos %s (Kokkos %d.%d.%d)", Space::name(), KOKKOS_VERSION / 10000,
                  KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100);
    info->multiprocessors = Space().concurrency();
  });
  info->device_type = kDeviceType;
  info->device_id = device;
  info->compute_major = info->compute_minor = 0;
  info->memory_bytes = 0;
#if defined(KOKKOS_ENABLE_CUDA)
  // The GPU's own figures: a Cuda space's concurrency() counts threads in flight, not SMs.
  cudaDeviceProp prop{};
  int gpu = 0;
  if (cudaGetDevice(&gpu) == cudaSuccess && cudaGetDeviceProperties(&prop, gpu) == cudaSuccess) {
    info->multiprocessors = prop.multiProcessorCount;
    info->compute_major = prop.major;
    info->compute_minor = prop.minor;
    info->memory_bytes = prop.totalGlobalMem;
  }
#elif defined(KOKKOS_ENABLE_HIP)
  hipDeviceProp_t prop{};
  int gpu = 0;
  if (hipGetDevice(&gpu) == hipSuccess && hipGetDeviceProperties(&prop, gpu) == hipSuccess) {
    info->multiprocessors = prop.multiProcessorCount;
    info->memory_bytes = prop.totalGlobalMem;
  }
#else
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) info->memory_bytes = uint64_t(pages) * uint64_t(page);
#endif
  return EXPANSE_OK;
}

device_props props_of(int32_t device) {
  device_props p;
  if (device >= 0 && device < kSpaceCount) with_space(device, [&](auto space) { p.multiprocessors = space.concurrency(); });
  return p;
}

expanse_status supports(const expanse_op* op, char* reason, size_t reason_len) {
  return kokkos_dispatcher().supports(*op, props_of(expanse_sdk::device_of(*op)), reason, reason_len);
}

expanse_status workspace_size(const expanse_op* op, size_t* bytes) {
  return kokkos_dispatcher().workspace_size(*op, props_of(expanse_sdk::device_of(*op)), bytes);
}

expanse_status run(const expanse_op* op, const expanse_exec* exec, char* err, size_t err_len) {
  return kokkos_dispatcher().run(*op, props_of(exec->device), *exec, err, err_len);
}

expanse_status memory_alloc(int32_t device, size_t bytes, void** ptr, char* err, size_t err_len) {
  *ptr = nullptr;
  try {
    with_space(device, [&](auto space) {
      *ptr = Kokkos::kokkos_malloc<typename decltype(space)::memory_space>("expanse", bytes == 0 ? 1 : bytes);
    });
  } catch (const std::exception& e) {
    write_text(err, err_len, std::string("kokkos: kokkos_malloc of ") + std::to_string(bytes) + " bytes: " + e.what());
    return EXPANSE_ERROR_OUT_OF_MEMORY;
  }
  return EXPANSE_OK;
}

expanse_status memory_free(int32_t device, void* ptr) {
  if (ptr == nullptr) return EXPANSE_OK;
  with_space(device, [&](auto space) { Kokkos::kokkos_free<typename decltype(space)::memory_space>(ptr); });
  return EXPANSE_OK;
}

expanse_status memory_copy(int32_t device, void* dst, const void* src, size_t bytes, expanse_copy_kind kind,
                           void* stream, char* err, size_t err_len) {
  try {
    with_space(device, [&](auto tag) {
      using Space = decltype(tag);
      using memory = typename Space::memory_space;
      using bytes_in = Kokkos::View<char*, memory, unmanaged>;
      using host_bytes = Kokkos::View<char*, Kokkos::HostSpace, unmanaged>;
      const Space space = instance_for<Space>(stream);
      char* to = static_cast<char*>(dst);
      char* from = static_cast<char*>(const_cast<void*>(src));
      if (kind == EXPANSE_COPY_HOST_TO_DEVICE) Kokkos::deep_copy(space, bytes_in(to, bytes), host_bytes(from, bytes));
      else if (kind == EXPANSE_COPY_DEVICE_TO_HOST) Kokkos::deep_copy(space, host_bytes(to, bytes), bytes_in(from, bytes));
      else Kokkos::deep_copy(space, bytes_in(to, bytes), bytes_in(from, bytes));
    });
  } catch (const std::exception& e) {
    write_text(err, err_len, std::string("kokkos: deep_copy: ") + e.what());
    return EXPANSE_ERROR_INTERNAL;
  }
  return EXPANSE_OK;
}

expanse_status synchronize(int32_t device, void* stream, char* err, size_t err_len) {
  try {
    with_space(device, [&](auto tag) { instance_for<decltype(tag)>(stream).fence(); });
  } catch (const std::exception& e) {
    write_text(err, err_len, std::string("kokkos: fence: ") + e.what());
    return EXPANSE_ERROR_INTERNAL;
  }
  return EXPANSE_OK;
}

// power_attention's form and chunk size for EXPANSE_CHUNK_AUTO. Per query head and token, the quadratic
// form visits t / 2 keys and the chunked form c / 2 keys plus the state products D e (1 + 1/r); a key
// (a dot product, log, exp and an update of e sums, one thread per query) costs what about
// 2.5 (d + e + 40) multiply-adds of the state's tile products do. Measured on the Serial space
// (one core): P1 bf16 quadratic 0.40 s and c = 128 0.60 s at t = 1024, 1.60 s and 1.18 s at t = 2048
// (the model's crossover: t = 1395); the README demo (d = e = 32, t = 512) 29.8 ms and 27.5 ms
// (crossover 388). On a GPU space the team kernels' pairs cost far more against the state products:
// on an H100 (Kokkos 4.6.1, Cuda, P1) the quadratic form lost at every length measured (t = 512:
// 5.31 ms against 4.73 at c = 256; t = 1024: 10.8 against 4.7 at c = 128), and c = 128 was the best
// chunk at t = 4096 and 16384 (13.6 and 44.7 ms; 64: 13.7 and 48.4; 256: 15.2 and 50.0).
int64_t choose_chunk_size(const expanse_problem* pb) {
  constexpr int64_t kChunk = 128;
  if (kDeviceType != EXPANSE_DEVICE_CPU) return kChunk;
  const double r = pb->h > 0 ? double(pb->hq) / double(pb->h) : 1.0;
  const double state = double(pb->D) * double(pb->e) * (1.0 + 1.0 / r);
  const double key = 2.5 * double(pb->d + pb->e + 40);
  return double(pb->t) < double(kChunk) + 2.0 * state / key ? 0 : kChunk;
}

void* get_proc_address(const char* name) {
  if (std::string(name) == EXPANSE_CHOOSE_CHUNK_SIZE_PROC) return reinterpret_cast<void*>(&choose_chunk_size);
  return nullptr;
}

const expanse_backend kTable = {
    EXPANSE_BACKEND_ABI_VERSION,
    sizeof(expanse_backend),
    "kokkos",
    kDeviceType,
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
}  // namespace expanse_kokkos

extern "C" EXPANSE_BACKEND_EXPORT const expanse_backend* expanse_backend_entry(void) { return &expanse_kokkos::kTable; }
