// What every implementation of query_state reads from its arguments (the SIMT one here, the
// tensor-core ones of the CUDA backend).
#pragma once

#include <string>

#include "gpu/kernels/query_state_simple.hpp"
#include "gpu/ops/common.hpp"

namespace expanse_gpu {

// The tensors of the args; S absent (only in a step of power_attention without states): no
// inter-chunk term.
query_inputs query_inputs_of(const expanse_query_state_args& a);
std::string query_state_f32_declines(const expanse_query_state_args& a);
// scale^p, applied to phi(q)^T S once per output.
float scale_power(const expanse_problem& pb);

}  // namespace expanse_gpu
