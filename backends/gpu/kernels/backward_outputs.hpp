// The gradients of q, k, v in their dtype from the f32 sums a tensor-core backward accumulates (the
// CUDA backend's power_attention_backward: the pairs' dq by atomics over key blocks, dk and dv per key
// block; the state terms), and q . dq, k . dk for the gates' gradient, which for the causal pairs are
// p sum A_ij M_ij by row and by column (docs/spec.md "Gradients"; summed by the kernel from the same
// f32 values).
#pragma once

#include "gpu/kernels/backward_simple.hpp"

namespace expanse_gpu {

// One lane group per (batch, token, query head): dq = scale (sum + state) with sum, state [b,t,hq,d] (f32,
// contiguous; state null: no state term), q . dq = p am + q . (scale state) [b,t,hq].
template <class T>
__global__ void finish_queries_kernel(expanse_tensor q, expanse_tensor dq, const float* sum, const float* state,
                                      const float* am, float scale, float p, float* qdq, int64_t rows, int64_t d) {
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < rows;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
    const token_row at = split_row(row, dq.shape[1], dq.shape[2]);
    const int64_t qh = at.head, i = at.tok, batch = at.batch;
    float s = 0.f;
    for (int64_t x = lane; x < d; x += kLaneGroup) {
      const float from_state = state ? scale * state[row * d + x] : 0.f;
      store_any(dq, off4(dq, batch, i, qh, x), fmaf(scale, sum[row * d + x], from_state));
      if (state) s += load<T>(q, off4(q, batch, i, qh, x)) * from_state;
    }
    for (int o = kLaneGroup / 2; o > 0; o >>= 1) s += shfl_xor_group(s, o);
    if (lane == 0) qdq[row] = fmaf(p, am[row], s);
  }
}

// One lane group per (batch, token, kv head): dk = sum_k + state_k [b,t,h,d], dv = sum_v + exp(A_m - Gc_j)
// dv_state [b,t,h,e] (f32 contiguous; dv_state in the input dtype; the state terms null where there are
// none), k . dk = p am + k . state_k [b,t,h].
template <class T>
__global__ void finish_keys_kernel(expanse_tensor k, expanse_tensor dk, expanse_tensor dv, const float* sum_k,
                                   const float* state_k, const float* sum_v, const T* dv_state, const float* am,
                                   gates keys, expanse_problem pb, float* kdk) {
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < pb.b * pb.t * pb.h;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
    const token_row at = split_row(row, pb.t, pb.h);
    const int64_t kv = at.head, j = at.tok, batch = at.batch;
    float s = 0.f;
    for (int64_t x = lane; x < pb.d; x += kLaneGroup) {
      const float from_state = state_k ? state_k[row * pb.d + x] : 0.f;
      store_any(dk, off4(dk, batch, j, kv, x), sum_k[row * pb.d + x] + from_state);
      if (state_k) s += load<T>(k, off4(k, batch, j, kv, x)) * from_state;
    }
    for (int o = kLaneGroup / 2; o > 0; o >>= 1) s += shfl_xor_group(s, o);
    if (lane == 0) kdk[row] = fmaf(float(pb.p), am[row], s);
    const float w = dv_state ? keys.to_chunk_end(batch * pb.h + kv, pb.t, pb.n, quotient(j, pb.c), j) : 0.f;
    for (int64_t y = lane; y < pb.e; y += kLaneGroup) {
      float grad = sum_v[row * pb.e + y];
      if (dv_state) grad += w * to_f32(dv_state[row * pb.e + y]);
      store_any(dv, off4(dv, batch, j, kv, y), grad);
    }
  }
}

}  // namespace expanse_gpu
