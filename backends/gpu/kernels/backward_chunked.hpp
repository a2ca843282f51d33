// The element-wise and per-chunk kernels that the chunked tensor-core power_attention_backward (CUDA
// backend) runs between its matrix products, vendor-neutral:
//   query_cotangent_operands_kernel  exp(Gc_i) scale^p dnum_i in the input dtype: the values of the
//                                    query-side state cotangents (update_state's)
//   weighted_features_kernel         sum_{i in m} exp(Gc_i) scale^p dden_i phi(q_i): their z part
//   state_denominators_kernel        exp(Gc_i) phi(scale q_i)^T z_m: the state's part of each denominator
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

// For p = 2 in the symmetric layout a feature sum is a quadratic form: phi_(a,b)(x) = c_ab x_a x_b
// (c_ab = sqrt 2 for a < b, 1 on the diagonal; row a d - a (a - 1) / 2 + b - a), so
//   sum_i w_i phi(x_i) = the upper triangle of X^T diag(w) X, scaled by c_ab, and
//   phi(x)^T z = x^T Z x with Z_ab = Z_ba = c_ab z_(a,b) / 2 off the diagonal.
// Both kernels take d = 64 (kQuadDim) and go through the 64 x 64 matrix, not the D table rows.
constexpr int kQuadDim = 64, kQuadThreads = 256, kQuadTokens = 32, kDenTokens = 64;

// out [b,n,hq,D] (f32, contiguous) = sum_{i in m} exp(Gc_i) scale^p dden_i phi(q_i): one block per (chunk,
// query head, batch); each thread sums a 4 x 4 tile of q^T diag(w) q over the chunk's tokens, staged
// kQuadTokens at a time.
template <class T>
__global__ void __launch_bounds__(kQuadThreads) weighted_features_kernel(expanse_tensor q, const float* dden, gates g,
                                                                         expanse_problem pb, float scale_p, float* out) {
  __shared__ float qs[kQuadTokens][kQuadDim + 1];
  __shared__ float ws[kQuadTokens];
  const int64_t qh = blockIdx.x % pb.hq, m = (blockIdx.x / pb.hq) % pb.n, batch = blockIdx.x / (pb.hq * pb.n);
  const int64_t bh = batch * pb.h + qh / (pb.hq / pb.h), first = m * pb.c, len = min(pb.c, pb.t - first);
  const int a0 = (threadIdx.x / 16) * 4, b0 = (threadIdx.x % 16) * 4;
  float acc[4][4] = {};
  for (int64_t s0 = 0; s0 < len; s0 += kQuadTokens) {
    __syncthreads();  // the previous tokens are no longer read
    for (int x = threadIdx.x; x < kQuadTokens * kQuadDim; x += blockDim.x) {
      const int s = x / kQuadDim, col = x % kQuadDim;
      qs[s][col] = s0 + s < len ? load<T>(q, off4(q, batch, first + s0 + s, qh, col)) : 0.f;
    }
    if (threadIdx.x < kQuadTokens) {
      const int64_t s = s0 + threadIdx.x, i = first + s;
      ws[threadIdx.x] = s < len ? expf(g.cum(bh, pb.t, i)) * dden[(batch * pb.t + i) * pb.hq + qh] : 0.f;
    }
    __syncthreads();
    if (a0 > b0 + 3) continue;  // below the diagonal: not stored
    for (int s = 0; s < kQuadTokens; ++s) {
      float qa[4], qb[4];
      for (int k = 0; k < 4; ++k) qa[k] = ws[s] * qs[s][a0 + k], qb[k] = qs[s][b0 + k];
      for (int x = 0; x < 4; ++x)
        for (int y = 0; y < 4; ++y) acc[x][y] = fmaf(qa[x], qb[y], acc[x][y]);
    }
  }
  float* o = out + ((batch * pb.n + m) * pb.hq + qh) * pb.D;
  for (int x = 0; x < 4; ++x)
    for (int y = 0; y < 4; ++y) {
      const int a = a0 + x, b = b0 + y;
      if (a <= b) o[sympow2_row(kQuadDim, a, b)] = scale_p * sympow2_coef(a, b) * acc[x][y];
    }
}

// den_state [b,t,hq] = exp(Gc_i) phi(scale q_i)^T z_m (z [b,n,h,D] f32, contiguous): one block per
// (kDenTokens tokens of one chunk, query head, batch); Z in shared memory, 4 threads per token.
template <class T>
__global__ void __launch_bounds__(kQuadThreads) state_denominators_kernel(expanse_tensor q, const float* z, gates g,
                                                                          expanse_problem pb, float scale_p, int tiles,
                                                                          float* den_state) {
  __shared__ float zs[kQuadDim][kQuadDim + 1];
  __shared__ float qs[kDenTokens][kQuadDim + 1];
  const int tile = int(blockIdx.x % tiles);
  const int64_t rest = blockIdx.x / tiles, qh = rest % pb.hq, m = (rest / pb.hq) % pb.n, batch = rest / (pb.hq * pb.n);
  const int64_t kv = qh / (pb.hq / pb.h), bh = batch * pb.h + kv, first = m * pb.c + int64_t(tile) * kDenTokens;
  const int64_t len = min(int64_t(kDenTokens), min(pb.c - int64_t(tile) * kDenTokens, pb.t - first));
  if (len <= 0) return;
  const float* zm = z + ((batch * pb.n + m) * pb.h + kv) * pb.D;
  for (int x = threadIdx.x; x < kQuadDim * kQuadDim; x += blockDim.x) {
    const int a = x / kQuadDim, b = x % kQuadDim;
    zs[a][b] = (a == b ? 1.f : 0.5f) * sympow2_coef(a, b) * zm[sympow2_row(kQuadDim, min(a, b), max(a, b))];
  }
  for (int x = threadIdx.x; x < kDenTokens * kQuadDim; x += blockDim.x) {
    const int s = x / kQuadDim, col = x % kQuadDim;
    qs[s][col] = s < len ? load<T>(q, off4(q, batch, first + s, qh, col)) : 0.f;
  }
  __syncthreads();
  const int s = threadIdx.x / 4, part = threadIdx.x % 4;  // 4 threads per token, 16 rows a each
  float sum = 0.f;
  for (int a = part * 16; a < part * 16 + 16; ++a) {
    float row = 0.f;
    for (int b = 0; b < kQuadDim; ++b) row = fmaf(zs[a][b], qs[s][b], row);
    sum = fmaf(qs[s][a], row, sum);
  }
  for (int o = 2; o > 0; o >>= 1) sum += shfl_xor_group(sum, o);
  if (part == 0 && s < len) {
    const int64_t i = first + s;
    den_state[(batch * pb.t + i) * pb.hq + qh] = scale_p * expf(g.cum(bh, pb.t, i)) * sum;
  }
}

}  // namespace expanse_gpu
