// power_attention_backward's SIMT implementation (gpu/kernels/backward_simple.hpp), shared by every
// GPU backend: correct for any shape the kernels hold (d, e <= 256), and a baseline for the
// tensor-core implementations, not a fast path. The forward states come from update_state and
// discumsum through the backend's lists, as in the forward. Also what every implementation shares:
// the call's plan and the gates' gradient at the end (gpu/ops/power_attention_backward.hpp).
#include "gpu/ops/power_attention_backward.hpp"

#include "gpu/kernels/backward_simple.hpp"
#include "gpu/ops/discumsum.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {
backward_plan plan_backward(const expanse_op& op) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  backward_plan plan;
  // Forward states exist where a chunk starts from one; cotangent states where a chunk's keys see one.
  plan.forward_states = pb.n > 1 || a.initial_S != nullptr;
  plan.cotangent_states = pb.n > 1 || a.dfinal_S != nullptr || a.dfinal_z != nullptr || a.dinitial_S != nullptr ||
                          a.dinitial_z != nullptr;
  plan.need_z = pb.normalize || a.initial_z != nullptr || a.dfinal_z != nullptr;
  plan.cotangent_z = plan.cotangent_states && (plan.need_z || a.dinitial_z != nullptr);
  plan.final_term = a.dlog_g != nullptr && (a.dfinal_S != nullptr || a.dfinal_z != nullptr);
  return plan;
}

backward_work take_backward_work(const expanse_problem& pb, bool with_rden, bool with_dnum, workspace& ws) {
  const int64_t qrows = pb.b * pb.t * pb.hq, krows = pb.b * pb.t * pb.h;
  backward_work w{};
  w.dnum = with_dnum ? ws.take<float>(size_t(qrows * pb.e)) : nullptr;
  w.dden = ws.take<float>(size_t(qrows));
  w.qdq = ws.take<float>(size_t(qrows));
  w.kdk = ws.take<float>(size_t(krows));
  w.rden = with_rden ? ws.take<float>(size_t(qrows)) : nullptr;
  return w;
}

void take_cotangent_states(const expanse_op& op, const backward_plan& plan, workspace& ws, backward_states& st) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  const int64_t states = pb.b * pb.n * pb.h * pb.D;
  if (!plan.cotangent_states) return;
  st.dY = f32_view(ws.take<float>(size_t(states * pb.e)), {pb.b, pb.n, pb.h, pb.D, pb.e}, *a.q);
  if (plan.cotangent_z) st.dZ = f32_view(ws.take<float>(size_t(states)), {pb.b, pb.n, pb.h, pb.D}, *a.q);
}

forward_sweep recompute_forward_states(const expanse_op& op, const backward_plan& plan, const step_inputs& shared,
                                       launch_context& lc, update_state_launcher update) {
  constexpr int kUpdateState = 1;  // run_chunk_states takes it and the two after it
  static_assert(kUpdateState + 2 == kForwardSweepSlots, "the slots the sweep takes");
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  const expanse_tensor& dev = *a.q;
  const int64_t states = pb.b * pb.n * pb.h * pb.D, heads = pb.b * pb.h;
  forward_sweep fw{};
  if (!plan.forward_states && !plan.final_term) return fw;
  fw.S = f32_view(lc.ws.take<float>(size_t(states * pb.e)), {pb.b, pb.n, pb.h, pb.D, pb.e}, dev);
  if (plan.need_z) fw.z = f32_view(lc.ws.take<float>(size_t(states)), {pb.b, pb.n, pb.h, pb.D}, dev);
  if (plan.final_term) {
    fw.S_final = f32_view(lc.ws.take<float>(size_t(heads * pb.D * pb.e)), {pb.b, pb.h, pb.D, pb.e}, dev);
    if (plan.need_z) fw.z_final = f32_view(lc.ws.take<float>(size_t(heads * pb.D)), {pb.b, pb.h, pb.D}, dev);
  }
  run_chunk_states(pb,
                   {a.k, a.v, a.log_g, fw.S, fw.z, a.initial_S, a.initial_z, fw.S_final.data ? &fw.S_final : nullptr,
                    fw.z_final.data ? &fw.z_final : nullptr},
                   shared, lc, kUpdateState, update);
  if (!plan.forward_states) fw.S = fw.z = expanse_tensor{};  // only the final state was wanted
  return fw;
}

double* take_boundary_sums(const expanse_op& op, const backward_plan& plan, workspace& ws) {
  const expanse_problem& pb = *op.problem;
  const bool wanted = args_of<expanse_power_attention_backward_args>(op).dlog_g != nullptr && plan.cotangent_states;
  return wanted ? ws.take<double>(size_t(pb.b * pb.h * pb.n)) : nullptr;
}

namespace {

scan_ends ends_of(const expanse_power_attention_backward_args& a, const forward_sweep& fw) {
  return {tensor_or_empty(a.dfinal_S), tensor_or_empty(a.dfinal_z), tensor_or_empty(a.dinitial_S),
          tensor_or_empty(a.dinitial_z), static_cast<const float*>(fw.S_final.data),
          static_cast<const float*>(fw.z_final.data)};
}

void launch_boundary_sums(const expanse_problem& pb, const backward_states& st, const scan_ends& ends, double* boundary,
                          launch_context& lc) {
  const int64_t heads = pb.b * pb.h, per_head = pb.D * pb.e + (st.dZ.data ? pb.D : 0);
  if (!boundary || pb.n == 0 || heads * per_head == 0) return;
  const int64_t boundary_tiles = (per_head + kBoundaryEntries - 1) / kBoundaryEntries;
  boundary_sums_kernel<<<unsigned(boundary_tiles * heads * pb.n), kBackwardThreads, 0, lc.stream>>>(st, ends, pb, boundary);
  check_launch("power_attention_backward boundary terms");
}

}  // namespace

void launch_reverse_scan(const expanse_op& op, const backward_states& st, const expanse_tensor& Xs,
                         const expanse_tensor& Xz, const forward_sweep& fw, const gates& g, double* boundary,
                         launch_context& lc, bool with_final) {
  const expanse_problem& pb = *op.problem;
  const int64_t heads = pb.b * pb.h, per_head = pb.D * pb.e + (st.dZ.data ? pb.D : 0);
  if (heads * per_head == 0) return;
  if (boundary && failed(memset_async(boundary, 0, size_t(heads * pb.n) * sizeof(double), lc.stream)))
    throw std::runtime_error("power_attention_backward: clearing the boundary terms failed");
  scan_ends ends = ends_of(args_of<expanse_power_attention_backward_args>(op), fw);
  if (!with_final) ends.dfinal_S = ends.dfinal_z = expanse_tensor{};
  const int64_t tiles = (per_head + kScanEntries * kBackwardThreads - 1) / (kScanEntries * kBackwardThreads);
  reverse_scan_kernel<<<unsigned(tiles * heads), kBackwardThreads, 0, lc.stream>>>(st, Xs, Xz, ends, g, pb,
                                                                                   with_final ? boundary : nullptr);
  check_launch("power_attention_backward reverse scan");
}

void launch_final_cotangent(const expanse_op& op, const backward_states& st, const forward_sweep& fw, const gates& g,
                            double* boundary, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const int64_t heads = pb.b * pb.h, per_head = pb.D * pb.e + (st.dZ.data ? pb.D : 0);
  if (heads * per_head == 0) return;
  const scan_ends ends = ends_of(args_of<expanse_power_attention_backward_args>(op), fw);
  // At least 8 entries per thread, and at least 4 (n + 1) per block: the block's decay sum reads up to
  // n chunk totals.
  const int64_t per_block = ((std::max<int64_t>(8 * kBackwardThreads, 4 * (pb.n + 1)) + kBackwardThreads - 1) /
                             kBackwardThreads) * kBackwardThreads;
  const int64_t blocks = (per_head + per_block - 1) / per_block * heads * (pb.n + 1);
  final_cotangent_kernel<<<grid_for(blocks * kBackwardThreads, kBackwardThreads), kBackwardThreads, 0, lc.stream>>>(
      st, ends, g, pb, per_block);
  check_launch("power_attention_backward final cotangent");
  launch_boundary_sums(pb, st, ends, boundary, lc);
}

void launch_gate_gradients(const expanse_op& op, const double* boundary, backward_work w, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  const int64_t chunks = pb.b * pb.h * pb.n;
  if (a.dlog_g && chunks > 0 && pb.t > 0) {
    gate_gradients_kernel<<<unsigned(chunks), kGateThreads, 0, lc.stream>>>(*a.log_g, *a.dlog_g, w, boundary, pb);
    check_launch("power_attention_backward dlog_g");
  }
}

std::string power_attention_backward_simple_declines(const expanse_op& op, const device_props&) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (pb.d > kBackwardMaxDim || pb.e > kBackwardMaxDim))
    why = "d and e must be at most " + std::to_string(kBackwardMaxDim);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.initial_S) || !is_f32(a.initial_z) || !is_f32(a.dfinal_S) ||
                      !is_f32(a.dfinal_z) || !is_f32(a.dlog_g) || !is_f32(a.dinitial_S) || !is_f32(a.dinitial_z)))
    why = "log_g, states and their gradients must be f32";
  return why;
}

void power_attention_backward_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_backward_args>(op);
  const backward_plan plan = plan_backward(op);

  step_inputs shared;
  shared.phi = make_phi_tables(pb, lc);
  shared.g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  const int64_t tokens = pb.b * pb.t, states = pb.b * pb.n * pb.h * pb.D;
  const backward_work w = take_backward_work(pb, pb.normalize != 0, true, lc.ws);
  // The sweep's states from the SIMT kernel, not the list: a tensor-core update_state's b16 products
  // are magnified where the state terms cancel (dq 0.25 off on a case of the table, docs/performance.md
  // accuracy lesson 4).
  const forward_sweep fw = recompute_forward_states(op, plan, shared, lc, launch_simple_update_state);
  backward_states st{};
  take_cotangent_states(op, plan, lc.ws, st);
  double* boundary = take_boundary_sums(op, plan, lc.ws);
  st.S = fw.S, st.z = fw.z;
  if (lc.ws.sizing()) return;

  const backward_tensors in{*a.q, *a.k, *a.v, tensor_or_empty(a.o), *a.dout, {}, {}, *a.dq, *a.dk, *a.dv};
  const backward_form form{1, 0, pb.normalize ? 1 : 0};  // the causal pairs, no intra term; M from dout, o
  const phi_entry* table = shared.phi.rows;
  const gates& g = shared.g;
  const unsigned query_blocks = unsigned(tokens * pb.hq), key_blocks = unsigned(tokens * pb.h);
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (query_blocks == 0) return;
    backward_cotangents_kernel<T><<<query_blocks, kBackwardThreads, 0, lc.stream>>>(in, st, w, g, table, pb, form);
    check_launch("power_attention_backward cotangents");
    if (st.dY.data) {
      const int64_t entries = states * (pb.e + 1);
      query_cotangent_states_kernel<T><<<grid_for(entries, 256), 256, 0, lc.stream>>>(*a.q, st, w, g, table, pb);
      check_launch("power_attention_backward cotangent states");
    }
  });
  if (st.dY.data) launch_reverse_scan(op, st, expanse_tensor{}, expanse_tensor{}, fw, g, boundary, lc);
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (query_blocks == 0) return;
    query_gradients_kernel<T><<<query_blocks, kBackwardThreads, 0, lc.stream>>>(in, st, w, g, table, pb, form);
    check_launch("power_attention_backward dq");
    key_gradients_kernel<T><<<key_blocks, kBackwardThreads, 0, lc.stream>>>(in, st, w, g, table, pb, form);
    check_launch("power_attention_backward dk, dv");
  });
  launch_gate_gradients(op, boundary, w, lc);
}

}  // namespace expanse_gpu
