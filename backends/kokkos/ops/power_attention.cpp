// power_attention on the Kokkos backend: the chunked algorithm (docs/spec.md) on workspace tensors,
//   1. chunk_attention -> (y, l, rowmax)                          intra-chunk terms
//   2. update_state -> per-chunk states; discumsum in place       states entering each chunk, final state
//   3. query_state with the intra terms -> o                      inter-chunk terms, combined, normalized
// on one phi table and one set of gate sums. The quadratic form is the same with one chunk (c = t):
// step 2 then only runs for an initial or final state.
#include "kokkos/kernels/chunk_attention.hpp"
#include "kokkos/kernels/query_state.hpp"
#include "kokkos/ops/chunk_states.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string power_attention_chunked_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void power_attention_chunked_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_args>(op);
  const bool need_states = pb.n > 1 || pb.has_initial_state || pb.want_final_state;
  const bool need_z = pb.normalize || a.final_z != nullptr;
  const int64_t b = pb.b, t = pb.t, hq = pb.hq, h = pb.h, n = pb.n, D = pb.D, e = pb.e;

  const phi_row* table = need_states ? make_phi_table(pb, op, lc) : nullptr;
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  float* y = lc.ws.take<float>(size_t(b * t * hq * e));
  float* l = lc.ws.take<float>(size_t(b * t * hq));
  float* rowmax = lc.ws.take<float>(size_t(b * t * hq));
  float* S = need_states ? lc.ws.take<float>(size_t(b * n * h * D * e)) : nullptr;
  float* z = need_states && need_z ? lc.ws.take<float>(size_t(b * n * h * D)) : nullptr;
  float* A = need_states && g.present() ? lc.ws.take<float>(size_t(b * n * h)) : nullptr;
  if (lc.ws.sizing() || b * t * hq == 0) return;

  const tensor_ref y_ref = f32_buffer(y, {b, t, hq, e}), l_ref = f32_buffer(l, {b, t, hq}),
                   rowmax_ref = f32_buffer(rowmax, {b, t, hq});
  const tensor_ref S_ref = S ? f32_buffer(S, {b, n, h, D, e}) : tensor_ref{}, z_ref = z ? f32_buffer(z, {b, n, h, D}) : tensor_ref{};
  on_space(op, lc, [&](auto space) {
    // 1. Intra-chunk attention.
    launch_chunk_attention(space, tensor_ref(a.q), tensor_ref(a.k), tensor_ref(a.v), g, pb, y_ref, l_ref, rowmax_ref);
    // 2. States entering each chunk (and the final state), scanned in place.
    if (need_states)
      launch_chunk_states(space, tensor_ref(a.k), tensor_ref(a.v), g, table, pb, S, z, A, a.initial_S, a.initial_z,
                          a.final_S, a.final_z);
    // 3. Inter-chunk terms combined with the intra-chunk ones.
    launch_query_state(space, tensor_ref(a.q), S_ref, z_ref, g, table, pb, intra_terms{y_ref, l_ref, rowmax_ref},
                       tensor_ref(a.o));
  });
}

}  // namespace expanse_kokkos
