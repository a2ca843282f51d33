// discumsum: the scan of the chunk states, a kernel shared with the HIP backend
// (gpu/kernels/discumsum.hpp); this file only puts it in the CUDA backend's list.
#include "gpu/kernels/discumsum.hpp"
#include "ops/op_common.hpp"
#include "ops/state_ops.hpp"

namespace expanse_cuda {
namespace {

std::string declines(const expanse_op& op, const device_props&) {
  const auto& a = *static_cast<const expanse_discumsum_args*>(op.args);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.A) || !is_f32(a.Y_init) || !is_f32(a.Y))) why = "A, Y_init and Y must be f32";
  return why;
}

void run(const expanse_op& op, launch_context& lc) {
  if (lc.ws.sizing()) return;
  expanse_gpu::run_discumsum(*static_cast<const expanse_discumsum_args*>(op.args), op.problem->n,
                             op.problem->input_dtype, lc.stream);
}

}  // namespace

const std::vector<implementation>& discumsum_impls() {
  static const std::vector<implementation> list = {{"scan", declines, run}};
  return list;
}

}  // namespace expanse_cuda
