// power_attention_backward on the Kokkos backend: the chunked form of docs/spec.md "Gradients" on
// workspace buffers (f32; the gradients are summed there, then stored in their dtypes):
//   1. the forward states: update_state, then discumsum in place -> S_m, z_m entering each chunk,
//      and the final state in slot n; chunk_attention for the denominators' pairs (normalized)
//   2. the queries: den_i, dnum_i, dden_i, dq's state term and dG's query term (query_gradients)
//   3. the pairs: dq, dk, dv and their row and column sums (pair_gradients)
//   4. the cotangent states: the sums of update_state's shape over q and dnum, discumsum run in
//      reverse -> dY_{m+1} leaving each chunk (dfinal_S leaving the last), dinitial_S
//   5. the keys: dk's and dv's state terms and dG's key term (key_gradients)
//   6. dlog_g chunk by chunk, each chunk from its boundary term (kernels/gate_gradients.hpp)
// The quadratic form is one chunk; without states (one chunk, no initial state, no final cotangent)
// steps 1's states, 4 and 5 are skipped.
#include "kokkos/kernels/chunk_attention.hpp"
#include "kokkos/kernels/discumsum.hpp"
#include "kokkos/kernels/gate_gradients.hpp"
#include "kokkos/kernels/gates.hpp"
#include "kokkos/kernels/key_gradients.hpp"
#include "kokkos/kernels/pair_gradients.hpp"
#include "kokkos/kernels/query_gradients.hpp"
#include "kokkos/kernels/update_state.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

std::string power_attention_backward_chunked_declines(const expanse_op& op, const device_props&) {
  return common_declines(op);
}

void power_attention_backward_chunked_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  const int64_t b = pb.b, t = pb.t, hq = pb.hq, h = pb.h, n = pb.n, D = pb.D, e = pb.e;
  const bool states = n > 1 || a.initial_S || a.dfinal_S || a.dfinal_z;
  const bool with_z = states && (pb.normalize || a.initial_z || a.dfinal_z);

  const phi_row* table = states ? make_phi_table(pb, op, lc) : nullptr;
  const gate_sums g = make_gate_sums(a.log_g, pb, op, lc);
  float* S = states ? lc.ws.take<float>(size_t(b * (n + 1) * h * D * e)) : nullptr;  // entering, final in slot n
  float* z = with_z ? lc.ws.take<float>(size_t(b * (n + 1) * h * D)) : nullptr;
  float* dY = states ? lc.ws.take<float>(size_t(b * n * h * D * e)) : nullptr;  // leaving each chunk
  float* dZ = with_z ? lc.ws.take<float>(size_t(b * n * h * D)) : nullptr;
  float* A = states && g.present() ? lc.ws.take<float>(size_t(b * n * h)) : nullptr;
  float* entering = states && a.dlog_g ? lc.ws.take<float>(size_t(b * h * n)) : nullptr;
  const token_buffer l = take_tokens(lc, b, t, hq, 1, pb.normalize != 0),
                     rowmax = take_tokens(lc, b, t, hq, 1, pb.normalize != 0);
  // Normalized, the pairs take M_ij from dout and o themselves (backward_common.hpp, query_cotangents).
  query_cotangents cot{take_tokens(lc, b, t, hq, e), take_tokens(lc, b, t, hq, 1), {}, {}, {}};
  if (pb.normalize) cot.dout = tensor_ref(a.dout), cot.o = tensor_ref(a.o), cot.r = take_tokens(lc, b, t, hq, 1);
  const query_gradient_outputs q_out{cot, take_tokens(lc, b, t, hq, pb.d), take_tokens(lc, b, t, hq, 1, a.dlog_g != nullptr)};
  const pair_outputs pairs{q_out.dq, take_tokens(lc, b, t, hq, 1, a.dlog_g != nullptr), take_tokens(lc, b, t, h, pb.d),
                           take_tokens(lc, b, t, h, e), take_tokens(lc, b, t, h, 1, a.dlog_g != nullptr)};
  const key_gradient_outputs keys{pairs.dk, pairs.dv, take_tokens(lc, b, t, h, 1, a.dlog_g != nullptr)};
  if (lc.ws.sizing() || b * t * hq == 0) return;

  const tensor_ref S_ref = S ? f32_buffer(S, {b, n + 1, h, D, e}) : tensor_ref{};
  const tensor_ref z_ref = z ? f32_buffer(z, {b, n + 1, h, D}) : tensor_ref{};
  const tensor_ref dY_ref = dY ? f32_buffer(dY, {b, n, h, D, e}) : tensor_ref{};
  const tensor_ref dZ_ref = dZ ? f32_buffer(dZ, {b, n, h, D}) : tensor_ref{};
  const tensor_ref A_ref = A ? f32_buffer(A, {b, n, h}) : tensor_ref{};
  on_space(op, lc, [&](auto space) {
    // 1. The forward states (S, z enter each chunk; slot n: the final state) and the pairs' sums.
    if (states) {
      launch_update_state(space, tensor_ref(a.k), tensor_ref(a.v), g, table, pb, S_ref, z_ref);
      if (A) launch_chunk_totals(space, g, b, h, n, A);
      const state_ref Ss = chunk_states_of(S_ref, {b, n + 1, h, D, e});
      launch_discumsum(space, Ss, A_ref, state_of(a.initial_S, false), Ss, Ss, b, n, h, D * e);
      if (z) {
        const state_ref zs = chunk_states_of(z_ref, {b, n + 1, h, D});
        launch_discumsum(space, zs, A_ref, state_of(a.initial_z, false), zs, zs, b, n, h, D);
      }
    }
    intra_terms intra;
    if (pb.normalize) {
      intra = {tensor_ref{}, tensor_of(l, b), tensor_of(rowmax, b)};  // the denominators' pairs only
      launch_chunk_attention(space, tensor_ref(a.q), tensor_ref(a.k), tensor_ref(a.v), g, pb, intra.y, intra.l, intra.rowmax);
    }
    // 2. The queries; 3. the pairs.
    launch_query_gradients(space, tensor_ref(a.q), S_ref, z_ref, g, table, pb, intra, tensor_ref(a.o), tensor_ref(a.dout),
                           q_out);
    launch_fill_zero(space, pairs.dk, b);
    launch_fill_zero(space, pairs.dv, b);
    launch_pair_gradients(space, tensor_ref(a.q), tensor_ref(a.k), tensor_ref(a.v), g, pb, q_out.cot, pairs);
    if (states) {
      // 4. The cotangent states, scanned from the last chunk: dY slot m leaves chunk m.
      state_sum_source src;
      src.x = tensor_ref(a.q);
      src.x_scale = float(pb.scale);
      src.v = tensor_of(q_out.cot.dnum, b);
      src.u = tensor_of(q_out.cot.dden, b);
      src.group = hq / h;
      src.from_start = true;
      launch_state_sums(space, src, g, table, pb, dY_ref, dZ_ref);
      const state_ref dYs = chunk_states_of(dY_ref, {b, n, h, D, e});
      launch_discumsum(space, dYs, A_ref, state_of(a.dfinal_S, false), dYs, state_of(a.dinitial_S, false), b, n, h, D * e,
                       /*reverse=*/true);
      if (dZ) {
        const state_ref dZs = chunk_states_of(dZ_ref, {b, n, h, D});
        launch_discumsum(space, dZs, A_ref, state_of(a.dfinal_z, false), dZs, state_of(a.dinitial_z, false), b, n, h, D,
                         /*reverse=*/true);
      }
      // 5. The keys.
      launch_key_gradients(space, tensor_ref(a.k), tensor_ref(a.v), g, table, pb, dY_ref, dZ_ref, keys);
      if (entering) launch_entering_boundaries(space, dY, dZ, S, z, A, pb, entering);
    }
    launch_store_tokens(space, q_out.dq, tensor_ref(a.dq), b);
    launch_store_tokens(space, pairs.dk, tensor_ref(a.dk), b);
    launch_store_tokens(space, pairs.dv, tensor_ref(a.dv), b);
    // 6. The gates.
    if (a.dlog_g) {
      gate_terms backwards, forwards;
      backwards.add(q_out.dG, 1.f);
      backwards.add(pairs.rows, 1.f);
      backwards.add(pairs.cols, -1.f);
      if (states) forwards.add(keys.c, 1.f);
      launch_gate_gradients(space, backwards, forwards, entering, tensor_ref(a.log_g), pb, tensor_ref(a.dlog_g));
    }
  });
}

}  // namespace expanse_kokkos
