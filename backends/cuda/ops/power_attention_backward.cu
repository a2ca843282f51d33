// power_attention_backward's list on the CUDA backend, and its tensor-core implementations "wgmma"
// (sm_90a) and "mma" (sm_80+), which differ only in the tensor-core instructions of the pairs kernel
// and of the state pullback's tile product (p = 1 or 2 in the symmetric layout, any p without states;
// d = e = 64, f16/bf16): the chunked form of docs/spec.md
// "Gradients", composed like the forward. In order:
//   1. the forward sweep (update_state with its operands split into b16 hi + lo, as the state terms
//      cancel; discumsum through the list) -> S_m, z_m entering each chunk
//   2. normalized: the flash chunk_attention kernel without the values -> l, rowmax, the intra part
//      of each query's denominator
//   3. 1 / den_i, dden_i and the query's weight in the state cotangents (gpu/kernels/backward_chunked.hpp)
//   4. the intra-chunk pairs: f32 sums of dq, dk, dv and of A_ij M_ij by query and by key
//      (kernels/sm80/flash_chunk_attention_backward.cuh; its products on wgmma for "wgmma":
//      kernels/sm90/wgmma_flash_chunk_attention_backward.cuh)
//   5. the state cotangents: update_state of q against dout with the weights exp(Gc_i) scale^p / den_i,
//      split into b16 hi + lo like the forward sweep, and a feature sum for dden (their z part: on the
//      blocked wgmma kernel its ones column, else gpu/kernels/backward_chunked.hpp), then the reverse
//      scan -> dY_{m+1}, dZ_{m+1} per chunk, and the gates' boundary terms
//   6. dk's state term (ops/state_pullback.hpp), dv's as phi(k)^T dY_{m+1} with split operands (on
//      sm_90a from the split tiles of dY that dk's pullback made), dq's (the pullback of S_m, z_m)
//   7. the gradients in their dtypes with q . dq and k . dk: dq and dk by the pullbacks where they ran,
//      the rest by gpu/kernels/backward_outputs.hpp; then dlog_g chunk by chunk
//      (gpu/ops/power_attention_backward.cu)
#include <cmath>

#include "gpu/kernels/backward_chunked.hpp"
#include "gpu/kernels/backward_outputs.hpp"
#include "gpu/ops/implementations.hpp"
#include "gpu/ops/power_attention_backward.hpp"
#include "gpu/ops/query_state.hpp"
#include "kernels/sm90/wgmma_flash_chunk_attention_backward.cuh"
#include "ops/flash_chunk_attention.hpp"
#include "ops/op_common.hpp"
#include "ops/state_pullback.hpp"
#include "ops/update_state.hpp"

namespace expanse_cuda {

std::string mma_power_attention_backward_declines(const expanse_op& op, const device_props& props);
using expanse_sdk::exchange_call;
// exchange: expanse_power_attention_backward_exchange's callback (null: a plain call).
template <pullback_product kProduct>
void mma_power_attention_backward_run(const expanse_op& op, launch_context& lc, const exchange_call* exchange);
// ops/query_state.cu: query_state with both operands split into b16 hi + lo (dv's state term where
// the keys' pullback tiles do not serve: the sm_80 kernel).
void launch_split_query_state(const query_inputs& in, const gates& g, const phi_tables& phi, const expanse_problem& pb,
                              bool normalize, launch_context& lc);

std::string mma_power_attention_backward_declines(const expanse_op& op, const device_props& props) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  std::string why = expanse_gpu::power_attention_backward_simple_declines(op, props);
  if (why.empty()) why = tensor_core_backward_declines(pb);
  if (!why.empty()) return why;
  // Without states (one chunk, no initial state, no final state's cotangent) only the pairs remain,
  // whose kernels take any p; the state terms' kernels take p = 2 (quadratic forms) and p = 1 (never
  // normalized: normalization needs an even p).
  const backward_plan plan = plan_backward(op);
  if (pb.p > 2 && (plan.forward_states || plan.cotangent_states || plan.final_term))
    return "p must be 1 or 2 where the backward has states (more than one chunk, an initial state or a final "
           "state's cotangent)";
  why = token_tensor_declines("q", *a.q);
  if (why.empty()) why = token_tensor_declines("k", *a.k);
  if (why.empty()) why = token_tensor_declines("v", *a.v);
  if (why.empty()) why = token_tensor_declines("dout", *a.dout);
  return why;
}

template <pullback_product kProduct>
void mma_power_attention_backward_run(const expanse_op& op, launch_context& lc, const exchange_call* exchange) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  const expanse_tensor& dev = *a.q;
  const backward_plan plan = plan_backward(op);
  const bool sizing = lc.ws.sizing(), grouped = pb.hq != pb.h;
  // The exchange comes with the state cotangents' scan, which dinitial (declared by the exchanging
  // call) always brings.
  if (exchange && !plan.cotangent_states)
    throw std::logic_error("power_attention_backward: an exchange without dinitial");
  const int64_t qrows = pb.b * pb.t * pb.hq, krows = pb.b * pb.t * pb.h;

  step_inputs shared;
  // The feature tables serve the state terms only (38 us to build at P1; none at one chunk).
  if (plan.forward_states || plan.cotangent_states || plan.final_term) shared.phi = make_phi_tables(pb, lc);
  shared.g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  // A problem over the query heads (or the kv heads) without the call's gates.
  auto plain_problem = [&](int64_t heads, int32_t output_dtype) {
    expanse_problem step = step_problem(pb, pb.input_dtype, output_dtype);
    step.h = step.hq = heads;
    step.gated = 0;
    return step;
  };

  // dnum itself is not needed: the pairs and the pullback take dout and 1 / den.
  backward_work w = take_backward_work(pb, pb.normalize != 0, false, lc.ws);
  // The f32 sums: the pairs' (dq, dk, dv, and A M by query and by key) and the state terms'.
  float* sum_q = lc.ws.take<float>(size_t(qrows * pb.d));
  float* sum_k = lc.ws.take<float>(size_t(krows * pb.d));
  float* sum_v = lc.ws.take<float>(size_t(krows * pb.e));
  float* am_q = lc.ws.take<float>(size_t(qrows));
  float* am_k = lc.ws.take<float>(size_t(krows));
  double* boundary = take_boundary_sums(op, plan, lc.ws);
  // The state pullbacks' split tiles, dk's then dq's in the same buffer.
  void* pullback_tiles =
      plan.forward_states || plan.cotangent_states ? lc.ws.take<unsigned char>(state_pullback_workspace(pb, kProduct)) : nullptr;

  // 1. The forward sweep.
  // The blocked wgmma kernels where the implementation is "wgmma" and p = 2, else the sm_80 ones.
  const bool blocked = kProduct == pullback_product::wgmma && pb.p == 2;
  const forward_sweep fw = recompute_forward_states(
      op, plan, shared, lc, blocked ? launch_blocked_split_update_state : launch_split_update_state);
  backward_states st{};
  st.S = fw.S, st.z = fw.z;

  // 2. The intra-chunk part of the denominators: the flash kernel without the values (whose shapes
  // and strides this implementation's own checks admit).
  expanse_tensor l{}, rowmax{};
  if (pb.normalize) {
    l = f32_view(lc.ws.take<float>(size_t(qrows)), {pb.b, pb.t, pb.hq}, dev);
    rowmax = f32_view(lc.ws.take<float>(size_t(qrows)), {pb.b, pb.t, pb.hq}, dev);
    if (!sizing) {
      attention_inputs in{};
      in.q = *a.q, in.k = *a.k, in.v = *a.v, in.l = l, in.rowmax = rowmax;
      launch_flash_chunk_attention(in, shared.g, step_problem(pb, pb.input_dtype, EXPANSE_F32), lc);
    }
  }

  // 3. The queries' cotangents, and the queries' weights in the state cotangents.
  const float scale = float(pb.scale), scale_p = float(std::pow(pb.scale, pb.p));
  float* state_weight = plan.cotangent_states ? lc.ws.take<float>(size_t(qrows)) : nullptr;
  // The cotangent states' z part (where it is wanted) comes with their S from the blocked kernel,
  // whose ones column takes these weights; else from weighted_features_kernel.
  float* z_weight = blocked && plan.cotangent_z ? lc.ws.take<float>(size_t(qrows)) : nullptr;
  if (!sizing && qrows > 0) {
    const int tiles = int((std::min(pb.c, pb.t) + kCotangentTokens - 1) / kCotangentTokens);
    with_b16_type(pb.input_dtype, [&](auto tag) {
      using T = decltype(tag);
      query_cotangents_kernel<T><<<unsigned(int64_t(tiles) * pb.n * pb.hq * pb.b), kCotangentTokens, 0, lc.stream>>>(
          *a.q, *a.dout, tensor_or_empty(a.o), l, rowmax, pb.normalize ? static_cast<const float*>(st.z.data) : nullptr,
          shared.g, pb, scale_p, tiles, w.rden, w.dden, state_weight, z_weight);
    });
    check_launch("mma power_attention_backward query cotangents");
  }

  // 4. The intra-chunk pairs.
  if (!sizing && qrows > 0) {
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
    P.t = pb.t, P.c = pb.c, P.n = pb.n, P.h = pb.h, P.hq = pb.hq, P.scale = scale;
    // A CTA's keys: 128 on wgmma (two warpgroups), 64 with mma.sync.
    constexpr bool on_wgmma = kProduct == pullback_product::wgmma;
    const int cta_keys = on_wgmma ? wgmma_flash_backward_cfg::kKeys : kKeys;
    P.key_tiles = int((std::min(pb.c, pb.t) + cta_keys - 1) / cta_keys);
    P.group = flash_backward_group(pb.c, pb.t, pb.hq / pb.h, int(pb.d), int(pb.e));
    const int64_t ctas = int64_t(P.key_tiles) * pb.n * pb.h * pb.b;
    with_b16_type(pb.input_dtype, [&](auto tag) {
      using T = decltype(tag);
      with_degree(pb.p, [&](auto degree) {
        if constexpr (on_wgmma)
          launch_with_smem(wgmma_flash_chunk_attention_backward_kernel<T, degree.value>, ctas,
                           wgmma_flash_backward_cfg::kThreads, wgmma_flash_backward_smem(), lc.stream, P);
        else
          launch_with_smem(flash_chunk_attention_backward_kernel<T, 64, 64, degree.value>, ctas, kThreads,
                           flash_backward_smem<T, 64, 64>(), lc.stream, P);
      });
    });
    check_launch("mma power_attention_backward pairs");
  }

  // 5. The state cotangents: each chunk's input summed over its queries (update_state of q against
  // dout, weighted, every query head; a feature sum for dden), then the reverse scan. Split into b16
  // hi + lo: dk's and dv's state terms take phi(k_j)^T of these sums, which cancels where a query of
  // large 1 / den_i is nearly orthogonal to the keys it sees (one b16 rounding of phi(q_i) put dk and
  // dv 2e-2 off after a reset at a chunk's end).
  expanse_tensor dv_state{};
  if (plan.cotangent_states) {
    take_cotangent_states(op, plan, lc.ws, st);
    const int64_t query_states = pb.b * pb.n * pb.hq * pb.D;
    expanse_tensor Xs{}, Xz{};  // the chunk inputs per query head where they are grouped; else in place
    if (grouped) {
      Xs = f32_view(lc.ws.take<float>(size_t(query_states * pb.e)), {pb.b, pb.n, pb.hq, pb.D, pb.e}, dev);
      if (st.dZ.data) Xz = f32_view(lc.ws.take<float>(size_t(query_states)), {pb.b, pb.n, pb.hq, pb.D}, dev);
    }
    expanse_tensor into_S = grouped ? Xs : st.dY, into_z = grouped ? Xz : st.dZ;
    if (!sizing) {
      launch_weighted_split_update_state(*a.q, *a.dout, state_weight, shared.phi, plain_problem(pb.hq, EXPANSE_F32),
                                         into_S, z_weight ? &into_z : nullptr, z_weight, blocked, lc);
      if (into_z.data && query_states > 0 && !z_weight) {
        cudaMemsetAsync(into_z.data, 0, size_t(query_states) * sizeof(float), lc.stream);
        with_b16_type(pb.input_dtype, [&](auto tag) {
          using T = decltype(tag);
          weighted_features_kernel<T><<<unsigned(kFeatureSplits * pb.n * pb.hq * pb.b), kQuadThreads, 0, lc.stream>>>(
              *a.q, w.dden, shared.g, pb, scale_p, static_cast<float*>(into_z.data));
        });
        check_launch("mma power_attention_backward dden features");
      }
      // Exchanging: the scan from zero gives dinitial without dfinal, the callback then brings dfinal,
      // and its share is added to every chunk's cotangent before anything reads them.
      launch_reverse_scan(op, st, Xs, Xz, fw, shared.g, boundary, lc, /*with_final=*/!exchange);
      if (exchange) {
        if (exchange->fn(lc.stream.raw, exchange->user) != 0)
          throw std::runtime_error("power_attention_backward: the exchange callback failed");
        launch_final_cotangent(op, st, fw, shared.g, boundary, lc);
      }
    }

    // 6. dk's and dv's state terms.
    dv_state = b16_view(lc.ws.take<unsigned char>(size_t(krows * pb.e) * 2), pb.input_dtype, {pb.b, pb.t, pb.h, pb.e}, dev);
    if (!sizing && krows > 0)
      launch_state_pullback({a.k, 1.f, a.v, nullptr, nullptr, &st.dY, &st.dZ, shared.g.keys(), true, pb.h, sum_k, am_k,
                             a.dk, 1.f, w.kdk, kProduct, pullback_tiles},
                            pb, lc);
    // phi(k_j)^T dY_{m+1}, with both operands split like the cotangent states' sums (a b16 rounding of
    // either is magnified the same way): on sm_90a at p = 2 from the split tiles of dY that dk's
    // pullback just made.
    if (!sizing && krows > 0) {
      if (tiles_query_takes(kProduct, pb)) {
        launch_state_tiles_query(*a.k, dv_state, pullback_tiles, pb, lc);
      } else {
        query_inputs keys{};
        keys.q = *a.k, keys.S = st.dY, keys.o = dv_state;
        expanse_problem qs_pb = plain_problem(pb.h, pb.input_dtype);
        qs_pb.scale = 1.0;
        qs_pb.normalize = 0;
        launch_split_query_state(keys, gates{}, shared.phi, qs_pb, false, lc);
      }
    }
  }
  // dq's state term.
  if (!sizing && st.S.data && qrows > 0)
    launch_state_pullback({a.q, scale, a.dout, w.rden, st.z.data ? w.dden : nullptr, &st.S, &st.z, shared.g, false,
                           pb.hq, sum_q, am_q, a.dq, scale, w.qdq, kProduct, pullback_tiles},
                          pb, lc);
  if (sizing) return;

  // 7. The gradients, then the gates'.
  with_b16_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (qrows > 0 && !st.S.data) {
      finish_queries_kernel<T><<<grid_for(qrows * kLaneGroup, 128), 128, 0, lc.stream>>>(*a.dq, sum_q, am_q, scale,
                                                                                        float(pb.p), w.qdq, qrows, pb.d);
      check_launch("mma power_attention_backward dq");
    }
    if (krows > 0) {
      const bool with_dk = !plan.cotangent_states;
      const bool dv_vectors = finish_keys_vectors(*a.dv, pb, dv_state.data != nullptr, with_dk);
      finish_keys_kernel<T><<<grid_for(finish_keys_threads(*a.dv, dv_vectors), 128), 128, 0, lc.stream>>>(
          *a.dk, *a.dv, sum_k, sum_v, dv_state.data ? static_cast<const T*>(dv_state.data) : nullptr, am_k,
          shared.g.keys(), pb, w.kdk, with_dk, dv_vectors);
      check_launch("mma power_attention_backward dk, dv");
    }
  });
  launch_gate_gradients(op, boundary, w, lc);
}

namespace {
template <pullback_product kProduct>
void plain_run(const expanse_op& op, launch_context& lc) {
  mma_power_attention_backward_run<kProduct>(op, lc, nullptr);
}
template <pullback_product kProduct>
void exchanging_run(const expanse_op& op, launch_context& lc, const exchange_call& exchange) {
  mma_power_attention_backward_run<kProduct>(op, lc, &exchange);
}

const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION_BACKWARD,
                            {{"wgmma", sm90a, mma_power_attention_backward_declines, plain_run<pullback_product::wgmma>,
                              exchanging_run<pullback_product::wgmma>},
                             {"mma", sm80, mma_power_attention_backward_declines, plain_run<pullback_product::mma_sync>,
                              exchanging_run<pullback_product::mma_sync>},
                             expanse_gpu::power_attention_backward_simple});
}  // namespace

}  // namespace expanse_cuda
