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

// log2(e): the gate sums are natural logs, the kernels take their exponentials as 2^(log2(e) x).
constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the special-function unit (ex2.approx: relative error about 2^-22; 2^-inf = 0), where
// exp2f adds range handling the callers do not need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2(|x| 2^24) by the special-function unit, for every finite x: lg2.approx.ftz flushes subnormal
// inputs to 0 (log -inf), so |x| is scaled by 2^24 first and held below FLT_MAX; the caller takes
// the 24 off where it is cheapest. (__log2f spent four instructions per call on the same range
// handling: a third of the flash kernel's score terms.)
constexpr float kLog2AbsOffset = 24.f;
__device__ __forceinline__ float log2_abs_offset(float x) {
  const float scaled = fminf(fabsf(x) * 16777216.f, 3.40282347e38f);
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(scaled));
  return y;
}

// The byte offset of 16-byte chunk c of row r in a swizzled tile of `row_bytes` rows (128 or 64):
// bits 4.. of the address XOR its bits 7.. (the hardware's swizzle, anchored at 1024 bytes).
__host__ __device__ constexpr uint32_t swizzled_row_offset(uint32_t r, uint32_t c, uint32_t row_bytes) {
  const uint32_t linear = r * row_bytes + c * 16;
  return linear ^ (((linear >> 7) & (row_bytes / 16 - 1)) << 4);
}

// 2^k as a float, exactly, for -126 <= k <= 127 (the exponent field alone).
__device__ __forceinline__ float pow2_of(int k) { return __int_as_float((k + 127) << 23); }

}  // namespace expanse_cuda
