// discumsum_backward on the Kokkos backend (kernels/discumsum_backward.hpp).
#include "kokkos/kernels/discumsum_backward.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string discumsum_backward_scan_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void discumsum_backward_scan_run(const expanse_op& op, launch_context& lc) {
  const auto& a = args_of<expanse_discumsum_backward_args>(op);
  const int64_t b = a.X->shape[0], n = a.X->shape[1], h = a.X->shape[2];
  int64_t elems = 1;
  for (int dim = 3; dim < a.X->ndim; ++dim) elems *= a.X->shape[dim];
  float* Y = lc.ws.take<float>(size_t(b * h * n * elems));
  float* G = lc.ws.take<float>(size_t(b * h * elems));
  if (lc.ws.sizing() || b * h * elems == 0) return;
  on_space(op, lc, [&](auto space) {
    launch_discumsum_backward(space, state_of(a.X, true), tensor_ref(a.A), state_of(a.Y_init, false), state_of(a.dY, true),
                              state_of(a.dX, true), tensor_ref(a.dA), state_of(a.dY_init, false), b, n, h, elems, Y, G);
  });
}

}  // namespace expanse_kokkos
