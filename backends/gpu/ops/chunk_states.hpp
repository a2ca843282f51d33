// Step 2 of the chunked algorithm inside a composed operation (power_attention, the forward sweep of
// its backward, sequence_state): update_state of k, v into the per-chunk states, then discumsum in
// place, each through the backend's list.
#pragma once

#include "gpu/ops/common.hpp"

namespace expanse_gpu {

// update_state's launcher where a composed operation replaces the list (the backward's forward sweep:
// states more accurate than the forward's).
using update_state_launcher = void (*)(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                       const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                       const expanse_tensor* z, launch_context& lc);
// The SIMT update_state kernel as such a launcher (gpu/ops/update_state.cu): f32 sums of f32 products,
// the states the SIMT backward sweeps with on every GPU backend.
void launch_simple_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                                const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                                launch_context& lc);

struct chunk_states_args {
  const expanse_tensor* k;
  const expanse_tensor* v;
  const expanse_tensor* log_g;
  expanse_tensor S;               // [b,n,h,D,e] f32 workspace: S_m becomes the state entering chunk m
  expanse_tensor z;               // [b,n,h,D] likewise; null data: no normalizer states
  const expanse_tensor* initial_S;  // null: none (likewise below)
  const expanse_tensor* initial_z;
  const expanse_tensor* final_S;  // the state after the last chunk
  const expanse_tensor* final_z;
};

// Runs the step for `pb` (the composed problem) with `shared`'s phi tables and gates, in the memo slots
// first_slot (update_state), first_slot + 1 (the scan of S) and first_slot + 2 (of z); `update`
// replaces update_state's list where given.
void run_chunk_states(const expanse_problem& pb, const chunk_states_args& c, const step_inputs& shared,
                      launch_context& lc, int first_slot, update_state_launcher update = nullptr);

// power_attention's chunked form (gpu/ops/power_attention.cu) with `update` in place of update_state's
// list for its states (null: the list), and the exchange of expanse_power_attention_exchange (null: a
// plain call): for a backend whose list makes states too coarse for the queries' normalizers.
void power_attention_chunked_run_with(const expanse_op& op, launch_context& lc, update_state_launcher update,
                                      const expanse_sdk::exchange_call* exchange);

}  // namespace expanse_gpu
