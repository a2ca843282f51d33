// query_state on the Kokkos backend (kernels/query_state.hpp).
#include "kokkos/kernels/query_state.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string query_state_teams_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void query_state_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_query_state_args>(op);
  const phi_row* table = make_phi_table(pb, op, lc);
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  if (lc.ws.sizing() || pb.b * pb.t * pb.hq * pb.e == 0) return;
  intra_terms intra;
  if (pb.has_intra && a.y != nullptr) intra = {tensor_ref(a.y), tensor_ref(a.l), tensor_ref(a.rowmax)};
  on_space(op, lc, [&](auto space) {
    launch_query_state(space, tensor_ref(a.q), tensor_ref(a.S), tensor_ref(a.z), g, table, pb, intra, tensor_ref(a.o));
  });
}

}  // namespace expanse_kokkos
