// The tcgen05 kernels (kernels/sm100) built for sm_100a so that they keep compiling: they are in no
// implementation list (no Blackwell device is lent here to run them), so this object is built and
// not linked into the plugin (backends/cuda/CMakeLists.txt).
#include "kernels/sm100/tcgen05_update_state.cuh"

namespace expanse_cuda {

template __global__ void tcgen05_update_state_kernel<__nv_bfloat16, 64, 64>(mma_update_state_params);
template __global__ void tcgen05_update_state_kernel<__half, 64, 64>(mma_update_state_params);

}  // namespace expanse_cuda
