// What the implementations of power_attention_backward share (gpu/ops/power_attention_backward.cu):
// the call's plan and the gates' gradient at the end.
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

// dlog_g: the segmented reverse cumulative sum of (q . dq - k . dk) / p from w.qdq, w.kdk, plus
// <dfinal, final> (S_final, z_final; into final_sums [b,h], null without the term) at the last token.
void launch_gate_gradients(const expanse_op& op, const expanse_tensor& S_final, const expanse_tensor& z_final,
                           backward_work w, float* final_sums, launch_context& lc);

}  // namespace expanse_gpu
