// update_state on the Kokkos backend (kernels/update_state.hpp).
#include "kokkos/kernels/update_state.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string update_state_teams_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void update_state_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_args>(op);
  const phi_row* table = make_phi_table(pb, op, lc);
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  if (lc.ws.sizing() || pb.b * pb.n * pb.h * pb.D == 0) return;
  on_space(op, lc, [&](auto space) {
    launch_update_state(space, tensor_ref(a.k), tensor_ref(a.v), g, table, pb, tensor_ref(a.S), tensor_ref(a.z));
  });
}

}  // namespace expanse_kokkos
