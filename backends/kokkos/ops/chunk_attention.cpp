// chunk_attention on the Kokkos backend (kernels/chunk_attention.hpp).
#include "kokkos/kernels/chunk_attention.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string chunk_attention_teams_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void chunk_attention_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_chunk_attention_args>(op);
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  if (lc.ws.sizing() || pb.b * pb.t * pb.hq == 0) return;
  on_space(op, lc, [&](auto space) {
    launch_chunk_attention(space, tensor_ref(a.q), tensor_ref(a.k), tensor_ref(a.v), g, pb, tensor_ref(a.y),
                           tensor_ref(a.l), tensor_ref(a.rowmax));
  });
}

}  // namespace expanse_kokkos
