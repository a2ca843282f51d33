// Whether this module's sm_90a code is what a compute capability 9.0 device runs (the Hopper
// implementations need it: wgmma, TMA and clusters exist only in sm_90a code).
#include "dispatch.hpp"

namespace expanse_cuda {
namespace {

// An empty kernel whose loaded code tells which architecture this module was built for on a device.
__global__ void probe_architecture_kernel() {}

}  // namespace

bool sm90a_code_loads() {
#ifndef EXPANSE_CUDA_HAS_SM90A  // set by CMake when the architectures include 90a
  return false;
#else
  // Evaluated once, on the device current at the first call (a compute capability 9.0 one): the code
  // loaded for it is sm_90a's (binary version 90), not a newer architecture's PTX compiled at load time.
  static const bool present = [] {
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, probe_architecture_kernel) == cudaSuccess &&
           attributes.binaryVersion == 90;
  }();
  return present;
#endif
}

}  // namespace expanse_cuda
