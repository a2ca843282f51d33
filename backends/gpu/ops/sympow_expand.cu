// sympow_expand: one thread per output entry (gpu/kernels/sympow_expand.hpp).
#include "gpu/kernels/sympow_expand.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {

std::string sympow_expand_simple_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void sympow_expand_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_sympow_expand_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  if (lc.ws.sizing() || pb.rows * pb.D == 0) return;
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    sympow_expand_kernel<T><<<grid_for(pb.rows * pb.D, 256), 256, 0, lc.stream>>>(*a.x, *a.out, table, pb.rows, pb.D, pb.p);
  });
  check_launch("sympow_expand");
}

}  // namespace expanse_gpu
