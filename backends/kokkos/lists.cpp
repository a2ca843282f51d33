// The Kokkos backend's lists: one implementation per operation (ops/implementations.hpp).
#include "kokkos/lists.hpp"

#include "kokkos/ops/implementations.hpp"

namespace expanse_kokkos {

expanse_sdk::implementation_lists& kokkos_lists() {
  static expanse_sdk::implementation_lists lists;
  return lists;
}

const expanse_sdk::dispatcher& kokkos_dispatcher() {
  static const expanse_sdk::dispatcher dispatcher("kokkos", kokkos_lists());
  return dispatcher;
}

namespace {

using expanse_sdk::registered_list;
const registered_list kSympowExpand(kokkos_lists(), EXPANSE_OP_SYMPOW_EXPAND, {sympow_expand_teams});
const registered_list kUpdateState(kokkos_lists(), EXPANSE_OP_UPDATE_STATE, {update_state_teams});
const registered_list kDiscumsum(kokkos_lists(), EXPANSE_OP_DISCUMSUM, {discumsum_scan});
const registered_list kQueryState(kokkos_lists(), EXPANSE_OP_QUERY_STATE, {query_state_teams});
const registered_list kChunkAttention(kokkos_lists(), EXPANSE_OP_CHUNK_ATTENTION, {chunk_attention_teams});
const registered_list kPowerAttention(kokkos_lists(), EXPANSE_OP_POWER_ATTENTION, {power_attention_chunked});
const registered_list kPowerAttentionStep(kokkos_lists(), EXPANSE_OP_POWER_ATTENTION_STEP,
                                          {power_attention_step_teams, power_attention_step_attention});
const registered_list kPowerAttentionBackward(kokkos_lists(), EXPANSE_OP_POWER_ATTENTION_BACKWARD,
                                              {power_attention_backward_chunked});
const registered_list kUpdateStateBackward(kokkos_lists(), EXPANSE_OP_UPDATE_STATE_BACKWARD, {update_state_backward_teams});
const registered_list kDiscumsumBackward(kokkos_lists(), EXPANSE_OP_DISCUMSUM_BACKWARD, {discumsum_backward_scan});
const registered_list kQueryStateBackward(kokkos_lists(), EXPANSE_OP_QUERY_STATE_BACKWARD, {query_state_backward_teams});
const registered_list kChunkAttentionBackward(kokkos_lists(), EXPANSE_OP_CHUNK_ATTENTION_BACKWARD,
                                              {chunk_attention_backward_teams});
const registered_list kSequenceState(kokkos_lists(), EXPANSE_OP_SEQUENCE_STATE, {sequence_state_chunked});

}  // namespace
}  // namespace expanse_kokkos
