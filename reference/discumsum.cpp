// discumsum (docs/spec.md "chunked algorithm", 2): discounted cumulative sum over chunks,
//   Y_0 = Y_init (0 when absent),   Y_{m+1} = exp(A_m) Y_m + X_m,
// with X [b,n,h, trailing...], A [b,n,h], Y_init [b,h, trailing...], Y [b,n+1,h, trailing...].
// The trailing dims (any rank >= 0, e.g. [D,e] or [D]) are flattened to problem.rows elements,
// each walked with its own tensor's strides. Sequential in m; parallel over b, h and elements.
#include <cmath>

#include "reference/common.hpp"
#include "reference/ops.hpp"

namespace expanse_ref {
namespace {

// Offset of trailing element number `flat` (row-major over dims first_dim .. ndim-1).
int64_t trailing_offset(const expanse_tensor& t, int first_dim, int64_t flat) {
  int64_t off = 0;
  for (int dim = t.ndim - 1; dim >= first_dim; --dim) {
    off += (flat % t.shape[dim]) * t.strides[dim];
    flat /= t.shape[dim];
  }
  return off;
}

}  // namespace

void discumsum(const expanse_problem& pb, const expanse_discumsum_args& args) {
  const expanse_tensor& X = *args.X;
  const expanse_tensor& A = *args.A;
  const expanse_tensor& Y = *args.Y;
  const expanse_tensor* Y_init = args.Y_init;  // optional (problem.has_initial_state)

  // Decay factors exp(A[b, m, h]), computed once.
  std::vector<double> decay(static_cast<size_t>(pb.b * pb.n * pb.h));
  for (int64_t bi = 0; bi < pb.b; ++bi)
    for (int64_t m = 0; m < pb.n; ++m)
      for (int64_t hi = 0; hi < pb.h; ++hi)
        decay[(bi * pb.n + m) * pb.h + hi] = std::exp(read_element(A, element_offset(A, {bi, m, hi})));

  // Tasks: (batch, head, block of trailing elements); each element is an independent recurrence.
  const int64_t block = 4096;
  const int64_t blocks = (pb.rows + block - 1) / block;
  parallel_for_index(pb.b * pb.h * blocks, [&](int64_t task) {
    const int64_t blk = task % blocks, hi = (task / blocks) % pb.h, bi = task / (blocks * pb.h);
    const int64_t end = std::min(pb.rows, (blk + 1) * block);
    for (int64_t r = blk * block; r < end; ++r) {
      const int64_t x_off = trailing_offset(X, 3, r), y_off = trailing_offset(Y, 3, r);
      double y = 0.0;  // Y_0
      if (Y_init != nullptr)
        y = read_element(*Y_init, element_offset(*Y_init, {bi, hi}) + trailing_offset(*Y_init, 2, r));
      write_element(Y, element_offset(Y, {bi, 0, hi}) + y_off, y);
      for (int64_t m = 0; m < pb.n; ++m) {
        y = decay[(bi * pb.n + m) * pb.h + hi] * y + read_element(X, element_offset(X, {bi, m, hi}) + x_off);
        write_element(Y, element_offset(Y, {bi, m + 1, hi}) + y_off, y);
      }
    }
  });
}

}  // namespace expanse_ref
