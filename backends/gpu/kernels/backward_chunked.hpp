// The element-wise and per-chunk kernels that a composed backward runs between its matrix products
// (the tensor-core power_attention_backward of the CUDA backend), vendor-neutral:
//   query_cotangent_operands_kernel  exp(Gc_i) scale^p dnum_i in the input dtype: the values of the
//                                    query-side state cotangents (update_state's)
//   weighted_features_kernel         sum_{i in m} exp(Gc_i) scale^p dden_i phi(q_i): their z part
//   finish_queries_kernel            dq = scale (pairs + state term), q . dq = p (sum A M) + q . (state term)
//   finish_keys_kernel               dk, dv likewise (dv's state term exp(A_m - Gc_j) times query_state's) and k . dk
#pragma once

#include "gpu/kernels/backward_simple.hpp"

namespace expanse_gpu {

// One thread per element of dnum [b,t,hq,e] (f32, contiguous).
template <class T>
__global__ void query_cotangent_operands_kernel(const float* dnum, gates g, expanse_problem pb, float scale_p, T* weighted) {
  EXPANSE_GRID_LOOP(idx, pb.b * pb.t * pb.hq * pb.e) {
    const int64_t row = idx / pb.e, qh = row % pb.hq, i = (row / pb.hq) % pb.t, batch = row / (pb.hq * pb.t);
    const int64_t bh = batch * pb.h + qh / (pb.hq / pb.h);
    weighted[idx] = from_f32<T>(dnum[idx] * scale_p * expf(g.cum(bh, pb.t, i)));
  }
}

constexpr int kFeatureThreads = 128, kFeatureTokens = 32;

// out [b,n,hq,D] (f32, contiguous): one block per (tile of kFeatureThreads features, chunk, query head,
// batch), one feature per thread; the chunk's tokens staged kFeatureTokens at a time.
template <class T>
__global__ void __launch_bounds__(kFeatureThreads) weighted_features_kernel(expanse_tensor q, const float* dden, gates g,
                                                                            const phi_entry* table, expanse_problem pb,
                                                                            float scale_p, float* out) {
  __shared__ float qs[kFeatureTokens][kBackwardMaxDim];
  __shared__ float cs[kFeatureTokens];
  const int64_t tiles = (pb.D + kFeatureThreads - 1) / kFeatureThreads;
  const cta_coords at = decode_cta(int(tiles), pb.hq, pb.n);
  const int64_t f = int64_t(at.tile) * kFeatureThreads + threadIdx.x, qh = at.head, m = at.chunk, batch = at.batch;
  const int64_t bh = batch * pb.h + qh / (pb.hq / pb.h), first = m * pb.c, len = min(pb.c, pb.t - first);
  const phi_entry row = table[f < pb.D ? f : 0];
  float acc = 0.f;
  for (int64_t s0 = 0; s0 < len; s0 += kFeatureTokens) {
    __syncthreads();  // the previous tokens are no longer read
    for (int64_t x = threadIdx.x; x < kFeatureTokens * pb.d; x += blockDim.x) {
      const int64_t s = x / pb.d, col = x % pb.d;
      qs[s][col] = s0 + s < len ? load<T>(q, off4(q, batch, first + s0 + s, qh, col)) : 0.f;
    }
    if (threadIdx.x < kFeatureTokens) {
      const int64_t s = s0 + threadIdx.x, i = first + s;
      cs[threadIdx.x] = s < len ? scale_p * expf(g.cum(bh, pb.t, i)) * dden[(batch * pb.t + i) * pb.hq + qh] : 0.f;
    }
    __syncthreads();
    for (int s = 0; s < kFeatureTokens; ++s)
      if (cs[s] != 0.f) acc += cs[s] * phi_value(row, pb.p, [&](int x) { return qs[s][x]; });
  }
  if (f < pb.D) out[((batch * pb.n + m) * pb.hq + qh) * pb.D + f] = acc;
}

// One lane group per (batch, token, query head): pairs, state [b,t,hq,d] f32 contiguous (state null:
// none), am [b,t,hq].
template <class T>
__global__ void finish_queries_kernel(expanse_tensor q, expanse_tensor dq, const float* pairs, const float* state,
                                      const float* am, float scale, float p, float* qdq, int64_t rows, int64_t d) {
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < rows;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
  const int64_t hq = q.shape[2], qh = row % hq, i = (row / hq) % q.shape[1], batch = row / (hq * q.shape[1]);
  float s = 0.f;
  for (int64_t x = lane; x < d; x += kLaneGroup) {
    const float from_state = state ? scale * state[row * d + x] : 0.f;
    store_any(dq, off4(dq, batch, i, qh, x), fmaf(scale, pairs[row * d + x], from_state));
    s += load<T>(q, off4(q, batch, i, qh, x)) * from_state;
  }
  for (int o = kLaneGroup / 2; o > 0; o >>= 1) s += shfl_xor_group(s, o);
  if (lane == 0) qdq[row] = fmaf(p, am[row], s);
  }
}

// One lane group per (batch, token, kv head): pairs_k, state_k [b,t,h,d], pairs_v [b,t,h,e] f32 contiguous,
// am [b,t,h]; dv_state [b,t,h,e] contiguous in the input dtype. The state terms null where there are none.
template <class T>
__global__ void finish_keys_kernel(expanse_tensor k, expanse_tensor dk, expanse_tensor dv, const float* pairs_k,
                                   const float* state_k, const float* am, const float* pairs_v, const T* dv_state,
                                   gates keys, expanse_problem pb, float* kdk) {
  const int lane = threadIdx.x % kLaneGroup;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; row < pb.b * pb.t * pb.h;
       row += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
  const int64_t kv = row % pb.h, j = (row / pb.h) % pb.t, batch = row / (pb.h * pb.t);
  float s = 0.f;
  for (int64_t x = lane; x < pb.d; x += kLaneGroup) {
    const float from_state = state_k ? state_k[row * pb.d + x] : 0.f;
    store_any(dk, off4(dk, batch, j, kv, x), pairs_k[row * pb.d + x] + from_state);
    s += load<T>(k, off4(k, batch, j, kv, x)) * from_state;
  }
  for (int o = kLaneGroup / 2; o > 0; o >>= 1) s += shfl_xor_group(s, o);
  if (lane == 0) kdk[row] = fmaf(float(pb.p), am[row], s);
  float w = 0.f;
  if (dv_state) {
    const int64_t bh = batch * pb.h + kv, m = j / pb.c;
    w = keys.Gc ? expf(keys.chunk_total(bh, pb.n, m) - keys.cum(bh, pb.t, j)) : 1.f;
  }
  for (int64_t y = lane; y < pb.e; y += kLaneGroup) {
    float grad = pairs_v[row * pb.e + y];
    if (dv_state) grad += w * to_f32(dv_state[row * pb.e + y]);
    store_any(dv, off4(dv, batch, j, kv, y), grad);
  }
  }
}

}  // namespace expanse_gpu
