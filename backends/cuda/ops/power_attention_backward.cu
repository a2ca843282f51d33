// power_attention_backward's list on the CUDA backend, and its tensor-core implementation "mma" (sm_80+;
// p = 2 in the symmetric layout, d = e = 64, f16/bf16), for now the one-chunk form only (one chunk, no
// initial or final state: no state terms). Its steps:
//   1. normalized: chunk_attention (through the list) -> l, rowmax: each query's denominator
//   2. dnum_i = dout_i / den_i, dden_i, 1 / den_i per query (gpu/kernels/backward_simple.hpp)
//   3. the causal pairs: f32 sums of dq, dk, dv and of A_ij M_ij by query and by key
//      (kernels/sm80/flash_chunk_attention_backward.cuh), then the gradients in their dtype with
//      q . dq and k . dk (gpu/kernels/backward_outputs.hpp)
//   4. dlog_g from q . dq and k . dk (gpu/ops/power_attention_backward.cu)
// The chunked form adds the state terms (the forward and cotangent states, a pullback of J_phi^T for dq
// and dk); a first version of them is in the history of this file, declined here until it is fast and
// its gates' gradient as accurate as the pairs' (docs/performance.md).
#include "gpu/kernels/backward_outputs.hpp"
#include "gpu/ops/implementations.hpp"
#include "gpu/ops/power_attention_backward.hpp"
#include "kernels/sm80/flash_chunk_attention_backward.cuh"
#include "ops/op_common.hpp"

namespace expanse_cuda {

std::string mma_power_attention_backward_declines(const expanse_op& op, const device_props& props);
void mma_power_attention_backward_run(const expanse_op& op, launch_context& lc);

namespace {

// The memo slot of the chunk_attention step.
constexpr int kChunkAttention = 1;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

std::string token_tensor_declines(const char* name, const expanse_tensor* t) {
  if (t->strides[3] != 1) return std::string(name) + " needs a contiguous last dim";
  for (int i = 0; i < 3; ++i)
    if (t->strides[i] % 8 != 0) return std::string(name) + " needs strides that are multiples of 8";
  if (!aligned16(t->data)) return std::string(name) + " needs 16-byte aligned data";
  return {};
}

}  // namespace

std::string mma_power_attention_backward_declines(const expanse_op& op, const device_props& props) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  std::string why = expanse_gpu::power_attention_backward_simple_declines(op, props);
  if (!why.empty()) return why;
  if (pb.input_dtype != EXPANSE_F16 && pb.input_dtype != EXPANSE_BF16) return "inputs must be f16 or bf16";
  if (pb.p != 2) return "p must be 2";
  if (pb.layout.kind != EXPANSE_LAYOUT_SYMPOW) return "the layout must be the symmetric one";
  if (pb.d != 64 || pb.e != 64) return "d and e must be 64";
  const backward_plan plan = plan_backward(op);
  if (plan.forward_states || plan.cotangent_states)
    return "chunk states (more than one chunk, or an initial or final state) are not yet supported";
  if (why.empty()) why = token_tensor_declines("q", a.q);
  if (why.empty()) why = token_tensor_declines("k", a.k);
  if (why.empty()) why = token_tensor_declines("v", a.v);
  if (why.empty()) why = token_tensor_declines("dout", a.dout);
  return why;
}

void mma_power_attention_backward_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  const expanse_tensor& dev = *a.q;
  const int64_t qrows = pb.b * pb.t * pb.hq, krows = pb.b * pb.t * pb.h;

  step_inputs shared;
  shared.g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  backward_work w{};
  w.dnum = lc.ws.take<float>(size_t(qrows * pb.e));
  w.dden = lc.ws.take<float>(size_t(qrows));
  w.qdq = lc.ws.take<float>(size_t(qrows));
  w.kdk = lc.ws.take<float>(size_t(krows));
  w.rden = pb.normalize ? lc.ws.take<float>(size_t(qrows)) : nullptr;
  // The pairs' f32 sums: dq, dk, dv, and A_ij M_ij by query and by key.
  float* sum_q = lc.ws.take<float>(size_t(qrows * pb.d));
  float* sum_k = lc.ws.take<float>(size_t(krows * pb.d));
  float* sum_v = lc.ws.take<float>(size_t(krows * pb.e));
  float* am_q = lc.ws.take<float>(size_t(qrows));
  float* am_k = lc.ws.take<float>(size_t(krows));

  // 1. The denominators (the pairs' part, which is all there is in one chunk).
  expanse_tensor y{}, l{}, rowmax{};
  if (pb.normalize) {
    y = f32_view(lc.ws.take<float>(size_t(qrows * pb.e)), {pb.b, pb.t, pb.hq, pb.e}, dev);
    l = f32_view(lc.ws.take<float>(size_t(qrows)), {pb.b, pb.t, pb.hq}, dev);
    rowmax = f32_view(lc.ws.take<float>(size_t(qrows)), {pb.b, pb.t, pb.hq}, dev);
    const expanse_chunk_attention_args att{a.q, a.k, a.v, a.log_g, &y, &l, &rowmax, pb.p, pb.scale, pb.c};
    const expanse_problem att_pb = step_problem(pb, pb.input_dtype, EXPANSE_F32);
    launch_context steps{lc.stream, lc.ws, lc.props, lc.dispatch, lc.call, &shared};
    lc.dispatch.run_step({EXPANSE_OP_CHUNK_ATTENTION, &att, &att_pb, nullptr}, kChunkAttention, steps);
  }
  if (lc.ws.sizing() || qrows == 0) return;

  // 2. The queries' cotangents.
  const backward_tensors in{*a.q, *a.k, *a.v, tensor_or_empty(a.o), *a.dout, l, rowmax, *a.dq, *a.dk, *a.dv};
  const backward_form form{0, pb.normalize ? 1 : 0};  // the denominators' pairs come from l, rowmax
  with_b16_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    backward_cotangents_kernel<T><<<unsigned(qrows), kBackwardThreads, 0, lc.stream>>>(in, backward_states{}, w, shared.g,
                                                                                    nullptr, pb, form);
  });
  check_launch("mma power_attention_backward cotangents");

  // 3. The pairs.
  cudaMemsetAsync(sum_q, 0, size_t(qrows * pb.d) * sizeof(float), lc.stream);
  cudaMemsetAsync(am_q, 0, size_t(qrows) * sizeof(float), lc.stream);
  using namespace flash_backward_cfg;
  flash_backward_params P{};
  P.q = a.q->data, P.k = a.k->data, P.v = a.v->data;
  P.q_sb = a.q->strides[0], P.q_st = a.q->strides[1], P.q_sh = a.q->strides[2];
  P.k_sb = a.k->strides[0], P.k_st = a.k->strides[1], P.k_sh = a.k->strides[2];
  P.v_sb = a.v->strides[0], P.v_st = a.v->strides[1], P.v_sh = a.v->strides[2];
  P.dout = a.dout->data;
  P.o_sb = a.dout->strides[0], P.o_st = a.dout->strides[1], P.o_sh = a.dout->strides[2];
  P.rden = w.rden;
  P.dden = pb.normalize ? w.dden : nullptr;
  P.row_am = am_q, P.key_am = am_k;
  P.dq = sum_q, P.dk = sum_k, P.dv = sum_v;
  P.g = shared.g;
  P.t = pb.t, P.c = pb.c, P.n = pb.n, P.h = pb.h, P.hq = pb.hq, P.p = pb.p, P.scale = float(pb.scale);
  P.key_tiles = int((std::min(pb.c, pb.t) + kKeys - 1) / kKeys);
  with_b16_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_with_smem(flash_chunk_attention_backward_kernel<T, 64, 64>, int64_t(P.key_tiles) * pb.n * pb.h * pb.b,
                     kThreads, flash_backward_smem<T, 64, 64>(), lc.stream, P);
    check_launch("mma power_attention_backward pairs");
    finish_queries_kernel<T><<<grid_for(qrows * kLaneGroup, 128), 128, 0, lc.stream>>>(*a.dq, sum_q, am_q, P.scale,
                                                                                     float(pb.p), w.qdq, qrows, pb.d);
    check_launch("mma power_attention_backward dq");
  });
  finish_keys_kernel<<<grid_for(krows * kLaneGroup, 128), 128, 0, lc.stream>>>(*a.dk, *a.dv, sum_k, sum_v, am_k, pb, w.kdk);
  check_launch("mma power_attention_backward dk, dv");

  // 4. The gates' gradient.
  launch_gate_gradients(op, expanse_tensor{}, expanse_tensor{}, w, nullptr, lc);
}

namespace {
const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION_BACKWARD,
                            {{"mma", sm80, mma_power_attention_backward_declines, mma_power_attention_backward_run},
                             expanse_gpu::power_attention_backward_simple});
}  // namespace

}  // namespace expanse_cuda
