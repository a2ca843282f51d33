// The backward operations of the core operations on the CUDA backend that have only the SIMT
// implementations every GPU backend shares (gpu/ops/). power_attention_backward's and
// update_state_backward's lists are in ops/<operation>.cu, with their tensor-core implementations.
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kDiscumsum(cuda_lists(), EXPANSE_OP_DISCUMSUM_BACKWARD, {expanse_gpu::discumsum_backward_simple});
const registered_list kQueryState(cuda_lists(), EXPANSE_OP_QUERY_STATE_BACKWARD,
                                  {expanse_gpu::query_state_backward_simple});
const registered_list kChunkAttention(cuda_lists(), EXPANSE_OP_CHUNK_ATTENTION_BACKWARD,
                                      {expanse_gpu::chunk_attention_backward_simple});

}  // namespace
}  // namespace expanse_cuda
