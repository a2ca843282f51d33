// Step 2 of the chunked algorithm inside a composed operation (gpu/ops/chunk_states.hpp).
#include "gpu/ops/chunk_states.hpp"
#include "gpu/ops/discumsum.hpp"

namespace expanse_gpu {

void run_chunk_states(const expanse_problem& pb, const chunk_states_args& c, const step_inputs& shared,
                      launch_context& lc, int first_slot, update_state_launcher update) {
  launch_context steps{lc.stream, lc.ws, lc.props, lc.dispatch, lc.call, &shared};
  expanse_tensor S = c.S, z = c.z;
  expanse_update_state_args upd{c.k, c.v, c.log_g, &S, z.data ? &z : nullptr, pb.p, pb.c, pb.layout};
  const expanse_problem upd_pb = step_problem(pb, pb.input_dtype, EXPANSE_F32);
  if (!update) lc.dispatch.run_step({EXPANSE_OP_UPDATE_STATE, &upd, &upd_pb, nullptr}, first_slot, steps);
  else if (!lc.ws.sizing()) update(*c.k, *c.v, shared.g, shared.phi, upd_pb, S, z.data ? &z : nullptr, steps);

  expanse_tensor A{};
  if (shared.g.total) A = totals_view(shared.g, pb, *c.k);
  auto scan = [&](expanse_tensor& X, const expanse_tensor* initial, const expanse_tensor* final_state, int64_t rows,
                  int slot) {
    const discumsum_step_args scan_args{{&X, A.data ? &A : nullptr, initial, &X}, final_state};
    expanse_problem scan_pb = step_problem(pb, EXPANSE_F32, EXPANSE_F32);
    scan_pb.rows = rows;
    scan_pb.has_initial_state = initial != nullptr;
    scan_pb.want_final_state = 1;  // the step form (discumsum_step_args)
    lc.dispatch.run_step({EXPANSE_OP_DISCUMSUM, &scan_args, &scan_pb, nullptr}, slot, steps);
  };
  scan(S, c.initial_S, c.final_S, pb.D * pb.e, first_slot + 1);
  if (z.data) scan(z, c.initial_z, c.final_z, pb.D, first_slot + 2);
}

}  // namespace expanse_gpu
