// The steps of power_attention_backward that its implementations share (gpu/ops/power_attention_backward.cu):
// what the call needs, the forward sweep, the gates' gradient at the end.
#pragma once

#include "gpu/kernels/backward_simple.hpp"
#include "gpu/ops/common.hpp"

namespace expanse_gpu {

struct backward_plan {
  bool forward_states;    // some chunk starts from a state (n > 1 or an initial state)
  bool cotangent_states;  // some chunk's keys see a state cotangent (n > 1, or dfinal/dinitial)
  bool need_z;            // the normalizer states take part
  bool final_term;        // dlog_g needs <dfinal, final state>
};
backward_plan plan_backward(const expanse_op& op);

// The forward sweep: update_state then discumsum in place through the backend's lists, as the forward
// runs them. S, z enter each chunk [b,n,h,D(,e)] (null data without forward states); S_final, z_final
// where plan.final_term. Its steps take the memo slots 1..kForwardSweepSlots.
struct forward_sweep {
  expanse_tensor S, z, S_final, z_final;
};
constexpr int kForwardSweepSlots = 3;
forward_sweep recompute_forward_states(const expanse_op& op, const backward_plan& plan, const step_inputs& shared,
                                       launch_context& lc);

// dlog_g: <dfinal, final> per head (into final_sums, from take_final_sums) and the segmented reverse
// cumulative sum of (q . dq - k . dk) / p from w.qdq, w.kdk.
float* take_final_sums(const expanse_op& op, const backward_plan& plan, workspace& ws);
void launch_gate_gradients(const expanse_op& op, const forward_sweep& fw, backward_work w, float* final_sums,
                           launch_context& lc);

}  // namespace expanse_gpu
