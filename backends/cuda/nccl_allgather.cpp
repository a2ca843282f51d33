// The CUDA plugin's all-gather for context parallelism: NCCL's, as the extra "expanse_nccl_allgather"
// (an expanse_allgather_fn whose user pointer is the caller's ncclComm_t; docs/spec.md "Context
// parallelism"). The core knows no NCCL: a caller finds this through expanse_backend_proc. NCCL itself
// is opened at the first call (the process's libnccl.so.2, the one a framework has loaded), so that the
// plugin loads where NCCL is absent and only this extra fails there.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>  // the types of ncclAllGather

#include <cstdint>

namespace expanse_cuda {

int32_t nccl_allgather(const void* send, void* recv, size_t bytes, void* stream, void* comm) {
  using all_gather_fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  static const all_gather_fn all_gather = [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    return lib ? reinterpret_cast<all_gather_fn>(dlsym(lib, "ncclAllGather")) : nullptr;
  }();
  if (!all_gather || !comm) return 1;
  return all_gather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream)) ==
                 ncclSuccess
             ? 0
             : 1;
}

}  // namespace expanse_cuda
