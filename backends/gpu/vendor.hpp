// The one place where CUDA and HIP differ for the GPU code both backends share (backends/gpu/): the
// runtime header, the 16-bit float types and their conversions, the stream and error calls, the
// width of a warp. Everything under backends/gpu/ is written against these names only, and
// compiled by nvcc into libexpanse-cuda.so and by hipcc into libexpanse-hip.so.
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

#include <cstdint>
#include <stdexcept>
#include <string>

namespace expanse_gpu {

#if defined(__HIPCC__)
using stream_t = hipStream_t;
using error_t = hipError_t;
using half_t = __half;
using bfloat16_t = hip_bfloat16;
// A wavefront of CDNA (gfx90a, gfx94x) has 64 lanes; code that needs a warp's width reads this.
constexpr int kWarpSize = 64;
inline error_t last_error() { return hipGetLastError(); }
inline bool failed(error_t e) { return e != hipSuccess; }
inline const char* error_text(error_t e) { return hipGetErrorString(e); }
__device__ __forceinline__ float to_f32(bfloat16_t x) { return static_cast<float>(x); }
#else
using stream_t = cudaStream_t;
using error_t = cudaError_t;
using half_t = __half;
using bfloat16_t = __nv_bfloat16;
constexpr int kWarpSize = 32;
inline error_t last_error() { return cudaGetLastError(); }
inline bool failed(error_t e) { return e != cudaSuccess; }
inline const char* error_text(error_t e) { return cudaGetErrorString(e); }
__device__ __forceinline__ float to_f32(bfloat16_t x) { return __bfloat162float(x); }
#endif

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(half_t x) { return __half2float(x); }

// Throws std::runtime_error with the runtime's text when the last launch failed.
inline void check_launch(const char* what) {
  const error_t e = last_error();
  if (failed(e)) throw std::runtime_error(std::string(what) + ": " + error_text(e));
}

// Calls f with a value of the C++ type of an input dtype (f32, f16 or bf16).
template <class F>
void with_input_type(int32_t dtype, F&& f) {
  switch (dtype) {
    case 2 /* EXPANSE_F32 */: f(float{}); break;
    case 0 /* EXPANSE_F16 */: f(half_t{}); break;
    case 1 /* EXPANSE_BF16 */: f(bfloat16_t{}); break;
    default: throw std::runtime_error("unsupported input dtype");
  }
}

// Grid-stride loop over [0, count), and a grid for it.
#define EXPANSE_GPU_GRID_LOOP(i, count)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count);  \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline unsigned grid_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 16 ? 65535 * 16 : blocks));
}

}  // namespace expanse_gpu
