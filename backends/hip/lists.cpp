// The HIP backend's lists: for now every operation runs the implementation all GPU backends share
// (gpu/ops/), compiled for AMD GPUs. Faster ones (e.g. on CDNA's matrix cores) go before them,
// tagged with the device features they need (docs/backends.md).
#include "hip/lists.hpp"

#include "gpu/ops/implementations.hpp"

namespace expanse_hip {

expanse_sdk::implementation_lists& hip_lists() {
  static expanse_sdk::implementation_lists lists;
  return lists;
}

const expanse_sdk::dispatcher& hip_dispatcher() {
  static const expanse_sdk::dispatcher dispatcher("hip", hip_lists());
  return dispatcher;
}

namespace {

using expanse_sdk::registered_list;
const registered_list kSympowExpand(hip_lists(), EXPANSE_OP_SYMPOW_EXPAND, {expanse_gpu::sympow_expand_simple});
const registered_list kUpdateState(hip_lists(), EXPANSE_OP_UPDATE_STATE, {expanse_gpu::update_state_simple});
const registered_list kDiscumsum(hip_lists(), EXPANSE_OP_DISCUMSUM, {expanse_gpu::discumsum_scan});
const registered_list kQueryState(hip_lists(), EXPANSE_OP_QUERY_STATE, {expanse_gpu::query_state_simple});
const registered_list kChunkAttention(hip_lists(), EXPANSE_OP_CHUNK_ATTENTION, {expanse_gpu::chunk_attention_simple});
const registered_list kPowerAttention(hip_lists(), EXPANSE_OP_POWER_ATTENTION, {expanse_gpu::power_attention_chunked});
const registered_list kPowerAttentionStep(hip_lists(), EXPANSE_OP_POWER_ATTENTION_STEP,
                                          {expanse_gpu::power_attention_step_streamed, expanse_gpu::power_attention_step_fused,
                                           expanse_gpu::power_attention_step_tokens, expanse_gpu::power_attention_step_attention});
const registered_list kPowerAttentionBackward(hip_lists(), EXPANSE_OP_POWER_ATTENTION_BACKWARD,
                                              {expanse_gpu::power_attention_backward_simple});
const registered_list kUpdateStateBackward(hip_lists(), EXPANSE_OP_UPDATE_STATE_BACKWARD,
                                           {expanse_gpu::update_state_backward_simple});
const registered_list kDiscumsumBackward(hip_lists(), EXPANSE_OP_DISCUMSUM_BACKWARD,
                                         {expanse_gpu::discumsum_backward_simple});
const registered_list kQueryStateBackward(hip_lists(), EXPANSE_OP_QUERY_STATE_BACKWARD,
                                          {expanse_gpu::query_state_backward_simple});
const registered_list kChunkAttentionBackward(hip_lists(), EXPANSE_OP_CHUNK_ATTENTION_BACKWARD,
                                              {expanse_gpu::chunk_attention_backward_simple});
const registered_list kSequenceState(hip_lists(), EXPANSE_OP_SEQUENCE_STATE, {expanse_gpu::sequence_state_chunked});

}  // namespace
}  // namespace expanse_hip
