// sequence_state on the Kokkos backend: update_state into per-chunk states, scanned over the chunks by
// discumsum with the final state written to S (and z) (ops/chunk_states.hpp), and the chunk totals
// summed into A.
#include "kokkos/kernels/gates.hpp"
#include "kokkos/ops/chunk_states.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string sequence_state_chunked_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void sequence_state_chunked_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_sequence_state_args>(op);
  const int64_t b = pb.b, h = pb.h, n = pb.n, D = pb.D, e = pb.e;

  const phi_row* table = make_phi_table(pb, op, lc);
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  float* S = lc.ws.take<float>(size_t(b * n * h * D * e));
  float* z = a.z ? lc.ws.take<float>(size_t(b * n * h * D)) : nullptr;
  float* A = g.present() ? lc.ws.take<float>(size_t(b * n * h)) : nullptr;
  if (lc.ws.sizing() || b * h == 0) return;

  on_space(op, lc, [&](auto space) {
    launch_chunk_states(space, tensor_ref(a.k), tensor_ref(a.v), g, table, pb, S, z, A, nullptr, nullptr, a.S, a.z);
    if (a.A) launch_sequence_totals(space, g, b, h, n, tensor_ref(a.A));
  });
}

}  // namespace expanse_kokkos
