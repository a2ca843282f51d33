// What the implementations of power_attention_backward share (gpu/ops/power_attention_backward.cu):
// the call's plan, its workspace arrays, the forward sweep, the reverse scan of the state cotangents
// and the gates' gradient at the end.
#pragma once

#include "gpu/kernels/backward_simple.hpp"
#include "gpu/ops/chunk_states.hpp"
#include "gpu/ops/common.hpp"

namespace expanse_gpu {

struct backward_plan {
  bool forward_states;    // some chunk starts from a state (n > 1 or an initial state)
  bool cotangent_states;  // some chunk's keys see a state cotangent (n > 1, or dfinal/dinitial)
  bool need_z;            // the normalizer states take part
  bool cotangent_z;       // the state cotangents have a z part (dZ: need_z or dinitial_z wanted)
  bool final_term;        // dlog_g needs <dfinal, final state>
};
backward_plan plan_backward(const expanse_op& op);

// The per-token arrays of backward_work (dden, q . dq, k . dk; dnum where with_dnum, 1 / den where
// with_rden).
backward_work take_backward_work(const expanse_problem& pb, bool with_rden, bool with_dnum, workspace& ws);

// The state cotangents st.dY, st.dZ [b,n,h,D(,e)] where plan.cotangent_states (dZ where
// plan.cotangent_z).
void take_cotangent_states(const expanse_op& op, const backward_plan& plan, workspace& ws, backward_states& st);

// The forward sweep: update_state then discumsum in place through the backend's lists, as the forward
// runs them, or update_state by `update` where given (a launcher whose states are more accurate than
// the forward's: the state terms of the gradients cancel and magnify a b16 rounding of the states).
// S, z enter each chunk [b,n,h,D(,e)] (null data without forward states); S_final, z_final where
// plan.final_term. Its steps take the memo slots 1..kForwardSweepSlots.
struct forward_sweep {
  expanse_tensor S, z, S_final, z_final;
};
constexpr int kForwardSweepSlots = 3;
forward_sweep recompute_forward_states(const expanse_op& op, const backward_plan& plan, const step_inputs& shared,
                                       launch_context& lc, update_state_launcher update = nullptr);

// The gates' boundary terms [b,h,n] in f64 (reverse_scan_kernel), taken from the workspace where the
// call wants dlog_g and has state cotangents; null otherwise.
double* take_boundary_sums(const expanse_op& op, const backward_plan& plan, workspace& ws);

// The reverse scan of the state cotangents over st.dY, st.dZ (chunk inputs in place, or summed over the
// query heads from Xs, Xz where their data is set), dinitial_S/z, and the boundary terms.
// Without `with_final` (expanse_power_attention_backward_exchange) the scan starts from zero whatever
// dfinal holds, and the boundary terms wait for launch_final_cotangent.
void launch_reverse_scan(const expanse_op& op, const backward_states& st, const expanse_tensor& Xs,
                         const expanse_tensor& Xz, const forward_sweep& fw, const gates& g, double* boundary,
                         launch_context& lc, bool with_final = true);
// After a scan without the final state's cotangent, once dfinal holds it: its decayed share added to
// every chunk's cotangent and to dinitial (the scan is linear in its start), then the boundary terms.
void launch_final_cotangent(const expanse_op& op, const backward_states& st, const forward_sweep& fw, const gates& g,
                            double* boundary, launch_context& lc);

// dlog_g: chunk by chunk, the segmented reverse cumulative sum of (q . dq - k . dk) / p from w.qdq,
// w.kdk, started from the chunk's boundary term (null: none).
void launch_gate_gradients(const expanse_op& op, const double* boundary, backward_work w, launch_context& lc);

}  // namespace expanse_gpu
