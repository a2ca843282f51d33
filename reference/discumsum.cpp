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

namespace expanse_ref {

// discumsum_backward (docs/spec.md "Gradients"): with G_m the whole cotangent of Y_m,
//   G_n = dY_n,  G_m = dY_m + exp(A_m) G_{m+1};  dX_m = G_{m+1},  dA_m = exp(A_m) <G_{m+1}, Y_m>,
//   dY_init = G_0; Y recomputed. One task per (batch, head): dA_m sums over its elements.
void discumsum_backward(const expanse_problem& pb, const expanse_discumsum_backward_args& args) {
  const expanse_tensor &X = *args.X, &A = *args.A, &dY = *args.dY, &dX = *args.dX;
  parallel_for_index(pb.b * pb.h, [&](int64_t task) {
    const int64_t hi = task % pb.h, bi = task / pb.h;
    std::vector<double> decay(size_t(pb.n)), dA(size_t(pb.n), 0.0), Y(size_t(pb.n + 1));
    for (int64_t m = 0; m < pb.n; ++m) decay[size_t(m)] = std::exp(read_element(A, element_offset(A, {bi, m, hi})));
    for (int64_t r = 0; r < pb.rows; ++r) {
      const int64_t x_off = trailing_offset(X, 3, r), dy_off = trailing_offset(dY, 3, r);
      Y[0] = args.Y_init ? read_element(*args.Y_init, element_offset(*args.Y_init, {bi, hi}) + trailing_offset(*args.Y_init, 2, r))
                         : 0.0;
      for (int64_t m = 0; m < pb.n; ++m)
        Y[size_t(m + 1)] = decay[size_t(m)] * Y[size_t(m)] + read_element(X, element_offset(X, {bi, m, hi}) + x_off);
      double G = read_element(dY, element_offset(dY, {bi, pb.n, hi}) + dy_off);
      for (int64_t m = pb.n - 1; m >= 0; --m) {
        write_element(dX, element_offset(dX, {bi, m, hi}) + trailing_offset(dX, 3, r), G);
        if (decay[size_t(m)] != 0.0) dA[size_t(m)] += decay[size_t(m)] * G * Y[size_t(m)];
        G = read_element(dY, element_offset(dY, {bi, m, hi}) + dy_off) + decay[size_t(m)] * G;
      }
      if (args.dY_init)
        write_element(*args.dY_init, element_offset(*args.dY_init, {bi, hi}) + trailing_offset(*args.dY_init, 2, r), G);
    }
    if (args.dA)
      for (int64_t m = 0; m < pb.n; ++m) write_element(*args.dA, element_offset(*args.dA, {bi, m, hi}), dA[size_t(m)]);
  });
}

}  // namespace expanse_ref
