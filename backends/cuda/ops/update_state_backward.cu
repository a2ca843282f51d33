// update_state_backward's list on the CUDA backend, and its tensor-core implementations "wgmma" (sm_90a)
// and "mma" (sm_80+), which differ in the state pullback's tile product (p = 1 or 2 in the symmetric
// layout, d = e = 64, f16/bf16 tokens). For key j of chunk m, with w_j = exp(A_m - Gc_j) its weight in the
// chunk's state:
//   dv_j = w_j phi(k_j)^T dS_m           weighted by finish_keys_kernel: on sm_90a at p = 2 from the split
//                                        tiles of dS that dk's pullback makes (both operands split, as
//                                        power_attention_backward's dv), else query_state (list) of k
//   dk_j = w_j J_phi(k_j)^T (dS_m v_j + dz_m)     the state pullback (ops/state_pullback.hpp)
//   dlog_g_l = sum_{j < l in m} k_j . dk_j / p    (w_j holds log_g_l for l > j; phi is p-homogeneous)
// the same terms as power_attention_backward's keys take from the cotangent of the state after their
// chunk. Where context parallelism differentiates a piece's state (expanse.torch), this is that
// state's backward.
#include "gpu/kernels/backward_outputs.hpp"
#include "gpu/kernels/backward_simple.hpp"
#include "gpu/ops/implementations.hpp"
#include "ops/op_common.hpp"
#include "ops/state_pullback.hpp"

namespace expanse_cuda {
namespace {

// The memo slot of the query_state step.
constexpr int kValues = 1;

std::string mma_update_state_backward_declines(const expanse_op& op, const device_props& props) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_backward_args>(op);
  std::string why = expanse_gpu::update_state_backward_simple_declines(op, props);
  if (why.empty()) why = tensor_core_backward_declines(pb);
  if (!why.empty()) return why;
  if (pb.p > 2) return "p must be 1 or 2";
  if (a.dS->strides[4] != 1 || (a.dz && a.dz->strides[3] != 1)) return "dS and dz need a contiguous last dim";
  why = token_tensor_declines("k", *a.k);
  if (why.empty()) why = token_tensor_declines("v", *a.v);
  return why;
}

template <pullback_product kProduct>
void mma_update_state_backward_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_backward_args>(op);
  const expanse_tensor& dev = *a.k;
  const int64_t krows = pb.b * pb.t * pb.h;

  const step_inputs ungated{make_phi_tables(pb, lc), gates{}};
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  launch_context plain_steps{lc.stream, lc.ws, lc.props, lc.dispatch, lc.call, &ungated};
  backward_work w{};
  w.kdk = lc.ws.take<float>(size_t(krows));
  expanse_tensor dv_state =
      b16_view(lc.ws.take<unsigned char>(size_t(krows * pb.e) * 2), pb.input_dtype, {pb.b, pb.t, pb.h, pb.e}, dev);

  // dv's unweighted product phi(k_j)^T dS_m: from the pullback's tiles where they are the blocked
  // wgmma kernels' (after the pullback, below), else a step through the query_state list (no scale,
  // no gates).
  const bool from_tiles = tiles_query_takes(kProduct, pb);
  if (!from_tiles) {
    const expanse_query_state_args qs{a.k, a.dS, nullptr, nullptr, nullptr, nullptr, nullptr, &dv_state,
                                      pb.p, 1.0,   pb.c,  0,       pb.layout};
    expanse_problem qs_pb = step_problem(pb, pb.input_dtype, pb.input_dtype);
    qs_pb.hq = pb.h, qs_pb.gated = 0, qs_pb.scale = 1.0, qs_pb.normalize = 0;
    lc.dispatch.run_step({EXPANSE_OP_QUERY_STATE, &qs, &qs_pb, nullptr}, kValues, plain_steps);
  }
  void* pullback_tiles = lc.ws.take<unsigned char>(state_pullback_workspace(pb, kProduct));
  if (lc.ws.sizing() || krows == 0) return;

  const expanse_tensor dz = tensor_or_empty(a.dz);
  launch_state_pullback({a.k, 1.f, a.v, nullptr, nullptr, a.dS, &dz, g.keys(), true, pb.h, nullptr, nullptr, a.dk, 1.f,
                         w.kdk, kProduct, pullback_tiles},
                        pb, lc);
  if (from_tiles) launch_state_tiles_query(*a.k, dv_state, pullback_tiles, pb, lc);
  with_b16_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool dv_vectors = finish_keys_vectors(*a.dv, pb, true, false);
    finish_keys_kernel<T><<<grid_for(finish_keys_threads(*a.dv, dv_vectors), 128), 128, 0, lc.stream>>>(
        *a.dk, *a.dv, nullptr, nullptr, static_cast<const T*>(dv_state.data), nullptr, g.keys(), pb, w.kdk, false,
        dv_vectors);
  });
  check_launch("mma update_state_backward dv");
  if (a.dlog_g) {
    chunk_gate_gradients_kernel<<<grid_for(pb.b * pb.h * pb.n, 256), 256, 0, lc.stream>>>(
        *a.log_g, *a.dlog_g, w, pb, chunk_gate_sum::exclusive_keys);
    check_launch("mma update_state_backward dlog_g");
  }
}

const registered_list kList(cuda_lists(), EXPANSE_OP_UPDATE_STATE_BACKWARD,
                            {{"wgmma", sm90a, mma_update_state_backward_declines,
                              mma_update_state_backward_run<pullback_product::wgmma>},
                             {"mma", sm80, mma_update_state_backward_declines,
                              mma_update_state_backward_run<pullback_product::mma_sync>},
                             expanse_gpu::update_state_backward_simple});

}  // namespace
}  // namespace expanse_cuda
