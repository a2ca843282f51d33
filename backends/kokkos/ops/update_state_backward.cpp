// update_state_backward on the Kokkos backend: the key gradients of the given state cotangents
// (kernels/key_gradients.hpp) and dlog_g_l = sum_{j < l in m} phi(k_j) . dPhi_j.
#include "kokkos/kernels/gate_gradients.hpp"
#include "kokkos/kernels/key_gradients.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string update_state_backward_teams_declines(const expanse_op& op, const device_props&) {
  return common_declines(op);
}

void update_state_backward_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_backward_args>(op);
  const phi_row* table = make_phi_table(pb, op, lc);
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  key_gradient_outputs out{take_tokens(lc, pb.b, pb.t, pb.h, pb.d), take_tokens(lc, pb.b, pb.t, pb.h, pb.e),
                           take_tokens(lc, pb.b, pb.t, pb.h, 1, a.dlog_g != nullptr)};
  if (lc.ws.sizing() || pb.b * pb.t * pb.h == 0) return;
  on_space(op, lc, [&](auto space) {
    launch_fill_zero(space, out.dk, pb.b);
    launch_fill_zero(space, out.dv, pb.b);
    launch_key_gradients(space, tensor_ref(a.k), tensor_ref(a.v), g, table, pb, tensor_ref(a.dS), tensor_ref(a.dz), out);
    launch_store_tokens(space, out.dk, tensor_ref(a.dk), pb.b);
    launch_store_tokens(space, out.dv, tensor_ref(a.dv), pb.b);
    if (a.dlog_g) {
      gate_terms forwards;
      forwards.add(out.c, 1.f);
      launch_gate_gradients(space, gate_terms{}, forwards, nullptr, tensor_ref(a.log_g), pb, tensor_ref(a.dlog_g));
    }
  });
}

}  // namespace expanse_kokkos
