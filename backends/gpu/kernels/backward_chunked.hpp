// The element-wise and per-chunk kernels that the chunked tensor-core power_attention_backward (CUDA
// backend) runs between its matrix products, vendor-neutral:
//   query_cotangents_kernel          each query's denominator, 1 / den_i, dden_i, and exp(Gc_i) scale^p
//                                    / den_i: the query's weight in the state cotangents (the values
//                                    are dout itself)
//   weighted_features_kernel         sum_{i in m} exp(Gc_i) scale^p dden_i phi(q_i): their z part
#pragma once

#include "gpu/kernels/backward_simple.hpp"

namespace expanse_gpu {

// For p = 2 in the symmetric layout a feature sum is a quadratic form: phi_(a,b)(x) = c_ab x_a x_b
// (c_ab = sqrt 2 for a < b, 1 on the diagonal; row a d - a (a - 1) / 2 + b - a), so
//   sum_i w_i phi(x_i) = the upper triangle of X^T diag(w) X, scaled by c_ab, and
//   phi(x)^T z = x^T Z x with Z_ab = Z_ba = c_ab z_(a,b) / 2 off the diagonal.
// Both kernels take d = 64 (kQuadDim) and go through the 64 x 64 matrix, not the D table rows. For p = 1
// phi is the identity (D = d): weighted_features_kernel's sum is q^T w.
constexpr int kQuadDim = 64, kQuadThreads = 256, kQuadTokens = 32, kCotangentTokens = 256, kFeatureSplits = 4;

// out [b,n,hq,D] (f32, contiguous, zeroed) += sum_{i in m} exp(Gc_i) scale^p dden_i phi(q_i), q with
// whole 16-byte rows: kFeatureSplits blocks per (chunk, query head, batch), each over its share of the
// chunk's tokens, added by atomics (one block per chunk left about 4 blocks per SM at P1 t = 65536,
// waiting on its loads). Each thread sums a 4 x 4 tile of q^T diag(w) q, staged kQuadTokens tokens
// at a time, its rows and columns read as float4: element-wise, 8 shared loads per 16 products (2-way
// conflicted) bounded the kernel.
template <class T>
__global__ void __launch_bounds__(kQuadThreads) weighted_features_kernel(expanse_tensor q, const float* dden, gates g,
                                                                         expanse_problem pb, float scale_p, float* out) {
  static_assert(kQuadTokens * kQuadDim / 8 == kQuadThreads, "one 8-element load per thread stages the tokens");
  __shared__ __align__(16) float qs[kQuadTokens][kQuadDim + 4];
  __shared__ float ws[kQuadTokens];
  const int split = int(blockIdx.x % kFeatureSplits);
  const int64_t rest = blockIdx.x / kFeatureSplits;
  const int64_t qh = rest % pb.hq, m = (rest / pb.hq) % pb.n, batch = rest / (pb.hq * pb.n);
  const int64_t bh = batch * pb.h + qh / (pb.hq / pb.h), first = m * pb.c, len = min(pb.c, pb.t - first);
  const int64_t share = (len + kFeatureSplits - 1) / kFeatureSplits, begin = split * share, end = min(len, begin + share);
  const int a0 = (threadIdx.x / 16) * 4, b0 = (threadIdx.x % 16) * 4;
  float acc[4][4] = {};
  for (int64_t s0 = begin; s0 < end; s0 += kQuadTokens) {
    __syncthreads();  // the previous tokens are no longer read
    {
      const int s = threadIdx.x / (kQuadDim / 8), c8 = (threadIdx.x % (kQuadDim / 8)) * 8;
      float v[8] = {};
      if (s0 + s < end) load8(static_cast<const T*>(q.data) + off4(q, batch, first + s0 + s, qh, c8), v);
      *reinterpret_cast<float4*>(&qs[s][c8]) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(&qs[s][c8 + 4]) = make_float4(v[4], v[5], v[6], v[7]);
    }
    if (threadIdx.x < kQuadTokens) {
      const int64_t s = s0 + threadIdx.x, i = first + s;
      ws[threadIdx.x] = s < end ? expf(g.cum(bh, pb.t, i)) * dden[(batch * pb.t + i) * pb.hq + qh] : 0.f;
    }
    __syncthreads();
    if (pb.p == 1) {  // the weighted sum of the q rows, a column per thread
      if (threadIdx.x < kQuadDim)
        for (int s = 0; s < kQuadTokens; ++s) acc[0][0] = fmaf(ws[s], qs[s][threadIdx.x], acc[0][0]);
      continue;
    }
    if (a0 > b0 + 3) continue;  // below the diagonal: not stored
    for (int s = 0; s < kQuadTokens; ++s) {
      const float4 a4 = *reinterpret_cast<const float4*>(&qs[s][a0]), b4 = *reinterpret_cast<const float4*>(&qs[s][b0]);
      const float w = ws[s], qa[4] = {w * a4.x, w * a4.y, w * a4.z, w * a4.w}, qb[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) acc[x][y] = fmaf(qa[x], qb[y], acc[x][y]);
    }
  }
  if (begin >= end) return;
  float* o = out + ((batch * pb.n + m) * pb.hq + qh) * pb.D;
  if (pb.p == 1) {
    if (threadIdx.x < kQuadDim) atomicAdd(o + threadIdx.x, scale_p * acc[0][0]);
    return;
  }
  for (int x = 0; x < 4; ++x)
    for (int y = 0; y < 4; ++y) {
      const int a = a0 + x, b = b0 + y;
      if (a <= b) atomicAdd(o + sympow2_row(kQuadDim, a, b), scale_p * sympow2_coef(a, b) * acc[x][y]);
    }
}

// The queries' cotangents, one thread per token, one block per (kCotangentTokens tokens of one chunk,
// query head, batch); q and dout with a contiguous last dim and 16-byte aligned rows (d = e = 64):
//   den_i = exp(Gc_i) phi(scale q_i)^T z_m + l_i exp(rowmax_i)   (normalized; z_m [b,n,h,D] f32, null
//           without forward states; l, rowmax: chunk_attention's), else 1
//   rden_i = 1 / den_i, dden_i = -rden_i dout_i . o_i   (0 where den_i = 0; unnormalized dden_i = 0)
//   weight_i = exp(Gc_i) scale^p rden_i, f32 contiguous [b,t,hq] (null: not wanted)
//   z_weight_i = exp(Gc_i) scale^p dden_i, likewise: phi(q_i)'s weight in the z part of the cotangent
//                states (weighted_features_kernel's sum, or the blocked update_state's z)
// phi(scale q)^T z_m is scale^p q^T Z q (weighted_features_kernel's quadratic form: normalized means an
// even p, and the tensor-core backward takes p = 2 there), Z in shared memory, read by every thread at
// once (a broadcast) against its q in registers. One kernel where there were three (the state's denominators,
// a block per token for the cotangents, the weighted values): 2.2 ms at P1 t = 65536 on an H100.
template <class T>
__global__ void __launch_bounds__(kCotangentTokens)
    query_cotangents_kernel(expanse_tensor q, expanse_tensor dout, expanse_tensor o, expanse_tensor l, expanse_tensor rowmax,
                            const float* z, gates g, expanse_problem pb, float scale_p, int tiles, float* rden, float* dden,
                            float* weight, float* z_weight) {
  __shared__ __align__(16) float zs[kQuadDim][kQuadDim + 4];  // rows padded: the mirrored stores spread over banks
  const int tile = int(blockIdx.x % tiles);
  const token_row at = split_row(blockIdx.x / tiles, pb.n, pb.hq);  // (batch, chunk, query head)
  const int64_t qh = at.head, m = at.tok, batch = at.batch;
  const int64_t kv = qh / (pb.hq / pb.h), bh = batch * pb.h + kv, first = m * pb.c + int64_t(tile) * kCotangentTokens;
  const int64_t len = min(int64_t(kCotangentTokens), min(pb.c - int64_t(tile) * kCotangentTokens, pb.t - first));
  if (len <= 0) return;
  const bool with_state = pb.normalize && z;
  if (with_state) {
    const float* zm = z + ((batch * pb.n + m) * pb.h + kv) * pb.D;
    // Each stored entry (a <= b, consecutive in b) read once and mirrored.
    for (int x = threadIdx.x; x < kQuadDim * kQuadDim; x += blockDim.x) {
      const int a = x / kQuadDim, b = x % kQuadDim;
      if (a > b) continue;
      const float v = zm[sympow2_row(kQuadDim, a, b)];
      if (a == b) zs[a][a] = v;
      else zs[a][b] = zs[b][a] = 0.5f * sympow2_coef(a, b) * v;
    }
  }
  __syncthreads();
  if (threadIdx.x >= len) return;
  const int64_t i = first + threadIdx.x, row = (batch * pb.t + i) * pb.hq + qh;
  const T* dout_row = static_cast<const T*>(dout.data) + off4(dout, batch, i, qh, 0);
  const float decay = expf(g.cum(bh, pb.t, i));
  float den = 1.f, od = 0.f;
  if (pb.normalize) {
    float quad = 0.f;
    if (with_state) {
      float qv[kQuadDim];
      const T* q_row = static_cast<const T*>(q.data) + off4(q, batch, i, qh, 0);
#pragma unroll
      for (int c8 = 0; c8 < kQuadDim / 8; ++c8) load8(q_row + 8 * c8, reinterpret_cast<float(&)[8]>(qv[8 * c8]));
      // Z is symmetric: its 4 x 4 blocks on and above the diagonal, those above twice (2176 products
      // of the 4096).
#pragma unroll
      for (int a4 = 0; a4 < kQuadDim / 4; ++a4)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int a = 4 * a4 + r;
          float diag = 0.f, above = 0.f;
#pragma unroll
          for (int b4 = a4; b4 < kQuadDim / 4; ++b4) {
            const float4 zz = *reinterpret_cast<const float4*>(&zs[a][4 * b4]);
            float& acc = b4 == a4 ? diag : above;
            acc = fmaf(zz.x, qv[4 * b4], fmaf(zz.y, qv[4 * b4 + 1], fmaf(zz.z, qv[4 * b4 + 2], fmaf(zz.w, qv[4 * b4 + 3], acc))));
          }
          quad = fmaf(qv[a], fmaf(2.f, above, diag), quad);
        }
    }
    // dout_i . o_i: dout's rows are whole 16-byte vectors (the implementation's checks), and o's where
    // its layout allows: with a thread per token, element-wise loads touch a line per lane per element.
    const T* o_row = static_cast<const T*>(o.data) + off4(o, batch, i, qh, 0);
    if (b16_vector_rows(o)) {
      for (int y8 = 0; y8 < pb.e; y8 += 8) {
        float dv[8], ov[8];
        load8(dout_row + y8, dv);
        load8(o_row + y8, ov);
#pragma unroll
        for (int j = 0; j < 8; ++j) od = fmaf(dv[j], ov[j], od);
      }
    } else {
      for (int y = 0; y < pb.e; ++y) od += to_f32(dout_row[y]) * to_f32(o_row[y * o.strides[3]]);
    }
    den = scale_p * decay * quad + loadf(l, off3(l, batch, i, qh)) * expf(loadf(rowmax, off3(rowmax, batch, i, qh)));
  }
  const float r = den == 0.f ? 0.f : 1.f / den;
  const float dd = pb.normalize && den != 0.f ? -od / den : 0.f;
  dden[row] = dd;
  if (rden) rden[row] = r;
  if (weight) weight[row] = r * scale_p * decay;
  if (z_weight) z_weight[row] = dd * scale_p * decay;
}

}  // namespace expanse_gpu
