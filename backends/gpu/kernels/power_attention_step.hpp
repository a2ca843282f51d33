// power_attention_step: one decoding token. S <- g S + phi(k) v^T and z <- g z + phi(k) in place,
// then o = phi(scale q)^T S [/ phi(scale q)^T z] for every query head of the group. One pass over
// the state: each thread updates 32 rows of one column and, while they are in registers, forms the
// partial products with phi(q) of each query head; a second kernel sums the partials.
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

constexpr int kStepRowsPerThread = 32, kStepThreads = 128;

template <class T>
__global__ void step_update_kernel(expanse_tensor q, expanse_tensor k, expanse_tensor v, expanse_tensor log_g,
                                   expanse_tensor S, expanse_tensor z, const phi_entry* table, expanse_problem pb,
                                   float scale, float* partial, int64_t row_blocks, int64_t col_groups) {
  const int64_t cols = pb.e + 1;  // column e is z
  int64_t blk = blockIdx.x;
  const int64_t cg = blk % col_groups;
  blk /= col_groups;
  const int64_t rb = blk % row_blocks;
  blk /= row_blocks;
  const int64_t head = blk % pb.h, batch = blk / pb.h;
  const int64_t col = cg * kStepThreads + threadIdx.x;
  if (col >= cols || (col == pb.e && z.data == nullptr)) return;
  const float gate = log_g.data ? expf(loadf(log_g, off3(log_g, batch, 0, head))) : 1.f;
  const float val = col < pb.e ? load<T>(v, off4(v, batch, 0, head, col)) : 1.f;
  const int64_t r0 = rb * kStepRowsPerThread;
  const int rows = static_cast<int>(min(int64_t(kStepRowsPerThread), pb.D - r0));
  const int64_t koff = off4(k, batch, 0, head, 0);
  float s[kStepRowsPerThread];
#pragma unroll
  for (int j = 0; j < kStepRowsPerThread; ++j) {
    if (j >= rows) break;
    const int64_t r = r0 + j;
    const float ph = phi_value(table[r], pb.p, [&](int i) { return load<T>(k, koff + i * k.strides[3]); });
    float* p = col < pb.e ? ptrf(S, off4(S, batch, head, r, col)) : ptrf(z, off3(z, batch, head, r));
    s[j] = gate * *p + ph * val;
    *p = s[j];
  }
  const int64_t group = pb.hq / pb.h;
  for (int64_t gi = 0; gi < group; ++gi) {
    const int64_t qh = head * group + gi;
    const int64_t qoff = off4(q, batch, 0, qh, 0);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kStepRowsPerThread; ++j) {
      if (j >= rows) break;
      acc += phi_value(table[r0 + j], pb.p, [&](int i) { return scale * load<T>(q, qoff + i * q.strides[3]); }) * s[j];
    }
    partial[((batch * pb.hq + qh) * row_blocks + rb) * cols + col] = acc;
  }
}

template <class T>
__global__ void step_output_kernel(const float* partial, expanse_tensor o, expanse_problem pb, int64_t row_blocks,
                                   int normalize) {
  const int64_t cols = pb.e + 1;
  EXPANSE_GRID_LOOP(i, pb.b * pb.hq * pb.e) {
    const int64_t col = i % pb.e, bq = i / pb.e, qh = bq % pb.hq, batch = bq / pb.hq;
    const float* part = partial + bq * row_blocks * cols;
    float num = 0.f, den = 0.f;
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      num += part[rb * cols + col];
      if (normalize) den += part[rb * cols + pb.e];
    }
    const float out = normalize ? (den != 0.f ? num / den : 0.f) : num;
    static_cast<T*>(o.data)[off4(o, batch, 0, qh, col)] = from_f32<T>(out);
  }
}

}  // namespace expanse_gpu
