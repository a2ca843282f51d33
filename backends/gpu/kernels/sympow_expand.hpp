// sympow_expand: out[..., r] = phi_r(x[..., :]) for every leading index, any strides.
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

template <class T>
__global__ void sympow_expand_kernel(expanse_tensor x, expanse_tensor out, const phi_entry* table, int64_t rows,
                                     int64_t D, int p) {
  const int lead = x.ndim - 1;
  EXPANSE_GRID_LOOP(i, rows * D) {
    const int64_t r = i % D;
    int64_t rest = i / D, x_off = 0, out_off = 0;
    for (int dim = lead - 1; dim >= 0; --dim) {  // unravel the leading multi-index, row-major
      const int64_t k = rest % x.shape[dim];
      rest /= x.shape[dim];
      x_off += k * x.strides[dim];
      out_off += k * out.strides[dim];
    }
    const T* xs = static_cast<const T*>(x.data) + x_off;
    const int64_t xstride = x.strides[lead];
    const float v = phi_value(table[r], p, [&](int j) { return to_f32(xs[j * xstride]); });
    static_cast<T*>(out.data)[out_off + r * out.strides[lead]] = from_f32<T>(v);
  }
}

}  // namespace expanse_gpu
