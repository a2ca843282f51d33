// power_attention_step's implementations, best first: "streamed" and "fused" (the first form),
// both the state update and the query in one pass over the state (gpu/kernels/power_attention_step.hpp).
#include <algorithm>
#include <cstdint>

#include "gpu/kernels/power_attention_step.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {

std::string power_attention_step_fused_declines(const expanse_op& op, const device_props&) {
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.S) || !is_f32(a.z))) why = "log_g, S and z must be f32";
  return why;
}

std::string power_attention_step_streamed_declines(const expanse_op& op, const device_props& props) {
  std::string why = power_attention_step_fused_declines(op, props);
  const expanse_problem& pb = *op.problem;
  if (why.empty() && pb.hq / pb.h > kStreamMaxGroup)
    why = "takes at most " + std::to_string(kStreamMaxGroup) + " query heads per kv head";
  if (why.empty() && pb.e > 4 * kStreamThreads) why = "takes e <= " + std::to_string(4 * kStreamThreads);
  return why;
}

// The per-row-block partial sums both forms write for step_output_kernel: step_sum_t of the input type.
static void* take_step_partials(const expanse_problem& pb, int64_t row_blocks, workspace& ws) {
  size_t bytes = 0;
  with_input_type(pb.input_dtype, [&](auto tag) { bytes = sizeof(step_sum_t<decltype(tag)>); });
  return ws.take<unsigned char>(size_t(pb.b * pb.hq * row_blocks * (pb.e + 1)) * bytes);
}

void power_attention_step_streamed_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  // Rows per block: kStreamRows, or fewer where that would leave SMs with less than four blocks (at b = 1
  // the P1 state is 8 heads x 17 blocks of 128 rows, about one block per SM of an H100).
  int block_rows = kStreamRows;
  auto blocks_of = [&](int rows) { return pb.b * pb.h * ((pb.D + rows - 1) / rows); };
  while (block_rows > 32 && blocks_of(block_rows) < 4 * int64_t(std::max(lc.props.multiprocessors, 1))) block_rows /= 2;
  const int64_t row_blocks = (pb.D + block_rows - 1) / block_rows;
  void* partial = take_step_partials(pb, row_blocks, lc.ws);
  if (lc.ws.sizing()) return;
  const int64_t blocks = pb.b * pb.h * row_blocks;
  if (blocks == 0) return;
  int quads = 1;
  while (4 * quads < pb.e) quads *= 2;
  const expanse_tensor& S = *a.S;
  const int vec = S.strides[3] == 1 && pb.e % 4 == 0 && S.strides[2] % 4 == 0 && S.strides[1] % 4 == 0 &&
                  S.strides[0] % 4 == 0 && reinterpret_cast<uintptr_t>(S.data) % 16 == 0;
  expanse_tensor none{};
  const int64_t group = pb.hq / pb.h;
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), kStreamThreads, 0, lc.stream>>>(
          *a.q, *a.k, *a.v, a.log_g ? *a.log_g : none, S, a.z ? *a.z : none, table, pb, static_cast<float>(pb.scale),
          static_cast<step_sum_t<T>*>(partial), row_blocks, block_rows, quads, vec);
    };
    if (group == 1) launch(step_stream_kernel<T, 1>);
    else if (group == 2) launch(step_stream_kernel<T, 2>);
    else if (group <= 4) launch(step_stream_kernel<T, 4>);
    else launch(step_stream_kernel<T, kStreamMaxGroup>);
    check_launch("power_attention_step streamed");
    step_output_kernel<T><<<step_output_blocks(pb), kStepOutputThreads, 0, lc.stream>>>(
        static_cast<step_sum_t<T>*>(partial), *a.o, pb, row_blocks, pb.normalize);
    check_launch("power_attention_step output");
  });
}

void power_attention_step_fused_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const int64_t row_blocks = (pb.D + kStepRowsPerThread - 1) / kStepRowsPerThread;
  const int64_t col_groups = (pb.e + 1 + kStepThreads - 1) / kStepThreads;
  void* partial = take_step_partials(pb, row_blocks, lc.ws);
  if (lc.ws.sizing()) return;
  expanse_tensor none{};
  const expanse_tensor z = a.z ? *a.z : none;
  const int64_t blocks = pb.b * pb.h * row_blocks * col_groups;
  if (blocks == 0) return;
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    step_update_kernel<T><<<static_cast<unsigned>(blocks), kStepThreads, 0, lc.stream>>>(
        *a.q, *a.k, *a.v, a.log_g ? *a.log_g : none, *a.S, z, table, pb, static_cast<float>(pb.scale),
        static_cast<step_sum_t<T>*>(partial), row_blocks, col_groups);
    check_launch("power_attention_step update");
    step_output_kernel<T><<<step_output_blocks(pb), kStepOutputThreads, 0, lc.stream>>>(
        static_cast<step_sum_t<T>*>(partial), *a.o, pb, row_blocks, pb.normalize);
    check_launch("power_attention_step output");
  });
}

}  // namespace expanse_gpu
