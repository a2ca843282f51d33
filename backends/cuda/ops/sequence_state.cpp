// sequence_state on the CUDA backend: the composition every GPU backend shares (gpu/ops/sequence_state.cu),
// whose update_state and discumsum steps run through their CUDA lists.
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_SEQUENCE_STATE, {expanse_gpu::sequence_state_chunked});

}  // namespace
}  // namespace expanse_cuda
