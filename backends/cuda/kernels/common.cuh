// Device helpers of the NVIDIA-only kernels (sm80/, sm90/), on top of the ones every GPU kernel
// shares (gpu/kernels/common.hpp), whose names the CUDA backend uses unqualified.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels/common.hpp"

namespace expanse_cuda {

using namespace expanse_gpu;

// 2^x by the special-function unit (ex2.approx: relative error about 2^-22; 2^-inf = 0), where
// exp2f adds range handling the callers do not need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^k as a float, exactly, for -126 <= k <= 127 (the exponent field alone).
__device__ __forceinline__ float pow2_of(int k) { return __int_as_float((k + 127) << 23); }

}  // namespace expanse_cuda
