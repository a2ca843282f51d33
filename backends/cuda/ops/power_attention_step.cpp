// power_attention_step on the CUDA backend: the implementations every GPU backend shares, for one
// token streamed then fused, for a few tokens tokens (one pass over the state each), for any number
// attention (power_attention through the list; gpu/ops/power_attention_step.cu).
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION_STEP,
                            {expanse_gpu::power_attention_step_streamed, expanse_gpu::power_attention_step_fused,
                             expanse_gpu::power_attention_step_tokens, expanse_gpu::power_attention_step_attention});

}  // namespace
}  // namespace expanse_cuda
