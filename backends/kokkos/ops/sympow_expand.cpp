// sympow_expand on the Kokkos backend (kernels/sympow_expand.hpp).
#include "kokkos/kernels/sympow_expand.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {
namespace {

rows_ref rows_of(const expanse_tensor* t) {
  rows_ref r;
  r.t = tensor_ref(t);
  r.lead = t->ndim - 1;
  for (int i = 0; i < t->ndim; ++i) r.shape[i] = t->shape[i];
  return r;
}

}  // namespace

std::string sympow_expand_teams_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void sympow_expand_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_sympow_expand_args>(op);
  const phi_row* table = make_phi_table(pb, op, lc);
  if (lc.ws.sizing() || pb.rows * pb.D == 0) return;
  on_space(op, lc, [&](auto space) { launch_sympow_expand(space, rows_of(a.x), rows_of(a.out), table, pb.rows, pb.D, pb.p); });
}

}  // namespace expanse_kokkos
