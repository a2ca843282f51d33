// update_state, one thread per state entry (any shape and dtype): S_m[r, col] (column e is z_m[r])
// = sum over the chunk's tokens j of exp(A_m - Gc_j) phi_r(k_j) v_j[col].
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

template <class T>
__global__ void simple_update_state_kernel(expanse_tensor k, expanse_tensor v, gates g, const phi_entry* table,
                                           expanse_problem pb, expanse_tensor S, expanse_tensor z) {
  const int64_t cols = pb.e + 1;  // column e is z
  EXPANSE_GRID_LOOP(i, pb.b * pb.n * pb.h * pb.D * cols) {
    const int64_t col = i % cols;
    int64_t rest = i / cols;
    const int64_t r = rest % pb.D;
    rest /= pb.D;
    const int64_t head = rest % pb.h;
    rest /= pb.h;
    const int64_t m = rest % pb.n, batch = rest / pb.n;
    if (col == pb.e && z.data == nullptr) continue;
    const int64_t first = m * pb.c, len = min(pb.c, pb.t - first), bh = batch * pb.h + head;
    const float A = g.chunk_total(bh, pb.n, m);
    const phi_entry row = table[r];
    float acc = 0.f;
    for (int64_t s = 0; s < len; ++s) {
      const int64_t tok = first + s;
      const float w = g.Gc ? expf(A - g.cum(bh, pb.t, tok)) : 1.f;
      const float ph = phi_value(row, pb.p, [&](int j) { return load<T>(k, off4(k, batch, tok, head, j)); });
      const float val = col < pb.e ? load<T>(v, off4(v, batch, tok, head, col)) : 1.f;
      acc += w * ph * val;
    }
    if (col < pb.e) *ptrf(S, off5(S, batch, m, head, r, col)) = acc;
    else *ptrf(z, off4(z, batch, m, head, r)) = acc;
  }
}

}  // namespace expanse_gpu
