// sequence_state's own kernel (the rest is update_state's and discumsum's): the total log decay.
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

// A sequence's total log decay [b,h] (sequence_state's A) from the chunk totals of `g` ([b,h,n]): their
// sum in f64, -inf from a reset on; 0 without gates. A thread per (batch, head).
__global__ void sequence_totals_kernel(gates g, int64_t bh_count, int64_t h, int64_t n, expanse_tensor out) {
  EXPANSE_GRID_LOOP(bh, bh_count) {
    double sum = 0.0;
    for (int64_t m = 0; g.total && m < n; ++m) sum += g.total[bh * n + m];
    static_cast<float*>(out.data)[(bh / h) * out.strides[0] + (bh % h) * out.strides[1]] = static_cast<float>(sum);
  }
}

}  // namespace expanse_gpu
