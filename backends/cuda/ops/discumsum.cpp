// discumsum on the CUDA backend: only the implementation every GPU backend shares (the scan;
// gpu/ops/discumsum.cu).
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {
namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_DISCUMSUM, {expanse_gpu::discumsum_scan});

}  // namespace
}  // namespace expanse_cuda
