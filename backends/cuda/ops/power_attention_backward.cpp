// power_attention_backward on the CUDA backend: for now only the SIMT implementation every GPU backend
// shares (gpu/ops/power_attention_backward.cu); the tensor-core kernels of issue 19 go before it.
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION_BACKWARD,
                            {expanse_gpu::power_attention_backward_simple});

}  // namespace
}  // namespace expanse_cuda
