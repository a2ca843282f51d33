// power_attention on the CUDA backend: only the implementation every GPU backend shares (the chunked algorithm, each step through its own list;
// gpu/ops/power_attention.cu).
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION, {expanse_gpu::power_attention_chunked});

}  // namespace
}  // namespace expanse_cuda
