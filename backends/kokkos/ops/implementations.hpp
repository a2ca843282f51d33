// The Kokkos backend's implementations, one per operation (lists.cpp registers them), each in
// ops/<operation>.cpp over its kernel in kernels/<operation>.hpp.
#pragma once

#include <string>

#include "sdk/implementation.hpp"

namespace expanse_kokkos {

#define EXPANSE_KOKKOS_IMPLEMENTATION(var, name)                                                      \
  std::string var##_declines(const expanse_op& op, const expanse_sdk::device_props& props);           \
  void var##_run(const expanse_op& op, expanse_sdk::launch_context& lc);                              \
  inline constexpr expanse_sdk::implementation var{name, expanse_sdk::any_device, var##_declines, var##_run};

EXPANSE_KOKKOS_IMPLEMENTATION(sympow_expand_teams, "teams")
EXPANSE_KOKKOS_IMPLEMENTATION(update_state_teams, "teams")
EXPANSE_KOKKOS_IMPLEMENTATION(discumsum_scan, "scan")
EXPANSE_KOKKOS_IMPLEMENTATION(query_state_teams, "teams")
EXPANSE_KOKKOS_IMPLEMENTATION(chunk_attention_teams, "teams")
// The chunked algorithm composed of the kernels above (the quadratic form is one chunk).
EXPANSE_KOKKOS_IMPLEMENTATION(power_attention_chunked, "chunked")
EXPANSE_KOKKOS_IMPLEMENTATION(power_attention_step_teams, "teams")
// Any number of tokens, as power_attention through the list above (sdk/step_through_attention.hpp).
EXPANSE_KOKKOS_IMPLEMENTATION(power_attention_step_attention, "attention")
// The gradients (docs/spec.md "Gradients"), power_attention_backward in the chunked form.
EXPANSE_KOKKOS_IMPLEMENTATION(power_attention_backward_chunked, "chunked")
EXPANSE_KOKKOS_IMPLEMENTATION(update_state_backward_teams, "teams")
EXPANSE_KOKKOS_IMPLEMENTATION(discumsum_backward_scan, "scan")
EXPANSE_KOKKOS_IMPLEMENTATION(query_state_backward_teams, "teams")
EXPANSE_KOKKOS_IMPLEMENTATION(chunk_attention_backward_teams, "teams")
// A sequence's state from zero (context parallelism), composed of update_state and discumsum.
EXPANSE_KOKKOS_IMPLEMENTATION(sequence_state_chunked, "chunked")

#undef EXPANSE_KOKKOS_IMPLEMENTATION

}  // namespace expanse_kokkos
