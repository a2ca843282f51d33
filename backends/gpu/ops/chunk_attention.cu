// chunk_attention's SIMT implementation (gpu/kernels/chunk_attention_simple.hpp): any shape and dtype.
#include "gpu/ops/chunk_attention.hpp"
#include "gpu/kernels/backward_simple.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {

attention_inputs attention_inputs_of(const expanse_chunk_attention_args& a) {
  attention_inputs in{};
  in.q = *a.q; in.k = *a.k; in.v = *a.v; in.y = *a.y;
  if (a.l) in.l = *a.l;
  if (a.rowmax) in.rowmax = *a.rowmax;
  return in;
}

std::string chunk_attention_f32_declines(const expanse_chunk_attention_args& a) {
  if (!is_f32(a.log_g) || !is_f32(a.y) || !is_f32(a.l) || !is_f32(a.rowmax)) return "log_g, y, l and rowmax must be f32";
  return {};
}

std::string chunk_attention_simple_declines(const expanse_op& op, const device_props&) {
  std::string why = common_declines(op);
  if (why.empty()) why = chunk_attention_f32_declines(args_of<expanse_chunk_attention_args>(op));
  return why;
}

void chunk_attention_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_chunk_attention_args>(op);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  const int64_t threads = pb.b * pb.t * pb.hq * kLaneGroup;
  if (threads == 0) return;
  const attention_inputs in = attention_inputs_of(a);
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    simple_chunk_attention_kernel<T><<<grid_for(threads, 256), 256, 0, lc.stream>>>(in, g, pb);
  });
  check_launch("simple chunk_attention");
}

// chunk_attention_backward: dnum, dden from dy, dl by rowmax's scaling, then the causal pairs'
// gradients (query_gradients_kernel, key_gradients_kernel); dlog_g by the reverse sums of
// (q . dq - k . dk) / p inside each chunk.
std::string chunk_attention_backward_simple_declines(const expanse_op& op, const device_props&) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_chunk_attention_backward_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (pb.d > kBackwardMaxDim || pb.e > kBackwardMaxDim))
    why = "d and e must be at most " + std::to_string(kBackwardMaxDim);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.rowmax) || !is_f32(a.dy) || !is_f32(a.dl) || !is_f32(a.dlog_g)))
    why = "log_g, rowmax, dy, dl and dlog_g must be f32";
  return why;
}

void chunk_attention_backward_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_chunk_attention_backward_args>(op);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  const int64_t rows = pb.b * pb.t * pb.hq, keys = pb.b * pb.t * pb.h;
  backward_work w{};
  w.dnum = lc.ws.take<float>(size_t(rows * pb.e));
  w.dden = lc.ws.take<float>(size_t(rows));
  w.qdq = lc.ws.take<float>(size_t(rows));
  w.kdk = lc.ws.take<float>(size_t(keys));
  if (lc.ws.sizing() || rows == 0) return;
  rowmax_scaling_kernel<<<grid_for(rows * (pb.e + 1), 256), 256, 0, lc.stream>>>(*a.rowmax, *a.dy, tensor_or_empty(a.dl),
                                                                                 w, pb, 0);
  const backward_tensors in{*a.q, *a.k, *a.v, {}, {}, {}, {}, *a.dq, *a.dk, *a.dv};
  const backward_form form{1, 0};
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    query_gradients_kernel<T><<<unsigned(rows), kBackwardThreads, 0, lc.stream>>>(in, backward_states{}, w, g, nullptr,
                                                                                 pb, form);
    key_gradients_kernel<T><<<unsigned(keys), kBackwardThreads, 0, lc.stream>>>(in, backward_states{}, w, g, nullptr,
                                                                               pb, form);
  });
  if (a.dlog_g)
    chunk_gate_gradients_kernel<<<grid_for(pb.b * pb.h * pb.n, 256), 256, 0, lc.stream>>>(
        *a.log_g, *a.dlog_g, w, pb, chunk_gate_sum::reverse_queries_minus_keys);
  check_launch("chunk_attention_backward");
}

}  // namespace expanse_gpu
