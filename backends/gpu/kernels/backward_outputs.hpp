// The gradients of q, k, v in their dtype from the f32 sums a tensor-core backward accumulates (the
// CUDA backend's power_attention_backward: dq by atomics over key blocks, dk and dv per key block),
// and q . dq, k . dk for the gates' gradient, which for the causal pairs are p sum A_ij M_ij by row
// and by column (docs/spec.md "Gradients"; summed by the kernel from the same f32 values).
#pragma once

#include "gpu/kernels/backward_simple.hpp"

namespace expanse_gpu {

// One lane group per (batch, token, query head): dq = scale sum [b,t,hq,d] (f32, contiguous),
// qdq = p am [b,t,hq].
template <class T>
__global__ void finish_queries_kernel(expanse_tensor dq, const float* sum, const float* am, float scale, float p,
                                      float* qdq, int64_t rows, int64_t d) {
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < rows;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
    const int64_t hq = dq.shape[2], qh = row % hq, i = (row / hq) % dq.shape[1], batch = row / (hq * dq.shape[1]);
    for (int64_t x = lane; x < d; x += kLaneGroup) store_any(dq, off4(dq, batch, i, qh, x), scale * sum[row * d + x]);
    if (lane == 0) qdq[row] = p * am[row];
  }
}

// One lane group per (batch, token, kv head): dk, dv from sum_k [b,t,h,d], sum_v [b,t,h,e] (f32,
// contiguous), kdk = p am [b,t,h].
[[maybe_unused]] static __global__ void finish_keys_kernel(expanse_tensor dk, expanse_tensor dv, const float* sum_k, const float* sum_v,
                                   const float* am, expanse_problem pb, float* kdk) {
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < pb.b * pb.t * pb.h;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
    const int64_t kv = row % pb.h, j = (row / pb.h) % pb.t, batch = row / (pb.h * pb.t);
    for (int64_t x = lane; x < pb.d; x += kLaneGroup) store_any(dk, off4(dk, batch, j, kv, x), sum_k[row * pb.d + x]);
    for (int64_t y = lane; y < pb.e; y += kLaneGroup) store_any(dv, off4(dv, batch, j, kv, y), sum_v[row * pb.e + y]);
    if (lane == 0) kdk[row] = float(pb.p) * am[row];
  }
}

}  // namespace expanse_gpu
