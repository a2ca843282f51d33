// query_state_backward on the Kokkos backend: the query gradients (kernels/query_gradients.hpp), the
// state cotangents dS_m = sum_{heads, i in m} exp(Gc_i) phi(scale q_i) dnum_i^T (dz_m with dden_i) as
// sums of update_state's shape (kernels/update_state.hpp), dy, dl from dnum, dden, and dlog_g from
// the queries' terms within each chunk.
#include "kokkos/kernels/gate_gradients.hpp"
#include "kokkos/kernels/query_gradients.hpp"
#include "kokkos/kernels/update_state.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string query_state_backward_teams_declines(const expanse_op& op, const device_props&) {
  return common_declines(op);
}

void query_state_backward_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_query_state_backward_args>(op);
  const phi_row* table = make_phi_table(pb, op, lc);
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  const query_gradient_outputs out{
      {take_tokens(lc, pb.b, pb.t, pb.hq, pb.e), take_tokens(lc, pb.b, pb.t, pb.hq, 1), {}, {}, {}},
      take_tokens(lc, pb.b, pb.t, pb.hq, pb.d),
      take_tokens(lc, pb.b, pb.t, pb.hq, 1, a.dlog_g != nullptr)};
  if (lc.ws.sizing() || pb.b * pb.t * pb.hq == 0) return;
  const intra_terms intra = a.y ? intra_terms{tensor_ref(a.y), tensor_ref(a.l), tensor_ref(a.rowmax)} : intra_terms{};
  on_space(op, lc, [&](auto space) {
    launch_query_gradients(space, tensor_ref(a.q), tensor_ref(a.S), tensor_ref(a.z), g, table, pb, intra, tensor_ref(a.o),
                           tensor_ref(a.dout), out);
    state_sum_source src;
    src.x = tensor_ref(a.q);
    src.x_scale = float(pb.scale);
    src.v = tensor_of(out.cot.dnum, pb.b);
    src.u = tensor_of(out.cot.dden, pb.b);
    src.group = pb.hq / pb.h;
    src.from_start = true;
    launch_state_sums(space, src, g, table, pb, tensor_ref(a.dS), tensor_ref(a.dz));
    if (a.y) launch_rowmax_scaling(space, tensor_ref(a.rowmax), tensor_ref(a.dy), tensor_ref(a.dl), out.cot, /*to_intra=*/true, pb.b);
    launch_store_tokens(space, out.dq, tensor_ref(a.dq), pb.b);
    if (a.dlog_g) {
      gate_terms backwards;
      backwards.add(out.dG, 1.f);
      launch_gate_gradients(space, backwards, gate_terms{}, nullptr, tensor_ref(a.log_g), pb, tensor_ref(a.dlog_g));
    }
  });
}

}  // namespace expanse_kokkos
