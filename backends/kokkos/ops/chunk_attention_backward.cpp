// chunk_attention_backward on the Kokkos backend: the pairs' gradients (kernels/pair_gradients.hpp)
// with dnum_i = exp(-rowmax_i) dy_i, dden_i = exp(-rowmax_i) dl_i (rowmax held at the forward's), and
// dlog_g from their row and column sums within each chunk.
#include "kokkos/kernels/gate_gradients.hpp"
#include "kokkos/kernels/pair_gradients.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string chunk_attention_backward_teams_declines(const expanse_op& op, const device_props&) {
  return common_declines(op);
}

void chunk_attention_backward_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_chunk_attention_backward_args>(op);
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  const bool want_dlog_g = a.dlog_g != nullptr;
  const query_cotangents cot{take_tokens(lc, pb.b, pb.t, pb.hq, pb.e), take_tokens(lc, pb.b, pb.t, pb.hq, 1, a.dl != nullptr),
                            {}, {}, {}};
  const pair_outputs out{take_tokens(lc, pb.b, pb.t, pb.hq, pb.d), take_tokens(lc, pb.b, pb.t, pb.hq, 1, want_dlog_g),
                         take_tokens(lc, pb.b, pb.t, pb.h, pb.d), take_tokens(lc, pb.b, pb.t, pb.h, pb.e),
                         take_tokens(lc, pb.b, pb.t, pb.h, 1, want_dlog_g)};
  if (lc.ws.sizing() || pb.b * pb.t * pb.hq == 0) return;
  on_space(op, lc, [&](auto space) {
    launch_rowmax_scaling(space, tensor_ref(a.rowmax), tensor_ref(a.dy), tensor_ref(a.dl), cot, /*to_intra=*/false, pb.b);
    for (const token_buffer& buf : {out.dq, out.dk, out.dv}) launch_fill_zero(space, buf, pb.b);
    launch_pair_gradients(space, tensor_ref(a.q), tensor_ref(a.k), tensor_ref(a.v), g, pb, cot, out);
    launch_store_tokens(space, out.dq, tensor_ref(a.dq), pb.b);
    launch_store_tokens(space, out.dk, tensor_ref(a.dk), pb.b);
    launch_store_tokens(space, out.dv, tensor_ref(a.dv), pb.b);
    if (want_dlog_g) {
      gate_terms backwards;
      backwards.add(out.rows, 1.f);
      backwards.add(out.cols, -1.f);
      launch_gate_gradients(space, backwards, gate_terms{}, nullptr, tensor_ref(a.log_g), pb, tensor_ref(a.dlog_g));
    }
  });
}

}  // namespace expanse_kokkos
