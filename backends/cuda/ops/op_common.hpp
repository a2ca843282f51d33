// Host-side helpers of the CUDA backend's own implementations (the tensor-core ones of ops/*.cu),
// on top of those every GPU backend shares (gpu/ops/common.hpp), whose names it uses unqualified.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "dispatch.hpp"
#include "gpu/ops/common.hpp"
#include "kernels/common.cuh"

namespace expanse_cuda {

using namespace expanse_gpu;

// Calls f(T{}) with T the b16 type of an f16/bf16 dtype.
template <class F>
void with_b16_type(int32_t dtype, F&& f) {
  if (dtype == EXPANSE_F16) f(__half{});
  else f(__nv_bfloat16{});
}

// Calls f(P) with P the degree p (1..4, what validation admits) as a std::integral_constant value.
template <class F>
void with_degree(int p, F&& f) {
  switch (p) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    default: throw std::runtime_error("tensor-core kernels take p in 1..4, got " + std::to_string(p));
  }
}

// The tensor-core kernels' instantiations: calls f(T{}, DH, E) with T the b16 type of an f16/bf16
// dtype and DH, E the head dims d, e (each 32, 64 or 128) as std::integral_constant values.
template <class F>
void with_b16_head_dims(int32_t dtype, int64_t d, int64_t e, F&& f) {
  auto pick_e = [&](auto type_tag, auto d_tag) {
    if (e == 32) f(type_tag, d_tag, std::integral_constant<int, 32>{});
    else if (e == 64) f(type_tag, d_tag, std::integral_constant<int, 64>{});
    else f(type_tag, d_tag, std::integral_constant<int, 128>{});
  };
  auto pick_d = [&](auto type_tag) {
    if (d == 32) pick_e(type_tag, std::integral_constant<int, 32>{});
    else if (d == 64) pick_e(type_tag, std::integral_constant<int, 64>{});
    else pick_e(type_tag, std::integral_constant<int, 128>{});
  };
  if (dtype == EXPANSE_F16) pick_d(__half{});
  else if (dtype == EXPANSE_BF16) pick_d(__nv_bfloat16{});
  else throw std::runtime_error("tensor-core kernels take f16 or bf16 inputs");
}

// A contiguous tensor of a b16 dtype (the input's) over workspace memory.
inline expanse_tensor b16_view(void* data, int32_t dtype, std::initializer_list<int64_t> shape,
                               const expanse_tensor& like) {
  expanse_tensor t = f32_view(static_cast<float*>(data), shape, like);
  t.dtype = dtype;
  return t;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Why a token tensor [b,t,H,x] cannot feed the tensor-core kernels' 16-byte loads ("" if it can).
inline std::string token_tensor_declines(const char* name, const expanse_tensor& t) {
  if (t.strides[3] != 1) return std::string(name) + " needs a contiguous last dim";
  for (int i = 0; i < 3; ++i)
    if (t.strides[i] % 8 != 0) return std::string(name) + " needs strides that are multiples of 8";
  if (!aligned16(t.data)) return std::string(name) + " needs 16-byte aligned data";
  return {};
}

// Launches a kernel that takes one parameter struct, opting in to more than 48 KB of dynamic
// shared memory where it needs it.
template <class Params>
void launch_with_smem(void (*kernel)(Params), int64_t ctas, int threads, size_t smem, cudaStream_t stream,
                      const Params& params) {
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  kernel<<<static_cast<unsigned>(ctas), threads, smem, stream>>>(params);
}

}  // namespace expanse_cuda
