// The inputs every operation's kernels read, made in the workspace: the phi table (and its block
// form), the gate sums; the reasons every implementation shares; workspace tensor views.
#include "gpu/kernels/chunk_gates.hpp"
#include "gpu/kernels/phi_table.hpp"
#include "gpu/ops/common.hpp"
#include "sdk/op_args.hpp"

namespace expanse_gpu {
namespace {

int64_t host_binomial(int64_t n, int k) {
  int64_t r = 1;
  for (int i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
}

}  // namespace

const phi_entry* make_phi_table(const expanse_problem& pb, launch_context& lc) {
  if (const step_inputs* prepared = prepared_of(lc)) return prepared->phi.rows;
  phi_entry* table = lc.ws.take<phi_entry>(static_cast<size_t>(pb.D));
  if (lc.ws.sizing()) return table;
  build_phi_table<<<grid_for(pb.D, 256), 256, 0, lc.stream>>>(table, pb.D, pb.p, pb.d, pb.layout.kind,
                                                               pb.layout.d_tile);
  check_launch("build_phi_table");
  return table;
}

// Blocks for the tiled layout with d_tile 8 (2 <= p <= 4) and for the symmetric layout at p = 2
// (read through tiled:8, 10% padding at d = 64; at p = 3 and 4 the padding would be 34% and 76%).
int64_t phi_block_count(const expanse_problem& pb) {
  const bool tiled8 = pb.layout.kind == EXPANSE_LAYOUT_TILED && pb.layout.d_tile == 8 && pb.p <= 4;
  const bool sympow2 = pb.layout.kind == EXPANSE_LAYOUT_SYMPOW && pb.p == 2;
  if (pb.p < 2 || pb.d % 8 != 0 || !(tiled8 || sympow2)) return 0;
  int64_t block_size = 1;
  for (int k = 0; k < pb.p; ++k) block_size *= 8;
  return host_binomial(pb.d / 8 + pb.p - 1, pb.p) * block_size / 64;
}

phi_tables make_phi_tables(const expanse_problem& pb, launch_context& lc) {
  if (const step_inputs* prepared = prepared_of(lc)) return prepared->phi;
  phi_tables t;
  t.rows = make_phi_table(pb, lc);
  t.blocks.count = phi_block_count(pb);
  if (t.blocks.count == 0) return t;
  const int64_t rows = t.blocks.count * 64;
  phi_block* blocks = lc.ws.take<phi_block>(static_cast<size_t>(t.blocks.count));
  phi_block_row* block_rows = lc.ws.take<phi_block_row>(static_cast<size_t>(rows));
  t.blocks.block = blocks;
  t.blocks.row = block_rows;
  if (lc.ws.sizing()) return t;
  build_phi_blocks<<<grid_for(rows, 256), 256, 0, lc.stream>>>(blocks, block_rows, rows, pb.p, pb.d,
                                                               pb.layout.kind);
  check_launch("build_phi_blocks");
  return t;
}

std::string common_declines(const expanse_op& op) {
  const expanse_problem& pb = *op.problem;
  if (pb.input_dtype == EXPANSE_F64 || pb.output_dtype == EXPANSE_F64 || pb.state_dtype == EXPANSE_F64)
    return "f64 tensors are not supported (f64 is the reference backend's oracle mode)";
  if (pb.d > 65535) return "d must be at most 65535";
  if (pb.p > kMaxDegree) return "p must be at most 6";
  return {};
}

gates make_gates(const expanse_tensor* log_g, int64_t b, int64_t t, int64_t h, int64_t c, launch_context& lc) {
  if (const step_inputs* prepared = prepared_of(lc)) return prepared->g;
  gates g;
  if (log_g == nullptr) return g;
  const int64_t n = chunk_count(t, c);
  const size_t tokens = static_cast<size_t>(b * h * t), chunks = static_cast<size_t>(b * h * n);
  gate_arrays out;
  g.Gc = out.Gc = lc.ws.take<float>(tokens);
  g.restarted = out.restarted = lc.ws.take<float>(tokens);
  g.key_Gc = out.key_Gc = lc.ws.take<float>(tokens);
  g.last_reset = out.last_reset = lc.ws.take<int32_t>(tokens);
  g.total = out.total = lc.ws.take<float>(chunks);
  g.key_total = out.key_total = lc.ws.take<float>(chunks);
  if (lc.ws.sizing() || t == 0) return g;
  if (n > 2147483647 || h > 65535 || b > 65535) throw std::runtime_error("chunk_gates: grid too large");
  if (c > 2147483647) throw std::runtime_error("chunk_gates: chunk too long for 32-bit reset indices");
  chunk_gates_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(h), static_cast<unsigned>(b)), kChunkGatesThreads, 0,
                       lc.stream>>>(*log_g, t, h, c, n, out);
  check_launch("chunk_gates");
  return g;
}

expanse_tensor f32_view(float* data, std::initializer_list<int64_t> shape, const expanse_tensor& like) {
  expanse_tensor t{};
  t.data = data;
  t.dtype = EXPANSE_F32;
  t.device_type = like.device_type;
  t.device_id = like.device_id;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  expanse_sdk::set_dense_strides(t);
  return t;
}

expanse_tensor totals_view(const gates& g, const expanse_problem& pb, const expanse_tensor& like) {
  expanse_tensor A = f32_view(const_cast<float*>(g.total), {pb.b, pb.n, pb.h}, like);
  A.strides[0] = pb.h * pb.n;
  A.strides[1] = 1;
  A.strides[2] = pb.n;
  return A;
}

expanse_problem step_problem(const expanse_problem& pb, int32_t input_dtype, int32_t output_dtype) {
  expanse_problem step = pb;
  step.input_dtype = input_dtype;
  step.output_dtype = output_dtype;
  step.state_dtype = EXPANSE_F32;
  step.has_initial_state = step.want_final_state = step.has_intra = 0;
  return step;
}

}  // namespace expanse_gpu
