// sequence_state: update_state into per-chunk states, scanned over the chunks in place by discumsum
// with the final state written to S (and z), each step through its operation's list; the chunk
// totals summed into A (gpu/kernels/sequence_state.hpp).
#include "gpu/kernels/sequence_state.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/discumsum.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {
namespace {

// The memo slots of the steps' choices (dispatcher::run_step).
enum step_slot { kUpdateState = 1, kDiscumsumS, kDiscumsumZ };

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
  launch_context steps{lc.stream, lc.ws, lc.props, lc.dispatch, lc.call, &shared};
  auto run_step = [&](expanse_op_kind kind, const void* args, const expanse_problem& problem, int slot) {
    const expanse_op step{kind, args, &problem, nullptr};
    lc.dispatch.run_step(step, slot, steps);
  };

  expanse_update_state_args upd{a.k, a.v, a.log_g, &S, z.data ? &z : nullptr, pb.p, pb.c, pb.layout};
  const expanse_problem upd_pb = step_problem(pb, pb.input_dtype, EXPANSE_F32);
  run_step(EXPANSE_OP_UPDATE_STATE, &upd, upd_pb, kUpdateState);

  expanse_tensor A{};
  if (shared.g.total) A = totals_view(shared.g, pb, dev);
  auto scan = [&](expanse_tensor& X, const expanse_tensor* final_state, int64_t rows, int slot) {
    const discumsum_step_args scan_args{{&X, A.data ? &A : nullptr, nullptr, &X}, final_state};
    expanse_problem scan_pb = step_problem(pb, EXPANSE_F32, EXPANSE_F32);
    scan_pb.rows = rows;
    scan_pb.want_final_state = 1;  // the step form (discumsum_step_args)
    run_step(EXPANSE_OP_DISCUMSUM, &scan_args, scan_pb, slot);
  };
  scan(S, a.S, pb.D * pb.e, kDiscumsumS);
  if (z.data) scan(z, a.z, pb.D, kDiscumsumZ);

  if (a.A && !lc.ws.sizing() && pb.b * pb.h > 0) {
    sequence_totals_kernel<<<grid_for(pb.b * pb.h, 128), 128, 0, lc.stream>>>(shared.g, pb.b * pb.h, pb.h, pb.n, *a.A);
    check_launch("sequence_state totals");
  }
}

}  // namespace expanse_gpu
