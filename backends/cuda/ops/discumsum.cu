// discumsum: the scan of the chunk states, a kernel shared with the HIP backend
// (gpu/kernels/discumsum.hpp); this file only puts it in the CUDA backend's list.
#include "gpu/kernels/discumsum.hpp"
#include "ops/op_common.hpp"
#include "ops/state_ops.hpp"

namespace expanse_cuda {
namespace {

std::string declines(const expanse_op& op, const device_props&) {
  const auto& a = args_of<expanse_discumsum_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.A) || !is_f32(a.Y_init) || !is_f32(a.Y))) why = "A, Y_init and Y must be f32";
  return why;
}

void run(const expanse_op& op, launch_context& lc) {
  if (lc.ws.sizing()) return;
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_discumsum_args>(op);
  if (!pb.want_final_state) {
    expanse_gpu::run_discumsum(a, pb.n, pb.input_dtype, lc.stream);
    return;
  }
  const auto& step = args_of<discumsum_step_args>(op);  // power_attention's step
  expanse_gpu::launch_discumsum(*a.X, a.A ? *a.A : expanse_tensor{}, expanse_gpu::with_chunk_axis(a.Y_init), *a.Y,
                                expanse_gpu::with_chunk_axis(step.final_state), pb.n, pb.input_dtype, lc.stream);
}

const registered_list kList(cuda_lists(), EXPANSE_OP_DISCUMSUM, {{"scan", expanse_sdk::any_device, declines, run}});

}  // namespace
}  // namespace expanse_cuda
