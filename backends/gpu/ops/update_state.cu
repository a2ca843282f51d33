// update_state's SIMT implementation (gpu/kernels/update_state_simple.hpp): any shape and dtype.
#include "gpu/kernels/update_state_simple.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {

std::string update_state_simple_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void update_state_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  const int64_t work = pb.b * pb.n * pb.h * pb.D * (pb.e + 1);
  if (work == 0) return;
  const expanse_tensor z = a.z ? *a.z : expanse_tensor{};  // data null: no z
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    simple_update_state_kernel<T><<<grid_for(work, 256), 256, 0, lc.stream>>>(*a.k, *a.v, g.keys(), table, pb, *a.S, z);
  });
  check_launch("simple update_state");
}

}  // namespace expanse_gpu
