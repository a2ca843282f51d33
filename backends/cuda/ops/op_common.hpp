// Host-side helpers shared by the operations of the CUDA backend (ops/*.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "dispatch.hpp"
#include "kernels/common.cuh"

namespace expanse_cuda {

// Calls f with a value of the C++ type of an input dtype (f32, f16 or bf16).
template <class F>
void with_input_type(int32_t dtype, F&& f) {
  switch (dtype) {
    case EXPANSE_F32: f(float{}); break;
    case EXPANSE_F16: f(__half{}); break;
    case EXPANSE_BF16: f(__nv_bfloat16{}); break;
    default: throw std::runtime_error("unsupported input dtype");
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

// Launches a kernel that takes one parameter struct, opting in to more than 48 KB of dynamic
// shared memory where it needs it.
template <class Params>
void launch_with_smem(void (*kernel)(Params), int64_t ctas, int threads, size_t smem, cudaStream_t stream,
                      const Params& params) {
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  kernel<<<static_cast<unsigned>(ctas), threads, smem, stream>>>(params);
}

// The reasons every implementation of this backend shares: no f64 (that is the reference's oracle
// mode), f32 states and gates, indices of phi that fit the table.
std::string common_declines(const expanse_op& op);
inline bool is_f32(const expanse_tensor* t) { return t == nullptr || t->dtype == EXPANSE_F32; }

// The phi table and, where the layout has one, its block form (kernels/common.cuh, phi_block), for
// the state operations (ops/phi_table.cu).
struct phi_tables {
  const phi_entry* rows = nullptr;
  phi_blocks blocks;
};

// What a composed operation (power_attention) makes once for all its steps, handed to them as
// launch_context::prepared: make_phi_table(s) and make_gates then return these instead of building
// their own.
struct step_inputs {
  phi_tables phi;  // empty where no step reads phi
  gates g;
};
inline const step_inputs* prepared_of(const launch_context& lc) { return static_cast<const step_inputs*>(lc.prepared); }

// The phi table of the problem's p, d and layout, built in the workspace (ops/phi_table.cu).
const phi_entry* make_phi_table(const expanse_problem& pb, launch_context& lc);
phi_tables make_phi_tables(const expanse_problem& pb, launch_context& lc);
// The number of phi blocks of the problem's expansion; 0 when its layout has no block form.
int64_t phi_block_count(const expanse_problem& pb);

// Gate prefix sums per chunk of size c (c = t: one chunk) of a [b,t,h] log_g, in the workspace
// (ops/chunk_gates.cu). Returns empty gates when log_g is null.
gates make_gates(const expanse_tensor* log_g, int64_t b, int64_t t, int64_t h, int64_t c, launch_context& lc);

inline int64_t chunk_count(int64_t t, int64_t c) { return (t + c - 1) / c; }

// A contiguous f32 tensor view over workspace memory.
expanse_tensor f32_view(float* data, std::initializer_list<int64_t> shape, int32_t device);

}  // namespace expanse_cuda
