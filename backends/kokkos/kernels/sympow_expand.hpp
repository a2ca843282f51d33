// sympow_expand: out[row, r] = phi_r(x_row), one thread per entry.
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

// A tensor [..., cols] as rows: a row index runs row-major over the leading dims, through their strides.
struct rows_ref {
  tensor_ref t;
  int64_t shape[kMaxDims] = {};
  int lead = 0;  // the number of leading dims (all but the last)
  KOKKOS_INLINE_FUNCTION int64_t row_offset(int64_t row) const {
    int64_t off = 0;
    for (int dim = lead - 1; dim >= 0; --dim) {
      off += (row % shape[dim]) * t.stride[dim];
      row /= shape[dim];
    }
    return off;
  }
  KOKKOS_INLINE_FUNCTION int64_t col_stride() const { return t.stride[lead]; }
};

template <class Space>
void launch_sympow_expand(const Space& space, rows_ref x, rows_ref out, const phi_row* table, int64_t rows, int64_t D,
                          int p) {
  Kokkos::parallel_for(
      "expanse::sympow_expand", Kokkos::RangePolicy<Space>(space, 0, rows * D), KOKKOS_LAMBDA(const int64_t i) {
        const int64_t row = i / D, r = i % D;
        const int64_t xo = x.row_offset(row), xs = x.col_stride();
        const phi_row& entry = table[r];
        float v = entry.coef;
        for (int k = 0; k < p; ++k) v *= x.t.get(xo + entry.idx[k] * xs);
        out.t.set(out.row_offset(row) + r * out.col_stride(), v);
      });
}

}  // namespace expanse_kokkos
