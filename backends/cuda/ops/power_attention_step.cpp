// power_attention_step on the CUDA backend: the implementations every GPU backend shares, streamed
// then fused (one pass over the state each; gpu/ops/power_attention_step.cu).
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION_STEP,
                            {expanse_gpu::power_attention_step_streamed, expanse_gpu::power_attention_step_fused});

}  // namespace
}  // namespace expanse_cuda
