// power_attention_step's implementations, best first: for one token "streamed" and "fused" (the
// first form), for a few "tokens", each the state update and the query in one pass over the state
// (gpu/kernels/power_attention_step.hpp); for any number "attention", as power_attention through the
// backend's list (sdk/step_through_attention.hpp).
#include <algorithm>
#include <cstdint>

#include "gpu/kernels/power_attention_step.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/implementations.hpp"
#include "sdk/step_through_attention.hpp"

namespace expanse_gpu {

std::string power_attention_step_attention_declines(const expanse_op& op, const device_props&) {
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.S) || !is_f32(a.z))) why = "log_g, S and z must be f32";
  return why;
}

void power_attention_step_attention_run(const expanse_op& op, launch_context& lc) {
  expanse_sdk::run_step_through_attention(op, lc, [](const expanse_tensor& from, const expanse_tensor& to,
                                                     launch_context& lc) {
    const int64_t heads = from.shape[0] * from.shape[1];
    if (heads == 0) return;
    copy_state_kernel<<<static_cast<unsigned>(std::min<int64_t>(heads, 65535)), kCopyStateThreads, 0, lc.stream>>>(
        from, static_cast<float*>(to.data), dense_from(from, 2));
    check_launch("power_attention_step copy state");
  });
}

std::string power_attention_step_fused_declines(const expanse_op& op, const device_props& props) {
  std::string why = power_attention_step_attention_declines(op, props);
  if (why.empty()) why = expanse_sdk::one_token_declines(*op.problem);
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

// The per-row-block partial sums every form writes for step_output_kernel: step_sum_t of the input type.
static void* take_step_partials(const expanse_problem& pb, int64_t row_blocks, workspace& ws) {
  size_t bytes = 0;
  with_input_type(pb.input_dtype, [&](auto tag) { bytes = sizeof(step_sum_t<decltype(tag)>); });
  return ws.take<unsigned char>(size_t(pb.b * pb.hq * pb.t * row_blocks * (pb.e + 1)) * bytes);
}

// Rows per block: `most`, or fewer (down to `least`) where that would leave SMs with less than four
// blocks (at b = 1 the P1 state is 8 heads x 17 blocks of 128 rows, about one block per SM of an H100).
static int rows_per_block(const expanse_problem& pb, const device_props& props, int most, int least) {
  int rows = most;
  auto blocks_of = [&](int r) { return pb.b * pb.h * ((pb.D + r - 1) / r); };
  while (rows > least && blocks_of(rows) < 4 * int64_t(std::max(props.multiprocessors, 1))) rows /= 2;
  return rows;
}

// Lanes per state row of 4 columns each (= kStreamThreads = kTokensThreads at most).
static int column_quads(const expanse_problem& pb) { return step_column_quads(pb.e); }

// Whether the state's rows are 16-byte aligned runs of e % 4 == 0 floats (float4 access).
static int vector_rows(const expanse_problem& pb, const expanse_tensor& S) {
  return S.strides[3] == 1 && pb.e % 4 == 0 && S.strides[2] % 4 == 0 && S.strides[1] % 4 == 0 &&
         S.strides[0] % 4 == 0 && reinterpret_cast<uintptr_t>(S.data) % 16 == 0;
}

// The shared memory step_tokens_kernel takes for the problem's t and group.
static size_t step_tokens_bytes(const expanse_problem& pb) {
  size_t bytes = 0;
  with_input_type(pb.input_dtype, [&](auto tag) { bytes = step_tokens_smem<decltype(tag)>(pb).bytes(); });
  return bytes;
}
constexpr size_t kTokensSharedBytes = 48 * 1024;  // without the opt-in that larger blocks need

std::string power_attention_step_tokens_declines(const expanse_op& op, const device_props& props) {
  std::string why = power_attention_step_attention_declines(op, props);
  const expanse_problem& pb = *op.problem;
  // (e <= 128: a thread's rows of a tile, 32 / (256 / quads), at most kTokensBatch)
  constexpr int kMaxE = 4 * kTokensBatch * kTokensThreads / kTokensTileRows;
  if (why.empty() && pb.e > kMaxE) why = "takes e <= " + std::to_string(kMaxE);
  const int64_t queries = pb.t * (pb.hq / pb.h), most = kTokensSlots * (kTokensThreads / column_quads(pb));
  if (why.empty() && queries > most)
    why = "takes t x (query heads per kv head) <= " + std::to_string(most) + " at e = " + std::to_string(pb.e) +
          ", got " + std::to_string(queries);
  const size_t bytes = step_tokens_bytes(pb);
  if (why.empty() && bytes > kTokensSharedBytes)
    why = "needs " + std::to_string(bytes) + " bytes of shared memory for t = " + std::to_string(pb.t) + " (at most " +
          std::to_string(kTokensSharedBytes) + ")";
  return why;
}

void power_attention_step_tokens_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const int block_rows = rows_per_block(pb, lc.props, 8 * kTokensTileRows, kTokensTileRows);
  const int64_t row_blocks = (pb.D + block_rows - 1) / block_rows;
  void* partial = take_step_partials(pb, row_blocks, lc.ws);
  if (lc.ws.sizing()) return;
  const int64_t blocks = pb.b * pb.h * row_blocks;
  if (blocks == 0 || pb.t == 0) return;
  expanse_tensor none{};
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    const int quads = column_quads(pb);
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), kTokensThreads, step_tokens_bytes(pb), lc.stream>>>(
          *a.q, *a.k, *a.v, a.log_g ? *a.log_g : none, *a.S, a.z ? *a.z : none, table, pb,
          static_cast<float>(pb.scale), static_cast<step_sum_t<T>*>(partial), row_blocks, block_rows, quads,
          vector_rows(pb, *a.S));
    };
    if (pb.t * (pb.hq / pb.h) <= kTokensThreads / quads) launch(step_tokens_kernel<T, 1>);
    else launch(step_tokens_kernel<T, kTokensSlots>);
    check_launch("power_attention_step tokens");
    step_output_kernel<T><<<step_output_blocks(pb), kStepOutputThreads, 0, lc.stream>>>(
        static_cast<step_sum_t<T>*>(partial), *a.o, pb, row_blocks, pb.normalize);
    check_launch("power_attention_step output");
  });
}

void power_attention_step_streamed_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const int block_rows = rows_per_block(pb, lc.props, kStreamRows, 32);
  const int64_t row_blocks = (pb.D + block_rows - 1) / block_rows;
  void* partial = take_step_partials(pb, row_blocks, lc.ws);
  if (lc.ws.sizing()) return;
  const int64_t blocks = pb.b * pb.h * row_blocks;
  if (blocks == 0) return;
  const int quads = column_quads(pb);
  const expanse_tensor& S = *a.S;
  const int vec = vector_rows(pb, S);
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
