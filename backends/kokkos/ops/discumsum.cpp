// discumsum on the Kokkos backend (kernels/discumsum.hpp): Y's slots 0 .. n - 1 take the states
// entering each chunk and slot n the final state.
#include "kokkos/kernels/discumsum.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string discumsum_scan_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void discumsum_scan_run(const expanse_op& op, launch_context& lc) {
  const auto& a = args_of<expanse_discumsum_args>(op);
  const int64_t b = a.X->shape[0], n = a.X->shape[1], h = a.X->shape[2];
  int64_t elems = 1;
  for (int dim = 3; dim < a.X->ndim; ++dim) elems *= a.X->shape[dim];
  if (lc.ws.sizing() || b * h * elems == 0) return;
  const state_ref Y = state_of(a.Y, true);
  on_space(op, lc, [&](auto space) {
    launch_discumsum(space, state_of(a.X, true), tensor_ref(a.A), state_of(a.Y_init, false), Y, Y, b, n, h, elems);
  });
}

}  // namespace expanse_kokkos
