// The flash kernel of chunk_attention (ops/chunk_attention.cu), for the operations that run it as a
// step of their own: power_attention's fused path, and the backward's denominators (an empty in.y:
// l and rowmax alone).
#pragma once

#include <string>

#include "gpu/ops/chunk_attention.hpp"
#include "ops/op_common.hpp"

namespace expanse_cuda {

std::string flash_chunk_attention_declines(const expanse_problem& pb, const attention_inputs& in,
                                           const device_props& props);
void launch_flash_chunk_attention(const attention_inputs& in, const gates& g, const expanse_problem& pb,
                                  launch_context& lc);

}  // namespace expanse_cuda
