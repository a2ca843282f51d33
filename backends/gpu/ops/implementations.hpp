// The implementations every GPU backend has, written once against gpu/vendor.hpp: the SIMT ("simple")
// kernels of each operation, discumsum's scan and the composed operations. They take any shape and
// dtype the core accepts, so a backend's list ends with them (docs/backends.md). Their functions
// live in gpu/ops/<operation>.cu.
#pragma once

#include <string>

#include "sdk/implementation.hpp"

namespace expanse_gpu {

#define EXPANSE_GPU_IMPLEMENTATION(var, name)                                                         \
  std::string var##_declines(const expanse_op& op, const expanse_sdk::device_props& props);           \
  void var##_run(const expanse_op& op, expanse_sdk::launch_context& lc);                              \
  inline constexpr expanse_sdk::implementation var{name, expanse_sdk::any_device, var##_declines, var##_run};

EXPANSE_GPU_IMPLEMENTATION(sympow_expand_simple, "simple")
EXPANSE_GPU_IMPLEMENTATION(update_state_simple, "simple")
EXPANSE_GPU_IMPLEMENTATION(discumsum_scan, "scan")
EXPANSE_GPU_IMPLEMENTATION(query_state_simple, "simple")
EXPANSE_GPU_IMPLEMENTATION(chunk_attention_simple, "simple")
// The chunked algorithm composed of the operations above, each step through the backend's list; with
// the exchanging form of expanse_power_attention_exchange.
std::string power_attention_chunked_declines(const expanse_op& op, const expanse_sdk::device_props& props);
void power_attention_chunked_run(const expanse_op& op, expanse_sdk::launch_context& lc);
void power_attention_chunked_run_exchanging(const expanse_op& op, expanse_sdk::launch_context& lc,
                                            const expanse_sdk::exchange_call& exchange);
inline constexpr expanse_sdk::implementation power_attention_chunked{
    "chunked", expanse_sdk::any_device, power_attention_chunked_declines, power_attention_chunked_run,
    power_attention_chunked_run_exchanging};
EXPANSE_GPU_IMPLEMENTATION(power_attention_step_streamed, "streamed")
EXPANSE_GPU_IMPLEMENTATION(power_attention_step_fused, "fused")
// A few tokens (t x query heads per kv head bounded by shared memory) in one pass over the state.
EXPANSE_GPU_IMPLEMENTATION(power_attention_step_tokens, "tokens")
// Any number of tokens, as power_attention through the backend's list (sdk/step_through_attention.hpp).
EXPANSE_GPU_IMPLEMENTATION(power_attention_step_attention, "attention")
// The gradients, with the forward states made by the lists above.
EXPANSE_GPU_IMPLEMENTATION(power_attention_backward_simple, "simple")
EXPANSE_GPU_IMPLEMENTATION(update_state_backward_simple, "simple")
EXPANSE_GPU_IMPLEMENTATION(discumsum_backward_simple, "simple")
EXPANSE_GPU_IMPLEMENTATION(query_state_backward_simple, "simple")
EXPANSE_GPU_IMPLEMENTATION(chunk_attention_backward_simple, "simple")
// A sequence's state from zero (context parallelism), composed of update_state and discumsum.
EXPANSE_GPU_IMPLEMENTATION(sequence_state_chunked, "chunked")

#undef EXPANSE_GPU_IMPLEMENTATION

}  // namespace expanse_gpu
