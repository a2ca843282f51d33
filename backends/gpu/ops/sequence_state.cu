// sequence_state: update_state into per-chunk states, scanned over the chunks in place by discumsum
// with the final state written to S (and z) (gpu/ops/chunk_states.hpp); the chunk totals summed into
// A (gpu/kernels/sequence_state.hpp).
#include "gpu/kernels/sequence_state.hpp"
#include "gpu/ops/chunk_states.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {
namespace {

// The first memo slot of run_chunk_states' steps (dispatcher::run_step).
constexpr int kUpdateState = 1;

}  // namespace

std::string sequence_state_chunked_declines(const expanse_op& op, const device_props&) {
  const auto& a = args_of<expanse_sequence_state_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.S) || !is_f32(a.z) || !is_f32(a.A)))
    why = "log_g, S, z and A must be f32";
  return why;
}

void sequence_state_chunked_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_sequence_state_args>(op);
  const expanse_tensor& dev = *a.k;  // the device of the workspace views

  step_inputs shared;
  shared.phi = make_phi_tables(pb, lc);
  shared.g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  expanse_tensor S = f32_view(lc.ws.take<float>(size_t(pb.b * pb.n * pb.h * pb.D * pb.e)), {pb.b, pb.n, pb.h, pb.D, pb.e}, dev);
  expanse_tensor z{};
  if (a.z) z = f32_view(lc.ws.take<float>(size_t(pb.b * pb.n * pb.h * pb.D)), {pb.b, pb.n, pb.h, pb.D}, dev);
  run_chunk_states(pb, {a.k, a.v, a.log_g, S, z, nullptr, nullptr, a.S, a.z}, shared, lc, kUpdateState);

  if (a.A && !lc.ws.sizing() && pb.b * pb.h > 0) {
    sequence_totals_kernel<<<grid_for(pb.b * pb.h, 128), 128, 0, lc.stream>>>(shared.g, pb.b * pb.h, pb.h, pb.n, *a.A);
    check_launch("sequence_state totals");
  }
}

}  // namespace expanse_gpu
