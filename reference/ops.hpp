// The operations of the reference backend (docs/spec.md "Public operations").
//
// Each takes the problem the core derived and validated (sizes, resolved scale, flags) and the
// op's public args struct, computes in f64 and writes every element of its outputs. Errors are
// reported by throwing (std::bad_alloc, std::logic_error for broken internal invariants); the
// backend's run() turns them into a status and text, so no exception leaves libexpanse.
#ifndef EXPANSE_REFERENCE_OPS_HPP
#define EXPANSE_REFERENCE_OPS_HPP

#include "expanse/backend.h"

namespace expanse_ref {

void sympow_expand(const expanse_problem& pb, const expanse_sympow_expand_args& args);
void update_state(const expanse_problem& pb, const expanse_update_state_args& args);
void discumsum(const expanse_problem& pb, const expanse_discumsum_args& args);
void query_state(const expanse_problem& pb, const expanse_query_state_args& args);
void chunk_attention(const expanse_problem& pb, const expanse_chunk_attention_args& args);
void power_attention(const expanse_problem& pb, const expanse_power_attention_args& args);
void power_attention_step(const expanse_problem& pb, const expanse_power_attention_step_args& args);
void power_attention_backward(const expanse_problem& pb, const expanse_power_attention_backward_args& args);
void update_state_backward(const expanse_problem& pb, const expanse_update_state_backward_args& args);
void discumsum_backward(const expanse_problem& pb, const expanse_discumsum_backward_args& args);
void query_state_backward(const expanse_problem& pb, const expanse_query_state_backward_args& args);
void chunk_attention_backward(const expanse_problem& pb, const expanse_chunk_attention_backward_args& args);
void sequence_state(const expanse_problem& pb, const expanse_sequence_state_args& args);

}  // namespace expanse_ref

#endif  // EXPANSE_REFERENCE_OPS_HPP
