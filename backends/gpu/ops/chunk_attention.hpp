// What every implementation of chunk_attention reads from its arguments (the SIMT one here, the
// flash kernel of the CUDA backend).
#pragma once

#include <string>

#include "gpu/kernels/chunk_attention_simple.hpp"
#include "gpu/ops/common.hpp"

namespace expanse_gpu {

attention_inputs attention_inputs_of(const expanse_chunk_attention_args& a);
std::string chunk_attention_f32_declines(const expanse_chunk_attention_args& a);

}  // namespace expanse_gpu
