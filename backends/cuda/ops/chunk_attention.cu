// chunk_attention: causal power attention inside each chunk, stabilized in log space (y, l, rowmax).
// Implementations, best first: "flash" (tensor cores, f16/bf16, d and e in {32, 64, 128}: mma.sync,
// kernels/sm80/flash_chunk_attention.cuh, or on sm_90a at d = e = 64 wgmma,
// kernels/sm90/wgmma_flash_chunk_attention.cuh), "simple" (32 lanes per query row, any shape and
// dtype; shared with the HIP backend, gpu/ops/chunk_attention.cu).
#include "gpu/ops/chunk_attention.hpp"
#include "gpu/ops/implementations.hpp"
#include "kernels/sm80/flash_chunk_attention.cuh"
#include "kernels/sm90/wgmma_flash_chunk_attention.cuh"
#include "ops/flash_chunk_attention.hpp"
#include "ops/op_common.hpp"

namespace expanse_cuda {

namespace {

std::string flash_declines(const expanse_op& op, const device_props& props) {
  const auto& a = *static_cast<const expanse_chunk_attention_args*>(op.args);
  std::string why = common_declines(op);
  if (why.empty()) why = chunk_attention_f32_declines(a);
  if (why.empty()) why = flash_chunk_attention_declines(*op.problem, attention_inputs_of(a), props);
  return why;
}

void flash_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = *static_cast<const expanse_chunk_attention_args*>(op.args);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  launch_flash_chunk_attention(attention_inputs_of(a), g, pb, lc);
}

bool head_dim_ok(int64_t x) { return x == 32 || x == 64 || x == 128; }

}  // namespace

std::string flash_chunk_attention_declines(const expanse_problem& pb, const attention_inputs& in,
                                           const device_props& props) {
  (void)props;
  if (pb.input_dtype != EXPANSE_F16 && pb.input_dtype != EXPANSE_BF16) return "inputs must be f16 or bf16";
  if (!head_dim_ok(pb.d) || !head_dim_ok(pb.e)) return "d and e must be 32, 64 or 128";
  if (in.q.strides[3] != 1 || in.k.strides[3] != 1 || in.v.strides[3] != 1) return "q, k and v need a contiguous last dim";
  for (int i = 0; i < 3; ++i)
    if (in.q.strides[i] % 8 || in.k.strides[i] % 8 || in.v.strides[i] % 8) return "q, k and v need strides that are multiples of 8";
  if (!aligned16(in.q.data) || !aligned16(in.k.data) || !aligned16(in.v.data)) return "q, k and v need 16-byte aligned data";
  return {};
}

void launch_flash_chunk_attention(const attention_inputs& in, const gates& g, const expanse_problem& pb,
                                  launch_context& lc) {
  using namespace flash_cfg;
  flash_params P{};
  P.q = in.q.data; P.k = in.k.data; P.v = in.v.data;
  P.q_sb = in.q.strides[0]; P.q_st = in.q.strides[1]; P.q_sh = in.q.strides[2];
  P.k_sb = in.k.strides[0]; P.k_st = in.k.strides[1]; P.k_sh = in.k.strides[2];
  P.v_sb = in.v.strides[0]; P.v_st = in.v.strides[1]; P.v_sh = in.v.strides[2];
  P.y = static_cast<float*>(in.y.data);
  P.y_sb = in.y.strides[0]; P.y_st = in.y.strides[1]; P.y_sh = in.y.strides[2]; P.y_se = in.y.strides[3];
  if (in.l.data) {
    P.l = static_cast<float*>(in.l.data);
    P.l_sb = in.l.strides[0]; P.l_st = in.l.strides[1]; P.l_sh = in.l.strides[2];
  }
  if (in.rowmax.data) {
    P.rowmax = static_cast<float*>(in.rowmax.data);
    P.r_sb = in.rowmax.strides[0]; P.r_st = in.rowmax.strides[1]; P.r_sh = in.rowmax.strides[2];
  }
  P.g = g;
  P.t = pb.t; P.c = pb.c; P.n = pb.n; P.h = pb.h; P.hq = pb.hq; P.p = pb.p;
  P.scale = static_cast<float>(pb.scale);
  P.q_tiles = static_cast<int>((std::min(pb.c, pb.t) + kRows - 1) / kRows);
  P.group = chunk_heads_per_l2_group(std::min(pb.c, pb.t) * (pb.d + pb.e) * 2 /* b16 keys and values */);
  const int64_t ctas = int64_t(P.q_tiles) * pb.n * pb.hq * pb.b;
  if (ctas == 0) return;
  // wgmma where the device runs this build's sm_90a code and d = e = 64 (its one instantiation).
  const bool wgmma = (lc.props.features & kSm90a) != 0 && pb.d == wgmma_flash_cfg::kDim && pb.e == wgmma_flash_cfg::kDim;
  with_b16_head_dims(pb.input_dtype, pb.d, pb.e, [&](auto type_tag, auto d_tag, auto e_tag) {
    using T = decltype(type_tag);
    constexpr int DH = decltype(d_tag)::value, E = decltype(e_tag)::value;
    if (wgmma && P.y)
      launch_with_smem(wgmma_flash_chunk_attention_kernel<T, true>, ctas, kThreads, wgmma_flash_smem<T, true>(), lc.stream, P);
    else if (wgmma)
      launch_with_smem(wgmma_flash_chunk_attention_kernel<T, false>, ctas, kThreads, wgmma_flash_smem<T, false>(), lc.stream,
                       P);
    else if (P.y)
      launch_with_smem(flash_chunk_attention_kernel<T, DH, E>, ctas, kThreads, flash_smem<T, DH, E>(), lc.stream, P);
    else  // the denominators alone
      launch_with_smem(flash_chunk_attention_kernel<T, DH, E, false>, ctas, kThreads, flash_smem<T, DH, E, false>(),
                       lc.stream, P);
  });
  check_launch("flash chunk_attention");
}

namespace {
const registered_list kList(cuda_lists(), EXPANSE_OP_CHUNK_ATTENTION,
                            {{"flash", sm80, flash_declines, flash_run},
                             expanse_gpu::chunk_attention_simple});
}  // namespace

}  // namespace expanse_cuda
