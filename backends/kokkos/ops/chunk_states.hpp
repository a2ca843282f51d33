// Step 2 of the chunked algorithm inside a composed operation (power_attention, sequence_state):
// update_state into the per-chunk states, then the scan over the chunks in place.
#pragma once

#include "kokkos/kernels/discumsum.hpp"
#include "kokkos/kernels/gates.hpp"
#include "kokkos/kernels/update_state.hpp"
#include "kokkos/ops/common.hpp"

namespace expanse_kokkos {

// S [b,n,h,D,e] and z [b,n,h,D] (null: no normalizer states) are contiguous f32 buffers: S_m becomes
// the state entering chunk m; the state after the last chunk goes to final_S / final_z (null: not
// wanted). A [b,n,h] holds the chunk totals (null without gates).
template <class Space>
void launch_chunk_states(const Space& space, tensor_ref k, tensor_ref v, gate_sums g, const phi_row* table,
                         const expanse_problem& pb, float* S, float* z, float* A, const expanse_tensor* initial_S,
                         const expanse_tensor* initial_z, const expanse_tensor* final_S, const expanse_tensor* final_z) {
  const int64_t b = pb.b, n = pb.n, h = pb.h, D = pb.D, e = pb.e;
  const tensor_ref S_ref = f32_buffer(S, {b, n, h, D, e}), z_ref = z ? f32_buffer(z, {b, n, h, D}) : tensor_ref{};
  launch_update_state(space, k, v, g, table, pb, S_ref, z_ref);
  if (A) launch_chunk_totals(space, g, b, h, n, A);
  const tensor_ref A_ref = A ? f32_buffer(A, {b, n, h}) : tensor_ref{};
  auto scan = [&](const state_ref& X, int64_t elems, const expanse_tensor* initial, const expanse_tensor* final_state) {
    launch_discumsum(space, X, A_ref, state_of(initial, false), X, state_of(final_state, false), b, n, h, elems);
  };
  scan(chunk_states_of(S_ref, {b, n, h, D, e}), D * e, initial_S, final_S);
  if (z) scan(chunk_states_of(z_ref, {b, n, h, D}), D, initial_z, final_z);
}

}  // namespace expanse_kokkos
