// query_state's SIMT implementation (gpu/kernels/query_state_simple.hpp): any shape and dtype.
#include <cmath>

#include "gpu/kernels/backward_simple.hpp"
#include "gpu/ops/implementations.hpp"
#include "gpu/ops/query_state.hpp"

namespace expanse_gpu {

float scale_power(const expanse_problem& pb) { return static_cast<float>(std::pow(pb.scale, pb.p)); }

query_inputs query_inputs_of(const expanse_query_state_args& a) {
  query_inputs in{};
  in.q = *a.q;
  if (a.S) in.S = *a.S;
  if (a.z) in.z = *a.z;
  if (a.y) {
    in.y = *a.y;
    in.rowmax = *a.rowmax;
    if (a.l) in.l = *a.l;
  }
  in.o = *a.o;
  return in;
}

std::string query_state_f32_declines(const expanse_query_state_args& a) {
  if (!is_f32(a.S) || !is_f32(a.z) || !is_f32(a.log_g) || !is_f32(a.y) || !is_f32(a.l) || !is_f32(a.rowmax))
    return "S, z, log_g, y, l and rowmax must be f32";
  return {};
}

std::string query_state_simple_declines(const expanse_op& op, const device_props&) {
  std::string why = common_declines(op);
  if (why.empty()) why = query_state_f32_declines(args_of<expanse_query_state_args>(op));
  return why;
}

void query_state_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_query_state_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  const int64_t threads = pb.b * pb.t * pb.hq * kLaneGroup;
  if (threads == 0) return;
  const query_inputs in = query_inputs_of(a);
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    simple_query_state_kernel<T><<<grid_for(threads, 256), 256, 0, lc.stream>>>(in, g, table, pb, pb.normalize ? 1 : 0,
                                                                                 scale_power(pb));
  });
  check_launch("simple query_state");
}

// query_state_backward: each query's dnum, dden (den from z and the intra term), the state
// cotangents dS, dz, dq from S, z; dy, dl by rowmax's scaling; dlog_g by the reverse sums of
// q . dq / p inside each chunk.
std::string query_state_backward_simple_declines(const expanse_op& op, const device_props&) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_query_state_backward_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (pb.d > kBackwardMaxDim || pb.e > kBackwardMaxDim))
    why = "d and e must be at most " + std::to_string(kBackwardMaxDim);
  if (why.empty() && (!is_f32(a.S) || !is_f32(a.z) || !is_f32(a.log_g) || !is_f32(a.y) || !is_f32(a.l) ||
                      !is_f32(a.rowmax) || !is_f32(a.dS) || !is_f32(a.dz) || !is_f32(a.dlog_g) || !is_f32(a.dy) ||
                      !is_f32(a.dl)))
    why = "states, log_g, the intra terms and their gradients must be f32";
  return why;
}

void query_state_backward_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_query_state_backward_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  const int64_t rows = pb.b * pb.t * pb.hq;
  backward_work w{};
  w.dnum = lc.ws.take<float>(size_t(rows * pb.e));
  w.dden = lc.ws.take<float>(size_t(rows));
  w.qdq = lc.ws.take<float>(size_t(rows));
  if (lc.ws.sizing()) return;
  const bool intra = a.y != nullptr;
  const backward_tensors in{*a.q, {}, {}, tensor_or_empty(a.o), *a.dout, tensor_or_empty(a.l),
                            tensor_or_empty(a.rowmax), *a.dq, {}, {}};
  const backward_states states{*a.S, tensor_or_empty(a.z), {}, {}};
  const backward_states cotangents{{}, {}, *a.dS, tensor_or_empty(a.dz)};
  const backward_form form{0, intra ? 1 : 0};
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0) {
      backward_cotangents_kernel<T><<<unsigned(rows), kBackwardThreads, 0, lc.stream>>>(in, states, w, g, table, pb,
                                                                                     form);
      query_gradients_kernel<T><<<unsigned(rows), kBackwardThreads, 0, lc.stream>>>(in, states, w, g, table, pb, form);
    }
    const int64_t entries = pb.b * pb.n * pb.h * pb.D * (pb.e + 1);
    if (entries > 0)
      query_cotangent_states_kernel<T><<<grid_for(entries, 256), 256, 0, lc.stream>>>(*a.q, cotangents, w, g, table,
                                                                                     pb);
  });
  if (intra && (a.dy || a.dl) && rows > 0)
    rowmax_scaling_kernel<<<grid_for(rows * (pb.e + 1), 256), 256, 0, lc.stream>>>(
        *a.rowmax, tensor_or_empty(a.dy), tensor_or_empty(a.dl), w, pb, 1);
  if (a.dlog_g && pb.b * pb.h * pb.n > 0)
    chunk_gate_gradients_kernel<<<grid_for(pb.b * pb.h * pb.n, 256), 256, 0, lc.stream>>>(
        *a.log_g, *a.dlog_g, w, pb, chunk_gate_sum::reverse_queries);
  check_launch("query_state_backward");
}

}  // namespace expanse_gpu
