// chunk_attention, one group of kLaneGroup (32) lanes per query row (any shape and dtype): the lanes split the
// key dimension for each score (summed by shuffles) and the value columns for the output, with the
// running maximum of the log-space scores (y, l, rowmax).
#pragma once

#include <type_traits>

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

// The tensors of a chunk_attention (l and rowmax with null data: not written).
struct attention_inputs {
  expanse_tensor q, k, v, y, l, rowmax;
};

constexpr int kAttentionColsPerLane = 8;

// f32 inputs sum q . k in f64: rowmax is p log|scale q . k| at its largest, and where a row sees only
// keys whose dot cancels (the first query after a reset and itself), an f32 sum put rowmax 2e-5 to
// 8e-5 off the f32 tolerance of 1e-5 (2% of seeds of the case table's f32 p = 3 case with resets).
template <class T>
__global__ void simple_chunk_attention_kernel(attention_inputs in, gates g, expanse_problem pb) {
  using dot_sum = std::conditional_t<std::is_same_v<T, float>, double, float>;
  const int lane = threadIdx.x % kLaneGroup;
  const int64_t warps = pb.b * pb.t * pb.hq;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x / kLaneGroup;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; w < warps; w += stride) {
    const int64_t qh = w % pb.hq, i = (w / pb.hq) % pb.t, batch = w / (pb.hq * pb.t);
    const int64_t kv = qh / (pb.hq / pb.h), bh = batch * pb.h + kv;
    const int64_t first = (i / pb.c) * pb.c;
    const float Gi = g.since_reset(bh, pb.t, i);
    const int64_t qoff = off4(in.q, batch, i, qh, 0);
    for (int64_t col0 = 0; col0 < pb.e; col0 += kLaneGroup * kAttentionColsPerLane) {
      float acc[kAttentionColsPerLane];
      for (int j = 0; j < kAttentionColsPerLane; ++j) acc[j] = 0.f;
      float mx = -INFINITY, lsum = 0.f;
      for (int64_t j = first + g.first_key(bh, pb.t, i); j <= i; ++j) {  // keys before a reset: decay 0
        const int64_t koff = off4(in.k, batch, j, kv, 0);
        dot_sum part = 0;
        for (int64_t dim = lane; dim < pb.d; dim += kLaneGroup)
          part += dot_sum(load<T>(in.q, qoff + dim * in.q.strides[3])) * dot_sum(load<T>(in.k, koff + dim * in.k.strides[3]));
        part = lane_group_sum(part);
        const float dot = static_cast<float>(part * dot_sum(pb.scale));
        if (dot == 0.f) continue;
        const float s = pb.p * logf(fabsf(dot)) + (Gi - g.since_reset(bh, pb.t, j));
        if (s > mx) {
          const float alpha = expf(mx - s);  // 0 when mx = -inf
          for (int c = 0; c < kAttentionColsPerLane; ++c) acc[c] *= alpha;
          lsum *= alpha;
          mx = s;
        }
        float wgt = expf(s - mx);
        if ((pb.p & 1) && dot < 0.f) wgt = -wgt;
        lsum += wgt;
        const int64_t voff = off4(in.v, batch, j, kv, 0);
#pragma unroll
        for (int c = 0; c < kAttentionColsPerLane; ++c) {
          const int64_t col = col0 + lane + kLaneGroup * c;
          if (col < pb.e) acc[c] += wgt * load<T>(in.v, voff + col * in.v.strides[3]);
        }
      }
      const bool empty = mx == -INFINITY;
#pragma unroll
      for (int c = 0; c < kAttentionColsPerLane; ++c) {
        const int64_t col = col0 + lane + kLaneGroup * c;
        if (col < pb.e) *ptrf(in.y, off4(in.y, batch, i, qh, col)) = empty ? 0.f : acc[c];
      }
      if (col0 == 0 && lane == 0) {
        if (in.l.data) *ptrf(in.l, off3(in.l, batch, i, qh)) = empty ? 0.f : lsum;
        if (in.rowmax.data) *ptrf(in.rowmax, off3(in.rowmax, batch, i, qh)) = empty ? 0.f : mx;
      }
    }
  }
}

}  // namespace expanse_gpu
