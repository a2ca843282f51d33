// power_attention_step on the Kokkos backend: one token by its own kernels
// (kernels/power_attention_step.hpp); several as power_attention (sdk/step_through_attention.hpp).
#include "kokkos/kernels/power_attention_step.hpp"
#include "kokkos/ops/common.hpp"
#include "kokkos/ops/implementations.hpp"
#include "sdk/step_through_attention.hpp"

namespace expanse_kokkos {

std::string power_attention_step_teams_declines(const expanse_op& op, const device_props&) {
  std::string why = common_declines(op);
  if (why.empty()) why = expanse_sdk::one_token_declines(*op.problem);
  return why;
}

void power_attention_step_teams_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  const phi_row* table = make_phi_table(pb, op, lc);
  if (lc.ws.sizing() || pb.b * pb.h == 0) return;
  on_space(op, lc, [&](auto space) {
    launch_power_attention_step(space, {tensor_ref(a.q)}, {tensor_ref(a.k)}, {tensor_ref(a.v)}, {tensor_ref(a.log_g)},
                                table, pb, tensor_ref(a.S), tensor_ref(a.z), {tensor_ref(a.o)});
  });
}

std::string power_attention_step_attention_declines(const expanse_op& op, const device_props&) {
  return common_declines(op);
}

void power_attention_step_attention_run(const expanse_op& op, launch_context& lc) {
  expanse_sdk::run_step_through_attention(op, lc, [](const expanse_tensor& from, const expanse_tensor& to,
                                                     launch_context& lc) {
    on_space(lc.call, lc, [&](auto space) { launch_copy_state(space, tensor_ref(&from), from, to); });
  });
}

}  // namespace expanse_kokkos
