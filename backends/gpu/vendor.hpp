// The one place where CUDA and HIP differ for the GPU code both backends share (backends/gpu/): the
// runtime header, the 16-bit float types and their conversions, the stream and error calls, the
// shuffles and the width of a warp. Everything under backends/gpu/ is written against these names
// only, and compiled by nvcc into libexpanse-cuda.so and by hipcc into libexpanse-hip.so.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_bfloat16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <stdexcept>
#include <string>

namespace expanse_gpu {

#if defined(__HIPCC__)
using stream_t = hipStream_t;
using error_t = hipError_t;
using half_t = __half;
using bfloat16_t = hip_bfloat16;  // ROCm 5.2 has no __hip_bfloat16 yet
constexpr int kWarpSize = 64;  // a wavefront of CDNA (gfx90a, gfx94x)
inline error_t last_error() { return hipGetLastError(); }
inline bool failed(error_t e) { return e != hipSuccess; }
inline const char* error_text(error_t e) { return hipGetErrorString(e); }
inline error_t memset_async(void* p, int value, size_t bytes, stream_t s) { return hipMemsetAsync(p, value, bytes, s); }
__device__ __forceinline__ float bf16_to_f32(bfloat16_t x) { return static_cast<float>(x); }
__device__ __forceinline__ bfloat16_t f32_to_bf16(float x) { return bfloat16_t(x); }  // rounds to nearest even
// x from the lane `lane ^ mask` of the same lane group (a wavefront holds two groups).
__device__ __forceinline__ float shfl_xor_group(float x, int mask) { return __shfl_xor(x, mask, 32); }
__device__ __forceinline__ double shfl_xor_group(double x, int mask) { return __shfl_xor(x, mask, 32); }
#else
using stream_t = cudaStream_t;
using error_t = cudaError_t;
using half_t = __half;
using bfloat16_t = __nv_bfloat16;
constexpr int kWarpSize = 32;
inline error_t last_error() { return cudaGetLastError(); }
inline bool failed(error_t e) { return e != cudaSuccess; }
inline const char* error_text(error_t e) { return cudaGetErrorString(e); }
inline error_t memset_async(void* p, int value, size_t bytes, stream_t s) { return cudaMemsetAsync(p, value, bytes, s); }
__device__ __forceinline__ float bf16_to_f32(bfloat16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ bfloat16_t f32_to_bf16(float x) { return __float2bfloat16_rn(x); }
// x from the lane `lane ^ mask` of the same lane group (a warp); all 32 lanes take part.
__device__ __forceinline__ float shfl_xor_group(float x, int mask) { return __shfl_xor_sync(0xffffffffu, x, mask); }
__device__ __forceinline__ double shfl_xor_group(double x, int mask) { return __shfl_xor_sync(0xffffffffu, x, mask); }
#endif

// The lanes that cooperate on one row in the shared kernels (a shuffle reduction, a split of the
// columns). It is 32 on both vendors, not the warp width: a 64-lane wavefront holds two groups, so
// HIP runs the very code the CUDA build tests on NVIDIA GPUs, and a row's work fits a group.
constexpr int kLaneGroup = 32;
static_assert(kWarpSize % kLaneGroup == 0, "a warp holds whole lane groups");

// Throws std::runtime_error with the runtime's text when the last launch failed.
inline void check_launch(const char* what) {
  const error_t e = last_error();
  if (failed(e)) throw std::runtime_error(std::string(what) + ": " + error_text(e));
}

}  // namespace expanse_gpu
