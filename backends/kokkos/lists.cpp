// The Kokkos backend's lists: one implementation per forward operation for now. The backward
// operations have none yet ("no implementation of this operation").
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
const registered_list kPowerAttentionStep(kokkos_lists(), EXPANSE_OP_POWER_ATTENTION_STEP, {power_attention_step_teams});

}  // namespace
}  // namespace expanse_kokkos
