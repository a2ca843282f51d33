// query_state, one group of kLaneGroup (32) lanes per query token and head (any shape and dtype): the lanes split
// the output columns; each walks the D rows of phi(q) and the state, then combines the result with
// the intra-chunk term (query_output.hpp).
#pragma once

#include "gpu/kernels/common.hpp"
#include "gpu/kernels/query_output.hpp"

namespace expanse_gpu {

// The tensors of a query_state. S/z with null data: no inter-chunk term. y/l/rowmax with null data:
// no intra-chunk term.
struct query_inputs {
  expanse_tensor q, S, z, y, l, rowmax, o;
};

constexpr int kQueryColsPerLane = 8;  // a lane group covers 256 output columns per pass

template <class T>
__global__ void simple_query_state_kernel(query_inputs in, gates g, const phi_entry* table, expanse_problem pb,
                                          int normalize, float scale_p) {
  const int lane = threadIdx.x % kLaneGroup;
  const int64_t warps = pb.b * pb.t * pb.hq;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x / kLaneGroup;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; w < warps; w += stride) {
    // 32-bit divisions where the sizes allow (a 64-bit one is a ~100-instruction routine)
    const token_row at = split_row(w, pb.t, pb.hq);
    const int64_t qh = at.head, i = at.tok, batch = at.batch;
    const int64_t kv = quotient(qh, pb.hq / pb.h), m = quotient(i, pb.c), bh = batch * pb.h + kv;
    const float f = scale_p, gi = g.cum(bh, pb.t, i);
    const bool intra = in.y.data != nullptr;
    float rm = 0.f, lv = 0.f;
    if (intra) {
      rm = loadf(in.rowmax, off3(in.rowmax, batch, i, qh));
      if (in.l.data) lv = loadf(in.l, off3(in.l, batch, i, qh));
    }
    const int64_t qoff = off4(in.q, batch, i, qh, 0);
    auto qv = [&](int j) { return load<T>(in.q, qoff + j * in.q.strides[3]); };
    for (int64_t col0 = 0; col0 < pb.e; col0 += kLaneGroup * kQueryColsPerLane) {
      using sum_t = cancelling_sum_t<T>;  // f64 for f32 inputs: phi(q) . S and phi(q) . z cancel
      sum_t acc[kQueryColsPerLane];
      for (int j = 0; j < kQueryColsPerLane; ++j) acc[j] = 0;
      sum_t den = 0;
      if (in.S.data) {
        for (int64_t r = 0; r < pb.D; ++r) {
          const sum_t ph = phi_value_as<sum_t>(table[r], pb.p, qv);
          const int64_t so = off5(in.S, batch, m, kv, r, 0);
#pragma unroll
          for (int j = 0; j < kQueryColsPerLane; ++j) {
            const int64_t col = col0 + lane + kLaneGroup * j;
            if (col < pb.e) acc[j] += ph * loadf(in.S, so + col * in.S.strides[4]);
          }
          if (normalize) den += ph * loadf(in.z, off4(in.z, batch, m, kv, r));
        }
      }
#pragma unroll
      for (int j = 0; j < kQueryColsPerLane; ++j) {
        const int64_t col = col0 + lane + kLaneGroup * j;
        if (col >= pb.e) continue;
        const float yv = intra ? loadf(in.y, off4(in.y, batch, i, qh, col)) : 0.f;
        const float o = combine_output(float(acc[j] * f), float(den * f), gi, intra, yv, lv, rm, normalize != 0);
        static_cast<T*>(in.o.data)[off4(in.o, batch, i, qh, col)] = from_f32<T>(o);
      }
    }
  }
}

}  // namespace expanse_gpu
