// The state terms' pullback on tensor cores (kernels/sm80/mma_state_pullback.cuh: p = 1 or 2 in the
// symmetric layout, d = e = 64, f16/bf16 tokens): per token
//   out_i = rho_i J_phi(y_i)^T (r_i M x_i + alpha_i z),   grad_i = grad_scale (sum_i + out_i),
//   dot_i = p am_i + y_i . out_i
// with M, z the state (or its cotangent) of token i's chunk. dq's and dk's state terms of
// power_attention_backward, and update_state_backward's dk.
#pragma once

#include "ops/op_common.hpp"

namespace expanse_cuda {

// How the kernel multiplies its tokens by a state tile: mma.sync per warp (sm_80+), or wgmma per
// warpgroup (sm_90a), which reads the tile from shared memory a quarter as often.
enum class pullback_product { mma_sync, wgmma };

struct state_pullback {
  const expanse_tensor* y;  // [b,t,H,d]: queries or keys
  float y_scale;            // y is this times the tensor
  const expanse_tensor* x;  // [b,t,H,e]: dout or v
  const float* r;           // [b,t,H] contiguous; null: 1
  const float* alpha;       // [b,t,H] contiguous; null: 1
  const expanse_tensor* M;  // [b,n,h,D,e] f32, last dim contiguous
  const expanse_tensor* z;  // [b,n,h,D] f32, last dim contiguous; null data: no z term
  gates g;                  // rho: exp(Gc_i) (queries) or, from g.keys(), exp(A_m - Gc_j) (keys)
  bool keys;
  int64_t heads;            // H: hq (queries) or h (keys)
  const float* sum;         // [b,t,H,d] f32 contiguous; null: none
  const float* am;          // [b,t,H] f32; null: none
  const expanse_tensor* grad;  // [b,t,H,d], the input dtype
  float grad_scale;
  float* dot;  // [b,t,H] f32, written
  pullback_product product;
  void* tiles;  // state_pullback_workspace(pb, product) bytes: M and z as the kernel's split tiles
};

// The workspace of one pullback: the state of every chunk and kv head as b16 tiles hi + lo and their z
// entries (0.6 MB per chunk and head at p = 2, d = e = 64 with wgmma's layout; 0.67 MB with mma.sync's).
size_t state_pullback_workspace(const expanse_problem& pb, pullback_product product);
// Splits the state into tiles (a pass over M and z), then runs the pullback on them.
void launch_state_pullback(const state_pullback& s, const expanse_problem& pb, launch_context& lc);
// out_j = phi(k_j)^T M [b,t,h,e] (the input dtype) from the tiles the last wgmma pullback of M left
// in `tiles` (kernels/sm90/wgmma_state_tiles_query.cuh; p = 2, d = e = 64, sm_90a): dv's state term.
void launch_state_tiles_query(const expanse_tensor& k, const expanse_tensor& out, const void* tiles,
                              const expanse_problem& pb, launch_context& lc);

// Why a problem's tokens and layout do not fit the tensor-core backwards built on the pullback ("" if
// they do; the degree is each caller's to check).
// Whether dv's state term can come from the pullback's split tiles (launch_state_tiles_query): the
// wgmma product's tile layout, p = 2.
inline bool tiles_query_takes(pullback_product product, const expanse_problem& pb) {
  return product == pullback_product::wgmma && pb.p == 2;
}

inline std::string tensor_core_backward_declines(const expanse_problem& pb) {
  if (pb.input_dtype != EXPANSE_F16 && pb.input_dtype != EXPANSE_BF16) return "inputs must be f16 or bf16";
  if (pb.layout.kind != EXPANSE_LAYOUT_SYMPOW) return "the layout must be the symmetric one";
  if (pb.d != 64 || pb.e != 64) return "d and e must be 64";
  return {};
}

}  // namespace expanse_cuda
