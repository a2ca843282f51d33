// Column scales of the states for the f16 form of the blocked query kernel
// (kernels/sm90/blocked_query_state.cuh, F16 = true): for every state (batch, chunk, kv head) and
// column (the e columns of S, then z), the power of two that takes the column's largest magnitude
// under 2^12, so that coef * S * scale stays under 2^15 in f16 (the layouts' coefficients are
// sqrt(multinomial) <= sqrt(4!) < 8 for p <= 4) while keeping 11 significant bits down to 2^-14.
//
// Why f16: with one b16 product per K step, rounding phi(q) and S to bf16 (8 bits) costs up to
// 1.6e-2 relative error on strongly gated p = 4 inputs (the terms of phi(q) . S cancel); f16's 11
// bits keep them within SPEC's bf16 bound (docs/performance.md). f16's range is narrow: hence the
// scales, exact powers of two undone on the finished sums.
//
// One CTA per state reads it once, coalesced (rows of e floats as 16-byte vectors).
#pragma once

#include "kernels/common.cuh"

namespace expanse_cuda {

struct state_scales_params {
  const float* S;
  int64_t S_sb, S_sn, S_sh, S_sD;  // [b,n,h,D,e], e contiguous
  const float* z;                  // null: no z column
  int64_t z_sb, z_sn, z_sh, z_sD;
  int64_t n, h, D;
  float* scales;  // [b,n,h][e + 1]: the e columns of S, then z
};

constexpr int kStateScaleThreads = 256;
// Largest magnitude of a column after its scale: under 2^kStateScaleBits.
constexpr int kStateScaleBits = 12;

__device__ __forceinline__ float state_scale_of(float max_abs) {
  if (!(max_abs > 0.f) || !isfinite(max_abs)) return 1.f;
  int ex = 0;
  frexpf(max_abs, &ex);  // max_abs < 2^ex
  return ldexpf(1.f, max(-126, min(126, kStateScaleBits - ex)));
}

template <int E>
__global__ void __launch_bounds__(kStateScaleThreads) state_scales_kernel(state_scales_params P) {
  constexpr int kVecs = E / 4, kLanes = kStateScaleThreads / kVecs;  // row lanes x 16-byte columns
  const int64_t state = blockIdx.x;  // (batch * n + chunk) * h + kv
  const int64_t kv = state % P.h, m = (state / P.h) % P.n, batch = state / (P.h * P.n);
  const float* S = P.S + batch * P.S_sb + m * P.S_sn + kv * P.S_sh;
  const int c4 = threadIdx.x % kVecs, lane_row = threadIdx.x / kVecs;
  float4 mx = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t r = lane_row; r < P.D; r += kLanes) {
    const float4 v = *reinterpret_cast<const float4*>(S + r * P.S_sD + c4 * 4);
    mx = make_float4(fmaxf(mx.x, fabsf(v.x)), fmaxf(mx.y, fabsf(v.y)), fmaxf(mx.z, fabsf(v.z)), fmaxf(mx.w, fabsf(v.w)));
  }
  float zmx = 0.f;
  if (P.z) {
    const float* z = P.z + batch * P.z_sb + m * P.z_sn + kv * P.z_sh;
    for (int64_t r = threadIdx.x; r < P.D; r += kStateScaleThreads) zmx = fmaxf(zmx, fabsf(z[r * P.z_sD]));
  }
  __shared__ float col_max[kLanes][E];
  __shared__ float z_max[kStateScaleThreads / 32];
  *reinterpret_cast<float4*>(&col_max[lane_row][c4 * 4]) = mx;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) zmx = fmaxf(zmx, __shfl_xor_sync(0xffffffffu, zmx, o));
  if (threadIdx.x % 32 == 0) z_max[threadIdx.x / 32] = zmx;
  __syncthreads();
  float* out = P.scales + state * (E + 1);
  if (threadIdx.x < E) {
    float v = 0.f;
    for (int l = 0; l < kLanes; ++l) v = fmaxf(v, col_max[l][threadIdx.x]);
    out[threadIdx.x] = state_scale_of(v);
  } else if (threadIdx.x == E) {
    float v = 0.f;
    for (int w = 0; w < kStateScaleThreads / 32; ++w) v = fmaxf(v, z_max[w]);
    out[E] = state_scale_of(v);
  }
}

}  // namespace expanse_cuda
