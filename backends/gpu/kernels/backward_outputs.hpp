// The gradients of q, k, v in their dtype from the f32 sums a tensor-core backward accumulates (the
// CUDA backend's power_attention_backward: the pairs' dq by atomics over key blocks, dk and dv per key
// block; dv's state term), and q . dq, k . dk for the gates' gradient, which for the causal pairs are
// p sum A_ij M_ij by row and by column (docs/spec.md "Gradients"; summed by the kernel from the same
// f32 values). Where dq and dk have state terms the state pullback finishes them instead
// (kernels/sm80/mma_state_pullback.cuh).
#pragma once

#include "gpu/kernels/backward_simple.hpp"

namespace expanse_gpu {

// One lane group per (batch, token, query head), where dq has no state term (the state pullback
// finishes dq itself where it has one): dq = scale sum [b,t,hq,d] (f32, contiguous), q . dq = p am.
template <class T>
__global__ void finish_queries_kernel(expanse_tensor dq, const float* sum, const float* am, float scale, float p,
                                      float* qdq, int64_t rows, int64_t d) {
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < rows;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
    const token_row at = split_row(row, dq.shape[1], dq.shape[2]);
    for (int64_t x = lane; x < d; x += kLaneGroup) store_any(dq, off4(dq, at.batch, at.tok, at.head, x), scale * sum[row * d + x]);
    if (lane == 0) qdq[row] = p * am[row];
  }
}

// One lane group per (batch, token, kv head): dv = sum_v + exp(A_m - Gc_j) dv_state [b,t,h,e] (f32
// contiguous, null: none; dv_state in the input dtype, null where there is no state term) and, with_dk (where
// the state pullback did not finish dk), dk = sum_k [b,t,h,d], k . dk = p am.
//
// With dv_vectors (finish_keys_vectors: no dk to write, dv in the input dtype with whole 16-byte rows,
// dv_state present) a thread takes 8 columns of a row instead, in 16-byte loads and stores: a lane
// group per row took 0.32 ms at P1 t = 65536 (H100), about a third of the bandwidth.
template <class T>
__global__ void finish_keys_kernel(expanse_tensor dk, expanse_tensor dv, const float* sum_k, const float* sum_v,
                                   const T* dv_state, const float* am, gates keys, expanse_problem pb, float* kdk,
                                   bool with_dk, bool dv_vectors) {
  if (dv_vectors) {
    const int64_t per_row = pb.e / 8, items = pb.b * pb.t * pb.h * per_row;
    for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < items; x += int64_t(gridDim.x) * blockDim.x) {
      const int64_t row = x / per_row, y0 = (x - row * per_row) * 8;
      const token_row at = split_row(row, pb.t, pb.h);
      const float w = keys.to_chunk_end(at.batch * pb.h + at.head, pb.t, pb.n, quotient(at.tok, pb.c), at.tok);
      const float4 s0 = sum_v ? *reinterpret_cast<const float4*>(sum_v + row * pb.e + y0) : float4{0.f, 0.f, 0.f, 0.f};
      const float4 s1 = sum_v ? *reinterpret_cast<const float4*>(sum_v + row * pb.e + y0 + 4) : float4{0.f, 0.f, 0.f, 0.f};
      const uint4 st = *reinterpret_cast<const uint4*>(dv_state + row * pb.e + y0);
      const T* sv = reinterpret_cast<const T*>(&st);
      const float sums[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      uint4 out;
      T* ov = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int j = 0; j < 8; ++j) ov[j] = from_f32<T>(fmaf(w, to_f32(sv[j]), sums[j]));
      *reinterpret_cast<uint4*>(static_cast<T*>(dv.data) + off4(dv, at.batch, at.tok, at.head, y0)) = out;
    }
    return;
  }
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < pb.b * pb.t * pb.h;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
    const token_row at = split_row(row, pb.t, pb.h);
    const int64_t kv = at.head, j = at.tok, batch = at.batch;
    if (with_dk) {
      for (int64_t x = lane; x < pb.d; x += kLaneGroup) store_any(dk, off4(dk, batch, j, kv, x), sum_k[row * pb.d + x]);
      if (lane == 0) kdk[row] = float(pb.p) * am[row];
    }
    const float w = dv_state ? keys.to_chunk_end(batch * pb.h + kv, pb.t, pb.n, quotient(j, pb.c), j) : 0.f;
    for (int64_t y = lane; y < pb.e; y += kLaneGroup) {
      float grad = sum_v ? sum_v[row * pb.e + y] : 0.f;
      if (dv_state) grad += w * to_f32(dv_state[row * pb.e + y]);
      store_any(dv, off4(dv, batch, j, kv, y), grad);
    }
  }
}

// Whether finish_keys_kernel takes dv 8 columns per thread (its dv_vectors), and the threads it then
// needs (else a lane group per row).
inline bool finish_keys_vectors(const expanse_tensor& dv, const expanse_problem& pb, bool dv_state, bool with_dk) {
  return !with_dk && dv_state && dv.dtype == pb.input_dtype && pb.e % 8 == 0 && b16_vector_rows(dv);
}
inline int64_t finish_keys_threads(const expanse_tensor& dv, bool dv_vectors) {
  const int64_t rows = dv.shape[0] * dv.shape[1] * dv.shape[2];
  return dv_vectors ? rows * (dv.shape[3] / 8) : rows * kLaneGroup;
}

}  // namespace expanse_gpu
