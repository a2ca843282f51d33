// sympow_expand on the CUDA backend: only the implementation every GPU backend shares (the SIMT kernel;
// gpu/ops/sympow_expand.cu).
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_SYMPOW_EXPAND, {expanse_gpu::sympow_expand_simple});

}  // namespace
}  // namespace expanse_cuda
